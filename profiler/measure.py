"""`profile_chain`: measure every quantity of the chain model on a real model cut into stages.

NOTE [ How each number is measured ]
Each stage i is measured alone, on its real input a_{i-1} (the chain run once without autograd),
with every parameter's gradient already allocated (as in a training step after the first):

- `saved_bytes`: `saved_tensors_hooks` see every tensor autograd keeps for the backward; their
  storages are deduplicated and those of parameters, of the stage's input and of its output are
  left out (chain-model.md).
- `output_bytes`: the unique storages of the output.
- `forward_temp_bytes`: the peak allocated during the recorded forward minus what the forward
  leaves allocated; `forward_nograd_temp_bytes`: the same for the forward under
  torch.no_grad(), which keeps only its output (NOTE [ no-grad forward bytes ] in
  planner/simulate.py);
  `backward_temp_bytes`: the peak during its backward, above the level at its
  start, minus the new input gradient. On a GPU from the caching allocator's counters, on the CPU
  from the PyTorch profiler's allocation events (`memplan.profiler.memory`), both exact.
- `forward_s`, `backward_s`, `forward_nograd_s` (the same forward under torch.no_grad(), which an
  `F` op runs): medians over `repeats` after `warmup` runs, timed apart from the
  memory passes (the profiler's bookkeeping would slow them): CUDA events on a GPU, a monotonic
  clock after synchronisation on the CPU. By default (`timing="chain"`) each stage is timed inside
  passes over the whole chain, as a training step runs it (NOTE [ timing in context ]);
  `timing="stage"` times each stage alone, repeated on its own input.
- `flops`: `torch.utils.flop_counter.FlopCounterMode` over one forward.
- `fixed_bytes`: parameters, their gradients, the optimizer's state (AdamW: two moments shaped like
  each parameter, plus its step counter, a 4-byte CPU tensor per parameter unless on a GPU), the
  stages' buffers, and the pending gradient of parameters shared between stages (see
  NOTE [ Parameters shared between stages ] in `memplan.profiler.fixed.fixed_bytes`).

Module state that a forward changes (BatchNorm statistics, expert and exit counters, any buffer)
and the random number generators are restored afterwards, so profiling leaves the model as it was.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
from memplan.profiler.fixed import fixed_bytes, param_dtype, restore_state, snapshot_state
from memplan.profiler.memory import measure_memory
from memplan.profiler.policies import (
    candidate_policies,
    policy_names,
    recorded,
    select_policies,
    trace_ops,
)
from memplan.profiler.schema import LayerProfile, Profile, ProfileError, SavePolicy, check_optimizer
from memplan.profiler.tensors import Seed, stage_input, storage_bytes, storage_sizes, unique_params
from memplan.profiler.timing import forward_flops, time_chain, time_stage

__all__ = ["profile_chain", "stage_names"]

log = logging.getLogger(__name__)

_TIMINGS = ("chain", "stage")


def profile_chain(
    stages: Sequence[nn.Module],
    example_input: torch.Tensor,
    *,
    device: str | torch.device | None = None,
    repeats: int = 5,
    warmup: int = 2,
    name: str = "model",
    optimizer: str = "adamw",
    autocast_dtype: torch.dtype | str | None = None,
    names: Sequence[str] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    meta: dict[str, Any] | None = None,
    timing: str = "chain",
    policies: bool | Sequence[str] = False,
) -> Profile:
    """Measure the chain `stages` (modules run in order, the last returning the scalar loss) on
    `example_input`.

    Returns a `Profile`: per stage seconds (`forward_s`, `backward_s`), bytes (`output_bytes`,
    `saved_bytes`, `forward_temp_bytes`, `backward_temp_bytes`, `param_bytes`) and forward FLOPs;
    per profile `input_bytes` and `fixed_bytes` (parameters, gradients, `optimizer` state, buffers).
    `device` moves stages and input there first (default: where the first stage's parameters are).
    `autocast_dtype` runs every forward under `torch.autocast` in that dtype. `timing` is "chain"
    (stages timed inside passes over the whole chain, NOTE [ timing in context ]; where the pass
    does not fit on the device, each stage alone, logged and recorded in `meta["timing"]`) or
    "stage" (each stage alone). `policies` measures save policies per stage into
    `LayerProfile.policies` (NOTE [ measuring save policies ]): False (none, the default), True
    (the built-in candidates, `memplan.profiler.policies.BUILTIN_POLICIES`) or a list of their
    names. `progress(done, total, what)` is called after each stage. Raises `ProfileError`
    naming the stage on bad input.
    """
    stages = list(stages)
    _check_options(stages, repeats, warmup, optimizer)
    policy_names = _policy_names(policies)
    if timing not in _TIMINGS:
        raise ProfileError(f"timing: choose one of {', '.join(_TIMINGS)}, not {timing!r}")
    dev = _resolve_device(stages, example_input, device)
    if device is not None:
        for stage in stages:
            stage.to(dev)
        example_input = example_input.to(dev)
    stage_labels = list(names) if names is not None else stage_names(stages)
    if len(stage_labels) != len(stages):
        raise ProfileError(f"names: {len(stage_labels)} names for {len(stages)} stages; give one per stage")
    _check_devices(stages, stage_labels, example_input, dev)
    ac_dtype = _autocast_dtype(autocast_dtype)

    def ctx():
        if ac_dtype is None:
            return _nullcontext()
        return torch.autocast(device_type=dev.type, dtype=ac_dtype)

    snapshot = snapshot_state(stages)
    try:
        for stage in stages:
            stage.train()
        params = unique_params(stages)
        for p in params:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        inputs = _chain_inputs(stages, stage_labels, example_input, ctx)
        # parameters and buffers are fixed memory: never counted as a stage's saved bytes
        fixed_tensors = [*params, *(b for stage in stages for b in stage.buffers())]
        layers: list[LayerProfile] = []
        extras: list[dict[str, Any]] = []
        owned: set[int] = set()
        chain_times, timing_used = None, "stage"
        if timing == "chain":
            chain_times, timing_used = time_chain(stages, example_input, dev, ctx, repeats, warmup)
        for i, stage in enumerate(stages):
            label = stage_labels[i]
            mem = _measure_stage_memory(stage, inputs[i], i == 0, dev, ctx, fixed_tensors)
            if chain_times is not None:
                f_s, b_s, n_s = chain_times[i]
            else:
                f_s, b_s, n_s = time_stage(stage, inputs[i], i == 0, dev, ctx, repeats, warmup)
            flops = forward_flops(stage, inputs[i], ctx)
            pbytes = 0
            for p in stage.parameters():
                if id(p) not in owned:
                    owned.add(id(p))
                    pbytes += p.numel() * p.element_size()
            layers.append(
                LayerProfile(
                    name=label,
                    kind=getattr(stage, "memplan_kind", type(stage).__name__.lower()),
                    forward_s=f_s,
                    backward_s=b_s,
                    forward_nograd_s=n_s,
                    output_bytes=mem["output_bytes"],
                    saved_bytes=mem["saved_bytes"],
                    forward_temp_bytes=mem["forward_temp_bytes"],
                    forward_nograd_temp_bytes=mem["forward_nograd_temp_bytes"],
                    backward_temp_bytes=mem["backward_temp_bytes"],
                    param_bytes=pbytes,
                    flops=flops,
                    output_dtype=_value_dtype(inputs[i + 1]) if i + 1 < len(stages) else None,
                )
            )
            extras.append({"name": label, **mem["extra"]})
            if progress is not None:
                progress(i + 1, len(stages), label)
        if policy_names:
            _add_policies(stages, stage_labels, inputs, layers, extras, policy_names, dev, ctx,
                          timing_used, repeats, warmup)
        fixed = fixed_bytes(stages, params, optimizer, dev)
        info: dict[str, Any] = {
            "source": "memplan.profiler.profile_chain (measured)",
            "torch": torch.__version__,
            "repeats": repeats,
            "warmup": warmup,
            "timing": timing_used,
            "optimizer": optimizer,
            "policies": list(policy_names) if policy_names else None,
            "autocast_dtype": str(ac_dtype).removeprefix("torch.") if ac_dtype else None,
            "fixed": fixed,
            "stages": extras,
        }
        for stage in stages:
            cfg = getattr(stage, "memplan_config", None)
            if cfg is not None:
                info["config"] = cfg
        info.update(_model_report(stages))
        if meta:
            info.update(meta)
        dtype = ac_dtype or param_dtype(stages) or torch.float32
        return Profile(
            name=name,
            device=str(dev),
            dtype=str(dtype).removeprefix("torch."),
            input_bytes=storage_bytes([example_input]),
            fixed_bytes=fixed["total_bytes"],
            layers=layers,
            meta=info,
        )
    finally:
        restore_state(stages, snapshot)


# ---------------------------------------------------------------------------------------------
# validation


def _check_options(stages: list, repeats: int, warmup: int, optimizer: str) -> None:
    if not stages:
        raise ProfileError("stages: empty; give at least one module (the last returns the loss)")
    for i, stage in enumerate(stages):
        if not isinstance(stage, nn.Module):
            raise ProfileError(
                f"stages[{i}]: expected an nn.Module, got {type(stage).__name__} (wrap functions in a module)"
            )
    if not isinstance(repeats, int) or repeats < 1:
        raise ProfileError(f"repeats: must be an integer >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ProfileError(f"warmup: must be an integer >= 0, got {warmup!r}")
    check_optimizer(optimizer)


def _policy_names(policies) -> list[str]:
    return policy_names(policies, error=ProfileError)


def stage_names(stages: Sequence[nn.Module]) -> list[str]:
    """A unique name per stage: its `memplan_name` attribute, else 'i.ClassName'."""
    out = []
    for i, stage in enumerate(stages):
        label = getattr(stage, "memplan_name", None) or f"{i + 1}.{type(stage).__name__}"
        out.append(label)
    seen: dict[str, int] = {}
    for i, label in enumerate(out):
        if label in seen:
            out[i] = f"{label}#{i + 1}"
        seen[label] = i
    return out


def _resolve_device(stages: list[nn.Module], x: torch.Tensor, device) -> torch.device:
    if not isinstance(x, torch.Tensor):
        raise ProfileError(
            f"example_input: expected a tensor (the input of stage 1), got {type(x).__name__}"
        )
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ProfileError("device: CUDA is not available on this machine; use --device cpu")
        if dev.type not in ("cpu", "cuda"):
            raise ProfileError(f"device: choose cpu or cuda, not {dev.type!r}")
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev
    for stage in stages:
        for p in stage.parameters():
            return p.device
    return x.device


def _check_devices(stages, labels, x: torch.Tensor, dev: torch.device) -> None:
    if x.device != dev:
        raise ProfileError(
            f"example_input: on {x.device} but stage 1 ({labels[0]}) runs on {dev}; "
            f"move it with .to({str(dev)!r}) or pass device="
        )
    for i, stage in enumerate(stages):
        for pname, t in [*stage.named_parameters(), *stage.named_buffers()]:
            if t.device != dev:
                raise ProfileError(
                    f"stage {i + 1} ({labels[i]}): {pname} is on {t.device}, not {dev}; "
                    "move every stage to one device (or pass device=)"
                )


def _autocast_dtype(value) -> torch.dtype | None:
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        return value
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if value not in table:
        raise ProfileError(f"autocast_dtype: choose bfloat16 or float16, not {value!r}")
    return table[value]


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ---------------------------------------------------------------------------------------------
# the chain's inputs and each stage's output checks


def _chain_inputs(stages, labels, x0: torch.Tensor, ctx) -> list[torch.Tensor]:
    """a_0 .. a_{L-1}: the chain run once without autograd, outputs checked."""
    inputs = [x0]
    x = x0
    L = len(stages)
    with torch.no_grad():
        for i, stage in enumerate(stages):
            with ctx():
                out = stage(x)
            _check_output(out, i, L, labels[i])
            if i < L - 1:
                inputs.append(out)
            x = out
    return inputs


def _check_output(out, i: int, L: int, label: str) -> None:
    if not isinstance(out, torch.Tensor):
        hint = " (return one tensor; put the loss inside the last stage)" if i == L - 1 else (
            " (a stage passes exactly one tensor to the next)"
        )
        raise ProfileError(f"stage {i + 1} ({label}): returned {type(out).__name__}, not a tensor{hint}")
    if i == L - 1:
        if out.numel() != 1:
            raise ProfileError(
                f"stage {i + 1} ({label}): the last stage must return the scalar loss, "
                f"got a tensor of shape {tuple(out.shape)}"
            )
        if not out.is_floating_point():
            raise ProfileError(f"stage {i + 1} ({label}): the loss must be floating point, got {out.dtype}")
    elif not out.is_floating_point():
        raise ProfileError(
            f"stage {i + 1} ({label}): returned a {out.dtype} tensor; only stage 1 may take integers, "
            "so a stage's output must be floating point to carry a gradient"
        )


def _value_dtype(x) -> str | None:
    """The dtype name of a stage's tensor output ('float32', ...); None for other values."""
    return str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor) else None


