"""The schedule runner: executes a plan's op list exactly as docs/chain-model.md defines it.

NOTE [ Ops in PyTorch ]
- `F i`: stage i under `torch.no_grad()`; its output becomes a_i.
- `R i`: stage i with autograd recording, from a detached alias of a_{i-1} whose floating tensors
  require grad (integer token inputs are left as they are: they need no gradient, which is why
  reentrant checkpointing, which reads gradients off its inputs, silently yields none for them).
  The record (the input alias and the autograd edges of the output, not the output tensor) is
  kept; a_i is a detached alias of the output, so the record adds exactly s_i bytes and `drop i`
  frees a_i even while record i is live.
- `drop i`: release a_i (the last reference, unless a record pins it, which the rules forbid).
- `loss`: seed d_L (ones, or the gradient scaler's scale).
- `B i`: autograd backward through record i with d_i; d_{i-1} is the gradient accumulated on the
  record's input alias. The record's saved tensors and d_i are freed.
- `R i` under a save policy (plan.stage_policies, docs/chain-model.md section 10.8): the stage's
  forward runs through `memplan.profiler.policies.recorded` with the policy's recompute list, so
  the record keeps what the policy keeps and `B i` recomputes the rest inside autograd's backward
  (NOTE [ Save policies in the runner ]).
- `offload i`, `fetch i`, `offload_record i`, `fetch_record i`: copies between the device and
  pinned host memory on a side stream, waited for after their window op (the next F, R, loss or
  B); executor/offload.py, NOTE [ Offload in the executor ]. A stage whose record, input or
  output moves is recorded under saved-tensor hooks, from a `_Cut` alias of a_{i-1}.
Every stage's graph is cut at its input, so any valid schedule, one-level or multi-level,
persistent or not, runs as written and its memory follows the replay's counting. The stage
values a_i may be a tensor or a (nested) tuple, list or dict of tensors; gradients flow through
their floating tensors.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from memplan.executor.guards import GUARDS, StageGuards
from memplan.executor.offload import (
    TRANSFER_OPS,
    Offloader,
    OnHost,
    Slots,
    check_device,
    has_transfers,
)
from memplan.executor.report import ExecutorError
from memplan.planner.schema import Op
from memplan.profiler.policies import compiled_policy, first_mincut, recorded
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["ScheduleRunner", "forward_counts"]


def forward_counts(ops: Sequence[Op], n_stages: int,
                   recomputed_in_backward: Collection[int] = ()) -> list[int]:
    """Per stage 1..L: how many forwards (F or R) the schedule runs, plus one for each `R i` of a
    stage in `recomputed_in_backward` (a save policy whose backward reruns the stage's forward)."""
    counts = [0] * n_stages
    for op in ops:
        if op[0] in ("F", "R"):
            counts[op[1] - 1] += 1  # type: ignore[misc]
            if op[0] == "R" and op[1] in recomputed_in_backward:
                counts[op[1] - 1] += 1  # type: ignore[misc]
    return counts


# NOTE [ Save policies in the runner ]
# 1. `R i` of a stage with a policy other than 'all' calls `recorded(stage, a_{i-1}, recompute=r)`
#    (profiler/policies.py), the function the profiler measures the policy through: the record
#    keeps the policy's saved tensors and checkpoint's bookkeeping, exactly the profiled s_i.
# 2. Its backward reruns the stage's forward (all of it under ['*']; under a selective policy the
#    kept operators come from the cache and the others run again). That rerun is one more
#    forward of the stage in the step, so the guards count it (`forward_counts`) and it runs
#    inside `guards.forward(i)`: buffers (BatchNorm statistics) are updated once per step,
#    decisions (MoE routing) are replayed, forward hooks that return nothing are not called again.
# 3. Random state: checkpoint restores the forward's generator state for the rerun and puts the
#    stream back after it (`preserve_rng_state`); the guards' own restore inside it is the same
#    state, and the state the guards would owe afterwards is the rerun's start, so the runner
#    settles what the guards owe before `B i` and discards what they owe after the rerun
#    (`flush` inside checkpoint's fork of the generator, which puts the stream back on exit).
# 4. Compiled stages (`compile=True`): stage i runs as `torch.compile` of the stage (F ops) and of
#    `recorded(stage, ., recompute=r)` (R ops), one compiled function per stage and policy, so
#    compile fuses inside the block and the plan places the blocks. A policy's recomputation is
#    then part of the compiled backward (no Python rerun: the guards count no extra forward).
#    A min-cut policy is the stage compiled under its memory budget (`compiled_policy`, NOTE
#    [ min-cut policies of compiled stages ] in profiler/policies.py); eager runs refuse it.


def _alias(value: Any, *, requires_grad: bool) -> Any:
    """Detached aliases (same storage) of the tensors in `value`; floating ones require grad."""
    flat, spec = tree_flatten(value)
    out = []
    for t in flat:
        if isinstance(t, torch.Tensor):
            t = t.detach()
            if requires_grad and (t.is_floating_point() or t.is_complex()):
                t.requires_grad_(True)
        out.append(t)
    return tree_unflatten(out, spec)


def _edges(out: Any) -> list:
    """The autograd edges of a recorded output's tensors (None where no gradient flows).

    The record keeps these, not the output tensors: the output's storage is a_i, which `drop i`
    must be able to free before `B i` (the chain model counts a_i apart from the record)."""
    flat, _ = tree_flatten(out)
    return [get_gradient_edge(t) if isinstance(t, torch.Tensor) and t.requires_grad else None
            for t in flat]


# NOTE [ d_i held by autograd only ]
# `B i` hands d_i to autograd and keeps no reference to it, so d_i is freed as soon as the stage's
# last op that reads it has run, as in a plain loss.backward() and as the profiler measures
# backward_temp_bytes (its seed gradient exists only inside autograd). Passing d_i to
# torch.autograd.backward would pin it for the whole backward (the call's arguments hold it):
# on a ResNet block, whose ReLU hands a new gradient to two convolutions, the measured peak of
# every B i was x_i above the replay. So autograd starts from a zero scalar expanded to d_i's
# shape (one scalar per dtype and device, kept across steps: no allocation during the step), and
# a pre-hook on the output's node swaps d_i in, popping it from a list that holds the only
# reference.
_ZEROS: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _zero(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero scalar of `dtype` on `device`, made once and kept (NOTE [ d_i held by autograd
    only ]); `prepare` makes the common ones before a step is measured."""
    key = (dtype, device)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros((), dtype=dtype, device=device)
    return _ZEROS[key]


def _backward_handing_over(pairs: list) -> None:
    """torch.autograd.backward from the gradient edges of `pairs` [(edge, d)], each d held by
    autograd only (NOTE [ d_i held by autograd only ]); empties `pairs`."""
    roots, stand_ins, handles = [], [], []
    while pairs:
        edge, g = pairs.pop()
        holder = [g]
        del g

        def swap(grads, k=edge.output_nr, holder=holder):
            grads = list(grads)
            grads[k] = holder.pop()
            return tuple(grads)

        handles.append(edge.node.register_prehook(swap))
        roots.append(edge)
        d = holder[0]
        stand_ins.append(_zero(d.dtype, d.device).expand(d.shape))
        del d, holder
    try:
        torch.autograd.backward(roots, stand_ins)
    finally:
        for h in handles:
            h.remove()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ScheduleRunner:
    """Runs one training step of `stages` by the op list `ops` (validated against the chain)."""

    def __init__(
        self,
        stages: Sequence[nn.Module],
        ops: Sequence[Op],
        *,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
        guards: Sequence[str] = GUARDS,
        storage: dict[int, str] | None = None,
        policies: Mapping[int, Sequence[str]] | None = None,
        compile: bool = False,
        _host_device: str | None = None,
    ) -> None:
        """`policies`: stage i -> the recompute list of the save policy its `R i` runs under
        (`SavePolicy.recompute`; unlisted or []: 'all', everything kept); NOTE [ Save policies in
        the runner ]. `compile`: run each stage through `torch.compile` (per stage).
        A schedule with transfer ops needs a CUDA device (ExecutorError otherwise, before anything
        runs); `_host_device` is for tests only (NOTE [ Offload in the executor ] point 6)."""
        self.stages = list(stages)
        self.ops = [tuple(op) for op in ops]
        self.L = len(self.stages)
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.policies = {int(i): list(r) for i, r in (policies or {}).items() if list(r)}
        for i in self.policies:
            if not 1 <= i <= self.L:
                raise ExecutorError(f"policies: no stage {i}; stages are 1..{self.L}")
        self.compile = bool(compile)
        i = None if self.compile else first_mincut(self.policies)
        if i is not None:
            raise ExecutorError(f"policies: stage {i} is recorded under {self.policies[i][0]!r}, "
                                "torch's min-cut, which runs only on compiled stages; run with "
                                "compile=True or plan without it")
        self._compiled: dict[tuple[int, str], Callable[..., Any]] = {}
        self.counts = forward_counts(self.ops, self.L)
        # the guards also count the reruns inside B i (NOTE [ Save policies in the runner ])
        rerun = () if self.compile else self.policies.keys()
        self.guards = StageGuards(self.stages, forward_counts(self.ops, self.L, rerun),
                                  device=device, enabled=guards)
        self.op_seconds: list[float] = []
        self._loss_buf: torch.Tensor | None = None
        # stage -> storage dtype of its kept output (plan.checkpoint_dtypes; features/storage.py)
        self.storage = {int(i): d for i, d in (storage or {}).items()}
        self._fresh: set[int] = set()
        self.offload: Offloader | None = None
        if has_transfers(self.ops):
            check_device(self.ops, device, _host_device)
            self.offload = self._offloader(_host_device)

    def _offloader(self, host_device: str | None) -> Offloader:
        """The transfer ops' machinery, after the checks of what offload does not run with."""
        if self.storage:
            raise ExecutorError("checkpoint_dtypes: offload ops and checkpoint_dtypes are not run "
                                "together; plan with one of them")
        if self.compile:
            raise ExecutorError("compile: a plan with offload ops runs uncompiled (saved-tensor "
                                "hooks move its records); run it with compile=False")
        off = Offloader(self.ops, self.stages, device=self.device, host_device=host_device)
        both = sorted(set(self.policies) & off.hooked)
        if both:
            raise ExecutorError(f"policies: stage {both[0]} runs under a save policy and its record, "
                                "input or output moves to the host; offload ops and save policies "
                                "are not run on one stage")
        return off

    def _fn(self, i: int, kind: str) -> Callable[..., Any]:
        """What `F i` (kind 'F') or `R i` (kind 'R') calls on its input (NOTE [ Save policies in the
        runner ])."""
        stage = self.stages[i - 1]
        recompute = self.policies.get(i) if kind == "R" else None
        if self.compile:
            key = (i, kind if recompute else "F")
            fn = self._compiled.get(key)
            if fn is None:
                fn = compiled_policy(stage, recompute)
                self._compiled[key] = fn
            return fn
        if not recompute:
            return stage
        calls = [0]

        def guarded(x: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:  # the forward of R i itself, inside its op's guards
                return stage(x)
            with self.guards.forward(i):  # the rerun inside B i (NOTE point 2)
                out = stage(x)
            self.guards.flush()  # inside checkpoint's fork of the generator (NOTE point 3)
            return out

        return partial(recorded, guarded, recompute=recompute)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def prepare(self) -> None:
        """Call before each step, outside any memory measurement."""
        self.guards.prepare()
        if self._loss_buf is None:
            self._loss_buf = torch.empty((), dtype=torch.float32, device=self.device)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):  # B's stand-in gradients
            _zero(dtype, self.device)

    def step(self, example_input: Any, *, loss_scale: float | None = None,
             time_ops: bool = False, op_context: Callable[[int, Op], Any] | None = None
             ) -> torch.Tensor:
        """Run the schedule once; parameter gradients accumulate into `.grad`.

        Returns the (detached) loss a_L. With `time_ops`, `op_seconds` holds each op's seconds;
        `op_context(k, op)`, a context manager factory, wraps each op (e.g. to measure it)."""
        L = self.L
        act: list[Any] = [None] * (L + 1)
        act[0] = example_input
        rec: dict[int, tuple[Any, Any]] = {}
        grad: list[Any] = [None] * (L + 1)  # d_i: flat list aligned with a_i's leaves
        loss: torch.Tensor | None = None
        self.op_seconds = []
        self._fresh = set()
        if self.offload is not None:
            self.offload.begin_step()
        for k, op in enumerate(self.ops):
            with op_context(k, op) if op_context else contextlib.nullcontext():
                loss = self._op(k, op, act, rec, grad, loss, loss_scale, time_ops)
        self.guards.flush()
        if self.offload is not None and self.offload.pending():
            raise ExecutorError("schedule: it ends with a transfer op; a transfer needs a compute op "
                                "after it (its window)")
        if loss is None:
            raise ExecutorError("schedule: it has no ['loss'] op")
        return loss.detach().clone()

    def _store_after(self, k: int, name: str, i: int, act: list, new_output: bool) -> None:
        """NOTE [ Storage precision of checkpoints ] (planner/checkpoint_dtype.py): a new F output
        of a stored stage waits for its first reader; after that reader, unless the next op drops
        it (or, the reader being R, its record pins it), it is stored converted."""
        from memplan.executor.features.storage import store

        j = i - 1
        if j in self._fresh:
            self._fresh.discard(j)
            nxt = tuple(self.ops[k + 1]) if k + 1 < len(self.ops) else None
            if name == "F" and nxt != ("drop", j):
                act[j] = store(act[j], self.storage[j], stage=j)
        if new_output and i in self.storage and i < self.L:
            if name == "F":
                self._fresh.add(i)
            else:
                self._fresh.discard(i)

    def _op(self, k: int, op: Op, act: list, rec: dict, grad: list, loss: Any,
            loss_scale: float | None, time_ops: bool) -> Any:
        """Run op k of the schedule: a transfer op is issued, a compute op runs (`_compute`),
        with its window's transfers around it when the plan moves tensors; returns the loss
        buffer once seeded (None before). With `time_ops`, appends its seconds to `op_seconds`."""
        t0 = time.perf_counter() if time_ops else 0.0
        name = op[0]
        off = self.offload
        if name in TRANSFER_OPS:
            if off is None:  # not reached: a runner built on these ops has one
                raise ExecutorError(f"schedule[{k}] {list(op)}: no offload machinery")
            off.issue(k, op)
        else:
            window = off is not None and name != "drop"
            if window:  # the window op: its transfers start with it (NOTE [ Offload in the executor ])
                off.start_window()
                self._check_reads(k, op, act)
            loss = self._compute(k, op, act, rec, grad, loss, loss_scale)
            if window:  # ... and are waited for after it
                for kind, j in off.end_window():
                    if kind == "offload":
                        act[j] = OnHost(j)
                    elif kind == "fetch":
                        act[j] = off.value(j)
        if time_ops:
            _sync(self.device)
            self.op_seconds.append(time.perf_counter() - t0)
        return loss

    def _check_reads(self, k: int, op: Op, act: list) -> None:
        """Refuse a compute op that reads a tensor on the host (NOTE [ Offload in the executor ]
        point 4); a tensor whose fetch is pending in this window is waited for."""
        off = self.offload
        assert off is not None
        name = op[0]
        reads = [op[1] - 1] if name in ("F", "R", "B") else [self.L] if name == "loss" else []
        for j in reads:
            if isinstance(act[j], OnHost):
                if off.fetch_pending(j):
                    act[j] = off.value(j)
                    continue
                raise ExecutorError(f"schedule[{k}] {list(op)}: a_{j} is on the host; fetch it "
                                    f"(fetch {j}) with the op before")
        if name == "B" and off.record_on_host(op[1]):
            raise ExecutorError(f"schedule[{k}] {list(op)}: the record of stage {op[1]} is on the "
                                f"host; fetch it (fetch_record {op[1]}) with the op before")

    def _compute(self, k: int, op: Op, act: list, rec: dict, grad: list, loss: Any,
                 loss_scale: float | None) -> Any:
        """Run the compute op (F, R, drop, loss or B) `op`; returns the loss buffer once seeded."""
        L = self.L
        name = op[0]
        off = self.offload
        if name in ("F", "R"):
            i = op[1]
            if act[i - 1] is None:
                raise ExecutorError(f"schedule[{k}] {list(op)}: its input a_{i - 1} is not live")
            if isinstance(act[i], OnHost):  # recomputed instead of fetched: the host copy goes
                assert off is not None
                off.dropped(i, k, op)
                act[i] = None
            if act[i] is not None and (i + 1) not in rec:
                # a live, unpinned a_i is replaced by the (equal) recomputed output: free it
                # first so that the op costs no x_i, as the chain model's "x_i (if new)" says
                act[i] = None
            new_output = act[i] is None
            tmp_input = None
            if self.storage:
                from memplan.executor.features.storage import Stored, load

                if isinstance(act[i - 1], Stored):
                    if name == "R":  # restored to its compute dtype; the record keeps it
                        act[i - 1] = load(act[i - 1])
                    else:
                        tmp_input = load(act[i - 1])  # a temporary for this forward
            with self.guards.forward(i), self._autocast():
                if name == "F":
                    with torch.no_grad():
                        out = self._fn(i, "F")(act[i - 1] if tmp_input is None else tmp_input)
                    act[i] = out
                    del tmp_input
                elif off is not None and i in off.hooked:  # NOTE [ Offload in the executor ]
                    with off.recording(i, act[i - 1]):
                        inp, slots = off.cut(act[i - 1])
                        with torch.enable_grad():
                            out = self._fn(i, "R")(inp)
                        del inp
                    rec[i] = (slots, _edges(out))
                    if act[i] is None:
                        act[i] = _alias(out, requires_grad=False)
                        off.produced(i, act[i])
                    off.recorded(i)
                else:
                    inp = _alias(act[i - 1], requires_grad=True)
                    with torch.enable_grad():
                        out = self._fn(i, "R")(inp)
                    rec[i] = (inp, _edges(out))
                    if act[i] is None:
                        act[i] = _alias(out, requires_grad=False)
                    # else: a_i is live and pinned by record i+1: keep it, and free the equal
                    # new output; it was live during the op, which the replay does not count
                    # (NOTE [ R on a live output ] in docs/executor.md)
            del out
            if off is not None and name == "F":
                off.produced(i, act[i])
            if self.storage:
                self._store_after(k, name, i, act, new_output)
        elif name == "drop":
            if off is not None:
                off.dropped(op[1], k, op)
            act[op[1]] = None
        elif name == "loss":
            a_L = act[L]
            if not isinstance(a_L, torch.Tensor) or a_L.numel() != 1 or not a_L.is_floating_point():
                raise ExecutorError(
                    "stages: the last stage must return the scalar loss (a floating tensor with "
                    f"one element), got {type(a_L).__name__}"
                    + (f" of shape {tuple(a_L.shape)}" if isinstance(a_L, torch.Tensor) else "")
                )
            # the loss value goes to a buffer kept across steps (allocated in `prepare`), so that `drop L` frees a_L as the chain model says
            if self._loss_buf is None or self._loss_buf.dtype != a_L.dtype:
                self._loss_buf = torch.empty((), dtype=a_L.dtype, device=a_L.device)
            self._loss_buf.copy_(a_L.detach().reshape(()))
            loss = self._loss_buf
            seed = torch.ones_like(a_L) if loss_scale is None else torch.full_like(a_L, loss_scale)
            grad[L] = [seed]
        else:  # "B"
            i = op[1]
            inp, edges = rec.pop(i)
            pairs = [(e, g) for e, g in zip(edges, grad[i], strict=True)
                     if e is not None and g is not None]
            grad[i] = None
            if pairs:
                if i in self.policies and not self.compile:
                    self.guards.flush()  # NOTE [ Save policies in the runner ] point 3
                _backward_handing_over(pairs)
            del pairs, edges
            if isinstance(inp, Slots):
                grad[i - 1] = inp.gradients()
                assert off is not None
                off.released(i)
            else:
                flat_in, _ = tree_flatten(inp)
                grad[i - 1] = [t.grad if isinstance(t, torch.Tensor) else None for t in flat_in]
                del flat_in
            del inp
        return loss
