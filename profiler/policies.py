"""Save policies: which of a stage's operators autograd keeps, and which its backward recomputes.

A policy is data (`memplan.profiler.schema.SavePolicy.recompute`): a list of aten overload packets
recomputed in the backward, `[]` (keep everything: the stage's own record, 'all') or `["*"]`
(keep nothing but the input: the whole stage is recomputed, as `torch.utils.checkpoint` does).
`recorded` runs a stage's forward under one; the profiler measures each policy through it and the
executor runs plans through it, so what is measured is what runs (docs/chain-model.md section 10.8).
`trace_ops` and `candidate_policies` build a stage's candidates from the operators it runs, and
`select_policies` keeps the measured ones worth offering (NOTE [ candidate save policies ]).

NOTE [ selective recompute through checkpoint contexts ]
1. A policy other than 'all' runs the stage under non-reentrant `torch.utils.checkpoint` with
   `create_selective_checkpoint_contexts`: an op whose packet is listed is PREFER_RECOMPUTE, every
   other op MUST_SAVE, so the backward replays the forward and takes the saved outputs from the
   cache instead of recomputing them.
2. `["*"]` is plain non-reentrant checkpoint: only the inputs are kept.
3. Recomputation replays the same ops on the same inputs, so gradients are bitwise those of the
   unplanned step on the CPU (fp32); the random state is restored for the replay (checkpoint's
   `preserve_rng_state`), so dropout draws the same mask, provided the replay draws in the
   forward's order: a list that recomputes some random packets and caches others would shift
   the draws (the built-in candidates never do: NOTE [ candidate save policies ] rule 5).

NOTE [ min-cut policies of compiled stages ]
1. `["mincut:B"]` (0 <= B <= 1) is a policy that only compiled stages run: the stage compiled by
   inductor with torch's min-cut partitioner choosing what to save under
   `torch._functorch.config.activation_memory_budget = B` (1 saves what plain compile saves, 0
   the least it can; `torch.compile` with a memory budget does the same for a whole model). The
   partitioner decides per operator and fuses the recomputation into the compiled backward, so
   such a policy often frees bytes more cheaply than a selective list run through a checkpoint.
2. `compiled_policy` builds it as `torch.compile` with its own backend, inductor under that
   budget: dynamo keys its cache by code object and backend, so the same forward compiled
   plainly and under two budgets is three graphs, each partitioned under its own budget (with
   one backend and the budget patched around the calls, all three reuse the first graph).
3. Eager stages cannot run it: `recorded` refuses it, and so do the runner and installed plans
   without `compile=True`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from memplan.profiler.schema import MINCUT, mincut_budget  # the token is schema data
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

__all__ = ["recorded", "op_name", "RECOMPUTE_ALL", "BUILTIN_POLICIES", "COMPILED_POLICIES",
           "MATMUL_OPS", "ATTENTION_OPS", "OpRecord", "trace_ops", "candidate_policies",
           "select_policies", "policy_names", "mincut_budget", "first_mincut",
           "compiled_policy"]

RECOMPUTE_ALL = "*"


def first_mincut(policies: dict[int, Sequence[str]]) -> int | None:
    """The first stage (by number) of `policies` (stage -> recompute list) recorded under a
    min-cut policy, which eager runs refuse (NOTE [ min-cut policies of compiled stages ] rule
    3); None when there is none."""
    return next((i for i, rec in sorted(policies.items()) if mincut_budget(rec) is not None), None)


def _mincut_backend(gm: Any, example_inputs: Any, *, budget: float) -> Any:
    """inductor with the min-cut partitioner under `budget` (NOTE rule 2)."""
    from torch._inductor.compile_fx import compile_fx

    with torch._functorch.config.patch(activation_memory_budget=budget):
        return compile_fx(gm, example_inputs)


def compiled_policy(fn: Callable[..., Any], recompute: Sequence[str] | None) -> Callable[..., Any]:
    """`torch.compile` of `fn` run under the save policy `recompute`: None or `[]` plain, a
    min-cut policy with inductor under its budget (NOTE [ min-cut policies of compiled stages ]),
    any other list as `recorded(fn, ., recompute=r)` compiled (its checkpoint traced by compile).
    Returns the compiled callable (same arguments as `fn`)."""
    budget = mincut_budget(recompute)
    if budget is not None:
        return torch.compile(fn, backend=partial(_mincut_backend, budget=budget))
    if not recompute:
        return torch.compile(fn)
    return torch.compile(partial(recorded, fn, recompute=list(recompute)))


def op_name(func: Any) -> str:
    """'aten.gelu' for an aten overload such as `torch.ops.aten.gelu.default`."""
    packet = getattr(func, "overloadpacket", func)
    return f"{getattr(packet, '_qualified_op_name', str(packet)).replace('::', '.')}"


def _policy_fn(recompute: frozenset[str], ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return (CheckpointPolicy.PREFER_RECOMPUTE if op_name(func) in recompute
            else CheckpointPolicy.MUST_SAVE)


def _context_fn(recompute: frozenset[str]):
    return create_selective_checkpoint_contexts(partial(_policy_fn, recompute))


def recorded(fn: Callable[..., Any], *args: Any, recompute: Sequence[str] = ()) -> Any:
    """`fn(*args)` recorded for autograd under the save policy `recompute` (NOTE [ selective
    recompute through checkpoint contexts ]): `()` keeps everything (a plain call), `["*"]`
    keeps only the inputs, otherwise the listed aten packets are recomputed in the backward.
    Returns fn's output."""
    if not recompute:
        return fn(*args)
    if mincut_budget(recompute) is not None:
        raise ValueError(f"recompute: {recompute[0]!r} is torch's min-cut under a memory budget and "
                         "runs only on compiled stages; run with compile=True or choose another "
                         "policy")
    if list(recompute) == [RECOMPUTE_ALL]:
        return checkpoint(fn, *args, use_reentrant=False)
    if RECOMPUTE_ALL in recompute:
        raise ValueError("recompute: '*' recomputes every operator; list it alone")
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False,
                      context_fn=partial(_context_fn, frozenset(recompute)))