# ---------------------------------------------------------------------------------------------
# memory


def _measure_stage_memory(stage, x_prev, first, dev, ctx, fixed_tensors) -> dict[str, Any]:
    x = stage_input(x_prev, first)
    saved: dict[int, int] = {}
    n_saved = 0

    def pack(t: torch.Tensor):
        nonlocal n_saved
        n_saved += 1
        st = t.untyped_storage()
        if st.nbytes():
            saved[st.data_ptr()] = st.nbytes()
        return t

    in_grad = 0
    # one block for the forward and its backward: the backward frees what the forward allocated,
    # and the CPU accounting sees a free only if it saw the allocation (profiler.memory)
    with measure_memory(dev) as meter:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx():
            out = stage(x)
        has_backward = out.requires_grad
        meter.mark("seed")
        seed = Seed.apply(out) if has_backward else None
        meter.mark("backward")
        if has_backward:
            # the output's gradient d_i is created inside the backward and held by autograd only,
            # so it is freed when the stage's last op has used it, as in a real step
            seed.backward()
    # an `F` op: the same forward under torch.no_grad(), where what a record keeps is transient
    # (NOTE [ no-grad forward bytes ] in planner/simulate.py)
    with measure_memory(dev) as nograd:
        with torch.no_grad(), ctx():
            out_f = stage(x.detach())
    del out_f
    fwd, bwd = meter.phases["start"], meter.phases["backward"]
    excluded = storage_sizes(fixed_tensors) | storage_sizes([x]) | storage_sizes([out])
    saved_bytes = sum(n for ptr, n in saved.items() if ptr not in excluded)
    out_bytes = storage_bytes([out])
    fwd_temp = max(0, fwd.peak_bytes - fwd.end_bytes)
    if has_backward:
        in_grad = storage_bytes([x.grad]) if x.grad is not None else 0
    # B i runs with d_i (x_i bytes) live in the chain model: count it there, not in tb_i
    bwd_temp = max(0, bwd.peak_bytes - bwd.start_bytes - in_grad - out_bytes) if has_backward else 0
    del out, x, seed
    return {
        "output_bytes": out_bytes,
        "saved_bytes": saved_bytes,
        "forward_temp_bytes": fwd_temp,
        "forward_nograd_temp_bytes": max(0, nograd.peak_bytes - nograd.end_bytes),
        "backward_temp_bytes": bwd_temp,
        "extra": {
            "nograd_forward_peak_bytes": nograd.peak_bytes,
            "saved_tensors": n_saved,
            "forward_peak_bytes": fwd.peak_bytes,
            "forward_end_bytes": fwd.end_bytes,
            # bytes the forward left allocated beyond its output and saved tensors (side-channel
            # values such as the aux losses' detached values): outside the chain model, ~0
            "retained_other_bytes": fwd.end_bytes - out_bytes - saved_bytes,
            "input_grad_bytes": in_grad,
            "backward_peak_above_start_bytes": bwd.peak_bytes - bwd.start_bytes if has_backward else 0,
            "backward_end_bytes": bwd.end_bytes - bwd.start_bytes if has_backward else 0,
        },
    }