# ---------------------------------------------------------------------------------------------
# candidate policies of a stage, from the operators its forward runs

# NOTE [ candidate save policies ]
# The candidates are built from a traced recorded forward of the stage (`trace_ops`: every aten op
# the forward dispatches after autograd, as the selective checkpoint's policy function sees it),
# op by op grouped into overload packets, the unit a policy names:
# 1. `matmuls` keeps the outputs of matmul-like packets (MATMUL_OPS) and recomputes every other
#    packet the stage ran (torchtitan's op-level selective checkpointing).
# 2. `no_attention` recomputes the attention core only (Korthikanti et al. 2022, "Reducing
#    activation recomputation in large transformer models", section 4.2): each span of the
#    forward from a batched matmul (QK^T) to the next one (AV) with a softmax between them, and
#    every fused attention kernel (ATTENTION_OPS). Offered only where the stage has such ops. A
#    packet is all or nothing: one that also runs outside the core (an elementwise mul, an add)
#    is recomputed there too.
# 3. `none` is ["*"]: the whole stage recomputed from its input.
# 4. `knap1`..`knap3`: the packets sorted by bytes freed per second of recompute (their new
#    output bytes over their forward seconds, timed in the trace), recomputed in that order up
#    to about 1/4, 1/2 and 3/4 of the recomputable bytes.
# 5. Some packets are recomputed in every candidate, because caching them is wrong or useless
#    (`OpRecord.forced`): views (their outputs alias an input: nothing to free), in-place ops and the
#    producers of tensors an in-place op later writes (a cached tensor that is mutated after
#    caching cannot be handed back), and random ops where the stage has more than one random
#    packet (all of them recomputed, so that the replay, from checkpoint's saved RNG state, draws
#    the same numbers in the same order; a single random packet, such as a fused attention kernel
#    that may draw its dropout, is all cached or all replayed, which keeps the order either way),
#    and the producers of the stage's output: a cached output is the storage of a_i, so the
#    record would pin it and `drop i` would free nothing until `B i` (measured: one activation
#    above the replay through every `B i` of a GPT-2 block whose residual add was cached, where
#    the backward's recompute stopped before reaching it). Recomputing it costs nothing: the
#    backward needs no tensor after the output, so the rerun stops before it.
# 6. A selective checkpoint caches the output of every op it does not recompute, whether or not
#    the backward needs it; so a candidate can keep more than 'all'. Candidates are measured
#    (memplan.profiler.measure) and filtered by `select_policies`.
# 7. `mincut50`, `mincut20`, `mincut10`, `mincut5`, `mincut0` (compiled stages only,
#    COMPILED_POLICIES): inductor's min-cut under activation memory budgets 0.5, 0.2, 0.1, 0.05
#    and 0 (NOTE [ min-cut policies of compiled stages ]); they need no trace, the partitioner
#    picks the operators. The budgets are denser near 0 because that is where a block's record
#    is small and its recompute cheap (a GPT-2 block of width 256, 4 x 256 tokens, compiled, CPU:
#    25.8 MB saved at 96 ms forward and backward plainly, 4.2 MB at 95 ms under 0.2, 2.1 MB at
#    96-97 ms under 0.1, 1.0 MB at 97-98 ms under 0.05, none at 100-104 ms under 0): the points
#    a plan near its least peak chooses among.