# ---------------------------------------------------------------------------------------------
# save policies

# NOTE [ measuring save policies ]
# 1. Candidates per stage come from traced recorded forwards of it (the op list of the second of
#    three, the first pays one-off initialisations; each op's time the least of the second and
#    the third, which steadies the knapsack's order on a loaded machine): NOTE [ candidate save
#    policies ] in
#    profiler/policies.py. The loss stage (the last), stages whose output takes no gradient and a
#    first stage whose input is not floating (token ids: an embedding, whose record is small and
#    whose backward under a selective checkpoint measured, in a store-all step on a tiny GPT, one
#    activation above the same backward measured alone) get none.
# 2. Each candidate is measured on the real stage as the base fields are, with the same meter in
#    one block for the forward and its backward, the stage run as `recorded(stage, a_{i-1},
#    recompute=...)` (what the executor's `R i` runs): saved_bytes = what the recorded forward
#    leaves minus the output a_i's new storages (the selective checkpoint's cache and its saved
#    RNG state included: autograd's saved-tensor hooks do not see them, so the base's hook count
#    cannot be used; for 'all' the two agree wherever `retained_other_bytes` is 0);
#    forward_temp_bytes = forward peak minus what it leaves; backward_temp_bytes = backward peak
#    above its start minus d_{i-1} and d_i, the recomputation inside it included. One unmeasured
#    forward and backward under the policy runs first (the first selective checkpoint of a stage
#    allocates once what later ones reuse), then the measured one.
# 3. Times: with chain timing, passes over the whole chain, one per policy name with every stage
#    that has a candidate of that name run under it, and one with none ('all'); else each stage
#    alone, as the base times were taken. The passes are interleaved round by round (every
#    variant once per round, medians over the rounds) and the base times are replaced by those of
#    the 'all' passes, so that on a loaded machine a policy and its base see the same load.
# 4. A candidate the stage cannot run under (the selective checkpoint refuses an op) is left out
#    and logged. `select_policies` keeps the rest that free bytes and are not beaten.


class _UnderPolicy:
    """A stage whose recorded forward runs under a save policy (an `R` op of the executor)."""

    def __init__(self, stage: nn.Module, recompute: Sequence[str]) -> None:
        self.stage, self.recompute = stage, list(recompute)

    def __call__(self, x):
        if not torch.is_grad_enabled():
            return self.stage(x)
        return recorded(self.stage, x, recompute=self.recompute)


def _add_policies(stages, labels, inputs, layers, extras, names, dev, ctx, timing_used, repeats,
                  warmup) -> None:
    """Measure and attach the save policies `names` of every stage (NOTE [ measuring save
    policies ])."""
    measured: dict[int, dict[str, dict[str, Any]]] = {}
    candidates: dict[int, list[tuple[str, list[str]]]] = {}
    for i, stage in enumerate(stages[:-1]):
        if i == 0 and not (torch.is_tensor(inputs[0]) and inputs[0].is_floating_point()):
            continue  # rule 1: an embedding of tokens
        x = stage_input(inputs[i], i == 0)
        with ctx():
            out = stage(x)
        trains = isinstance(out, torch.Tensor) and out.requires_grad
        del out
        if not trains:
            continue

        def run(x=x, stage=stage):
            with ctx():
                return stage(x)

        trace_ops(run)
        ops, again = trace_ops(run), trace_ops(run)
        if [op.name for op in ops] == [op.name for op in again]:  # each op's least time
            for op, other in zip(ops, again, strict=True):
                op.seconds = min(op.seconds, other.seconds)
        candidates[i] = candidate_policies(ops, names)
        measured[i] = {}
        for name, recompute in candidates[i]:
            try:
                measured[i][name] = _measure_policy_memory(stage, inputs[i], i == 0, dev, ctx,
                                                           recompute)
            except RuntimeError as err:
                log.warning("stage %d (%s): policy %s cannot run (%s); left out", i + 1,
                            labels[i], name, str(err).splitlines()[0] if str(err) else err)
    times = _time_policies(stages, inputs, layers, measured, candidates, names, dev, ctx,
                           timing_used, repeats, warmup)
    for i, by_name in measured.items():
        offered = [SavePolicy(name=name, recompute=dict(candidates[i])[name],
                              saved_bytes=m["saved_bytes"],
                              forward_temp_bytes=m["forward_temp_bytes"],
                              backward_temp_bytes=m["backward_temp_bytes"],
                              forward_s=times[i][name][0], backward_s=times[i][name][1])
                   for name, m in by_name.items()]
        base = layers[i]
        kept = select_policies((base.saved_bytes, base.backward_temp_bytes, base.backward_s),
                               offered)
        layers[i] = base.model_copy(update={"policies": kept})
        extras[i]["policies_measured"] = [p.model_dump() for p in offered]