MATMUL_OPS = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear",
    "aten._scaled_mm", "aten.convolution", "aten._convolution", "aten.mkldnn_convolution",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._flash_attention_forward", "aten._efficient_attention_forward",
})
ATTENTION_OPS = frozenset({
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_attention_math", "aten._flash_attention_forward",
    "aten._efficient_attention_forward",
})
_BATCHED = frozenset({"aten.bmm", "aten.baddbmm"})
_SOFTMAX = frozenset({"aten._softmax", "aten._safe_softmax", "aten.softmax"})
KNAPSACK_POINTS = {"knap1": 0.25, "knap2": 0.5, "knap3": 0.75}
BUILTIN_POLICIES = ("matmuls", "no_attention", "none", *KNAPSACK_POINTS)
# NOTE [ min-cut policies of compiled stages ]: offered only where the stages are compiled
MINCUT_POINTS = {"mincut50": 0.5, "mincut20": 0.2, "mincut10": 0.1, "mincut5": 0.05, "mincut0": 0.0}
COMPILED_POLICIES = tuple(MINCUT_POINTS)


@dataclass
class OpRecord:
    """One aten op of a traced forward."""

    name: str  # its overload packet, e.g. 'aten.addmm'
    new_bytes: int  # bytes of its outputs' storages that none of its inputs shares
    seconds: float  # wall seconds of the op in the trace (synchronised on a GPU)
    forced: bool  # recomputed in every candidate (NOTE [ candidate save policies ] rule 5)
    seeded: bool = False  # it draws random numbers (torch.Tag.nondeterministic_seeded)


class _Trace(TorchDispatchMode):
    def __init__(self, sync: Callable[[], None]) -> None:
        super().__init__()
        self.ops: list[OpRecord] = []
        self.sync = sync
        self.producer: dict[int, int] = {}  # output storage -> index of the op that made it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        in_storages = {_storage_key(t) for t in flat_in}
        written = [a for a, arg in zip(args, schema.arguments, strict=False)
                   if isinstance(a, torch.Tensor) and arg.alias_info is not None
                   and arg.alias_info.is_write]
        written += [kwargs[arg.name] for arg in schema.arguments
                    if arg.name in kwargs and isinstance(kwargs[arg.name], torch.Tensor)
                    and arg.alias_info is not None and arg.alias_info.is_write]
        self.sync()
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        self.sync()
        seconds = time.perf_counter() - t0
        new_bytes = 0
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                key = _storage_key(t)
                if key not in in_storages and t.untyped_storage().nbytes():
                    new_bytes += t.untyped_storage().nbytes()
                    in_storages.add(key)
                    self.producer[key] = len(self.ops)
        aliasing = any(r.alias_info is not None for r in schema.returns)
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        for t in written:  # the op that made a tensor written in place is recomputed too
            k = self.producer.get(_storage_key(t))
            if k is not None:
                self.ops[k].forced = True
        self.ops.append(OpRecord(op_name(func), new_bytes, seconds,
                                 forced=bool(written) or aliasing, seeded=seeded))
        return out


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def trace_ops(fn: Callable[..., Any], *args: Any) -> list[OpRecord]:
    """The aten ops of one recorded forward `fn(*args)` in order (autograd on), each with the new
    bytes of its outputs and its seconds; the output is discarded. Run it twice and use the
    second trace where times matter (the first pays one-off initialisations)."""
    dev = next((t.device for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)), None)

    def sync() -> None:
        if dev is not None and dev.type == "cuda":
            torch.cuda.synchronize(dev)

    with torch.enable_grad(), _Trace(sync) as tr:
        out = fn(*args)
    for t in tree_flatten(out)[0]:  # rule 5: the output's producers
        if isinstance(t, torch.Tensor):
            k = tr.producer.get(_storage_key(t))
            if k is not None:
                tr.ops[k].forced = True
    del out
    return tr.ops


def _attention_core(ops: list[OpRecord]) -> set[str]:
    """Packets of the attention core (NOTE [ candidate save policies ] rule 2); empty if none."""
    core = {op.name for op in ops if op.name in ATTENTION_OPS}
    batched = [k for k, op in enumerate(ops) if op.name in _BATCHED]
    for a, b in zip(batched, batched[1:], strict=False):
        if any(ops[k].name in _SOFTMAX for k in range(a + 1, b)):
            core.update(ops[k].name for k in range(a, b + 1))
    return core