def _time_policies(stages, inputs, layers, measured, candidates, names, dev, ctx, timing_used,
                   repeats, warmup) -> dict[int, dict[str, tuple[float, float]]]:
    """Per stage and policy name, the medians (seconds) of the recorded forward and backward
    (NOTE [ measuring save policies ] rule 3). The stages' base times (`layers[i]`, 'all') are
    taken again in the same interleaved rounds and replaced, so that a policy and its base are
    timed under the same load."""
    variants: list[tuple[str, list]] = [("all", list(stages))]
    for name in names:
        wrapped, has = list(stages), False
        for i, by_name in measured.items():
            if name in by_name:
                wrapped[i] = _UnderPolicy(stages[i], dict(candidates[i])[name])
                has = True
        if has:
            variants.append((name, wrapped))
    samples: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    chain = timing_used == "chain"
    for r in range(warmup + repeats):
        for name, wrapped in variants:
            got = time_chain(wrapped, inputs[0], dev, ctx, 1, 0)[0] if chain else None
            if got is None:  # stage timing, or the pass does not fit: each stage alone
                chain = False
                got = {i: time_stage(wrapped[i], inputs[i], i == 0, dev, ctx, 1, 0)
                       for i in measured}
            if r >= warmup:
                for i in measured:
                    if name == "all" or name in measured[i]:
                        samples.setdefault((i, name), []).append(got[i])
    med = statistics.median
    times: dict[int, dict[str, tuple[float, float]]] = {i: {} for i in measured}
    for (i, name), runs in samples.items():
        f_s, b_s, n_s = (med(r[k] for r in runs) for k in range(3))
        if name == "all":
            layers[i] = layers[i].model_copy(update={"forward_s": f_s, "backward_s": b_s,
                                                     "forward_nograd_s": n_s})
        else:
            times[i][name] = (f_s, b_s)
    return times


def _measure_policy_memory(stage, x_prev, first, dev, ctx, recompute) -> dict[str, int]:
    """Bytes of stage's recorded forward and backward under the policy `recompute` (NOTE
    [ measuring save policies ] rule 2): saved_bytes, forward_temp_bytes, backward_temp_bytes,
    measured on the run after an unmeasured one."""
    # one unmeasured run first: the first selective checkpoint of a stage allocates once what
    # later ones reuse (measured: 9,344 bytes more in the first backward of a GPT-2 layer)
    x = stage_input(x_prev, first)
    with ctx():
        out = recorded(stage, x, recompute=recompute)
    Seed.apply(out).backward()
    del out, x
    return _policy_memory_once(stage, x_prev, first, dev, ctx, recompute)


def _policy_memory_once(stage, x_prev, first, dev, ctx, recompute) -> dict[str, int]:
    x = stage_input(x_prev, first)
    before = storage_sizes([x])
    with measure_memory(dev) as meter:
        with ctx():
            out = recorded(stage, x, recompute=recompute)
        meter.mark("seed")
        seed = Seed.apply(out)
        meter.mark("backward")
        seed.backward()
    fwd, bwd = meter.phases["start"], meter.phases["backward"]
    out_new = sum(n for ptr, n in storage_sizes([out]).items() if ptr not in before)
    out_bytes = storage_bytes([out])
    in_grad = storage_bytes([x.grad]) if x.grad is not None else 0
    result = {
        "saved_bytes": max(0, fwd.end_bytes - out_new),
        "forward_temp_bytes": max(0, fwd.peak_bytes - fwd.end_bytes),
        "backward_temp_bytes": max(0, bwd.peak_bytes - bwd.start_bytes - in_grad - out_bytes),
    }
    del out, x, seed
    return result


def _model_report(stages) -> dict[str, Any]:
    """Model-specific facts for the profile's meta (attention backend used, fallbacks)."""
    try:
        from memplan.profiler.models.gpt import Block, gpt_report
    except ImportError:  # pragma: no cover
        return {}
    if any(isinstance(s, Block) for s in stages):
        rep = gpt_report(stages)
        used = {v["used"] for v in rep["attention"].values()}
        reasons = {v["fallback_reason"] for v in rep["attention"].values() if v["fallback_reason"]}
        return {
            "attention_backend": used.pop() if len(used) == 1 else sorted(used),
            "attention_fallback": sorted(reasons) if reasons else None,
        }
    return {}