def candidate_policies(ops: list[OpRecord], names: Sequence[str] = BUILTIN_POLICIES
                       ) -> list[tuple[str, list[str]]]:
    """(name, recompute list) of each candidate in `names` that the traced stage `ops` offers
    (NOTE [ candidate save policies ]), in the order of `names`; no candidate when the stage ran
    no op. Duplicate recompute lists are kept once (the first name). Raises ValueError for an
    unknown name."""
    for name in names:
        if name not in BUILTIN_POLICIES and name not in MINCUT_POINTS:
            raise ValueError(f"policies: {name!r} is not a built-in policy; choose from "
                             f"{', '.join(BUILTIN_POLICIES + COMPILED_POLICIES)}")
    if not ops:
        return []
    seen = list(dict.fromkeys(op.name for op in ops))
    forced = {op.name for op in ops if op.forced}
    seeded = {op.name for op in ops if op.seeded}
    if len(seeded) > 1:  # rule 5: random packets all recomputed, so their draws keep their order
        forced |= seeded
    per_bytes: dict[str, int] = {}
    per_s: dict[str, float] = {}
    for op in ops:
        per_bytes[op.name] = per_bytes.get(op.name, 0) + op.new_bytes
        per_s[op.name] = per_s.get(op.name, 0.0) + op.seconds
    out: list[tuple[str, list[str]]] = []

    def add(name: str, recompute: set[str]) -> None:
        listed = [p for p in seen if p in recompute]
        if listed and all(listed != r for _, r in out):
            out.append((name, listed))

    free = [p for p in seen if p not in forced and per_bytes[p] > 0]
    total = sum(per_bytes[p] for p in free)
    order = sorted(free, key=lambda p: (-per_bytes[p] / max(per_s[p], 1e-9), seen.index(p)))
    for name in names:
        if name == "none":
            out.append((name, [RECOMPUTE_ALL]))
        elif name in MINCUT_POINTS:
            out.append((name, [f"{MINCUT}{MINCUT_POINTS[name]}"]))
        elif name == "matmuls":
            add(name, {p for p in seen if p not in MATMUL_OPS} | forced)
        elif name == "no_attention":
            core = _attention_core(ops)
            if core:
                add(name, core | forced)
        else:
            goal, chosen, acc = KNAPSACK_POINTS[name] * total, set(), 0
            for p in order:
                if acc >= goal:
                    break
                chosen.add(p)
                acc += per_bytes[p]
            if chosen:
                add(name, chosen | forced)
    return out


def select_policies(base: tuple[int, int, float], measured: Sequence[Any]) -> list[Any]:
    """The measured candidates (`SavePolicy`s) worth offering: each keeps fewer bytes than 'all'
    (`base` = its saved_bytes, backward_temp_bytes, backward_s), none is matched or beaten by
    another on all of saved bytes, backward transient and backward seconds (an exact duplicate
    is kept once, the first), in their given order, at most 8.

    A policy's backward runs the stage's backward plus the recomputation of what it did not keep,
    so it is never faster than the base's: a measured time below `base`'s (timing noise on a
    loaded machine) is raised to it, so that the planner does not take a policy for free."""
    measured = [p if p.backward_s >= base[2] else p.model_copy(update={"backward_s": base[2]})
                for p in measured]
    keys = [(p.saved_bytes, p.backward_temp_bytes, p.backward_s) for p in measured]
    kept = []
    for k, p in enumerate(measured):
        if keys[k][0] >= base[0]:
            continue
        beaten = any(j != k and all(a <= b for a, b in zip(keys[j], keys[k], strict=True))
                     and (keys[j] != keys[k] or j < k) for j in range(len(measured)))
        if not beaten:
            kept.append(p)
    return kept[:8]


def policy_names(policies: bool | Sequence[str] | None, *, error: type[Exception] = ValueError,
                 compiled: bool = False) -> list[str]:
    """The built-in candidate names a `policies=` option asks for: False or None none, True all
    of BUILTIN_POLICIES (and COMPILED_POLICIES when the stages are `compiled`), or a list of them
    (duplicates dropped, order kept). Raises `error` naming `policies` otherwise, and for a
    compiled-only policy asked of eager stages."""
    if policies is False or policies is None:
        return []
    if policies is True:
        return list(BUILTIN_POLICIES + (COMPILED_POLICIES if compiled else ()))
    known = BUILTIN_POLICIES + COMPILED_POLICIES
    if isinstance(policies, str) or not all(isinstance(p, str) for p in policies):
        raise error(f"policies: give True, False or a list of policy names "
                    f"({', '.join(known)}), not {policies!r}")
    for name in policies:
        if name not in known:
            raise error(f"policies: {name!r} is not a built-in policy; choose from "
                        f"{', '.join(known)}")
        if name in MINCUT_POINTS and not compiled:
            raise error(f"policies: {name!r} is torch's min-cut and runs only on compiled blocks; "
                        "pass compile=True or leave it out")
    return list(dict.fromkeys(policies))
