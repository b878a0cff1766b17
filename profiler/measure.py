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
  NOTE [ Parameters shared between stages ] in `_fixed_bytes`).

Module state that a forward changes (BatchNorm statistics, expert and exit counters, any buffer)
and the random number generators are restored afterwards, so profiling leaves the model as it was.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
from memplan.profiler.memory import measure_memory
from memplan.profiler.schema import LayerProfile, Profile, ProfileError

__all__ = ["profile_chain", "optimizer_state_bytes", "stage_names", "param_dtype"]

log = logging.getLogger(__name__)

_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "none")
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
    "stage" (each stage alone). `progress(done, total, what)` is called after each stage. Raises
    `ProfileError` naming the stage on bad input.
    """
    stages = list(stages)
    _check_options(stages, repeats, warmup, optimizer)
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

    snapshot = _snapshot_state(stages)
    try:
        for stage in stages:
            stage.train()
        params = _unique_params(stages)
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
            chain_times, timing_used = _time_chain(stages, example_input, dev, ctx, repeats, warmup)
        for i, stage in enumerate(stages):
            label = stage_labels[i]
            mem = _measure_stage_memory(stage, inputs[i], i == 0, dev, ctx, fixed_tensors)
            if chain_times is not None:
                f_s, b_s, n_s = chain_times[i]
            else:
                f_s, b_s, n_s = _time_stage(stage, inputs[i], i == 0, dev, ctx, repeats, warmup)
            flops = _forward_flops(stage, inputs[i], ctx)
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
        fixed = _fixed_bytes(stages, params, optimizer, dev)
        info: dict[str, Any] = {
            "source": "memplan.profiler.profile_chain (measured)",
            "torch": torch.__version__,
            "repeats": repeats,
            "warmup": warmup,
            "timing": timing_used,
            "optimizer": optimizer,
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
            input_bytes=_storage_bytes([example_input]),
            fixed_bytes=fixed["total_bytes"],
            layers=layers,
            meta=info,
        )
    finally:
        _restore_state(stages, snapshot)


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
    if optimizer not in _OPTIMIZERS:
        raise ProfileError(f"optimizer: choose one of {', '.join(_OPTIMIZERS)}, not {optimizer!r}")


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


def _stage_input(x: torch.Tensor, first: bool) -> torch.Tensor:
    """The stage's input as a leaf that takes a gradient (stage 1's data input does not)."""
    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    return x


class _Seed(torch.autograd.Function):
    """A scalar whose backward hands `ones_like(out)` to `out`'s graph, so that the gradient of the
    stage's output exists only inside autograd (a Python reference would pin it)."""

    @staticmethod
    def forward(ctx, out):
        ctx.meta = (out.shape, out.dtype, out.device)
        return out.new_zeros(())

    @staticmethod
    def backward(ctx, grad):
        shape, dtype, device = ctx.meta
        return torch.ones(shape, dtype=dtype, device=device)


def _value_dtype(x) -> str | None:
    """The dtype name of a stage's tensor output ('float32', ...); None for other values."""
    return str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor) else None


def _storages(tensors) -> dict[int, int]:
    out: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            if st.nbytes():
                out[st.data_ptr()] = st.nbytes()
    return out


def _storage_bytes(tensors) -> int:
    return sum(_storages(tensors).values())


# ---------------------------------------------------------------------------------------------
# memory


def _measure_stage_memory(stage, x_prev, first, dev, ctx, fixed_tensors) -> dict[str, Any]:
    x = _stage_input(x_prev, first)
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
        seed = _Seed.apply(out) if has_backward else None
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
    excluded = _storages(fixed_tensors) | _storages([x]) | _storages([out])
    saved_bytes = sum(n for ptr, n in saved.items() if ptr not in excluded)
    out_bytes = _storage_bytes([out])
    fwd_temp = max(0, fwd.peak_bytes - fwd.end_bytes)
    if has_backward:
        in_grad = _storage_bytes([x.grad]) if x.grad is not None else 0
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
# time and FLOPs


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _time_stage(stage, x_prev, first, dev, ctx, repeats, warmup) -> tuple[float, float, float]:
    """Medians (seconds) of the recorded forward, its backward and the forward under
    torch.no_grad() (an `F` op; NOTE [ no-grad forward time ] in planner/simulate.py)."""
    fwd: list[float] = []
    bwd: list[float] = []
    nograd: list[float] = []
    clock = _Clock(dev)
    for r in range(warmup + repeats):
        x = _stage_input(x_prev, first)
        clock.mark()
        with ctx():
            out = stage(x)
        clock.mark()
        if out.requires_grad:
            grad = torch.ones_like(out)  # made outside the timed span
            clock.mark()
            torch.autograd.backward(out, grad)
            clock.mark()
            del grad
        else:
            clock.mark()
            clock.mark()
        del out
        clock.mark()
        with torch.no_grad(), ctx():
            out = stage(x)
        clock.mark()
        f_s, b_s, n_s = _spans(clock.take())
        del out, x
        if r >= warmup:
            fwd.append(f_s)
            bwd.append(b_s)
            nograd.append(n_s)
    return statistics.median(fwd), statistics.median(bwd), statistics.median(nograd)


def _time_chain(stages, x0, dev, ctx, repeats, warmup) -> tuple[list[tuple[float, float, float]] | None, str]:
    """Per stage, medians (seconds) of the recorded forward, its backward and the no-grad forward,
    each timed inside a pass over the whole chain; and what `meta["timing"]` records. None where
    the pass does not fit on the device (the caller then times each stage alone).

    NOTE [ timing in context ]
    A stage timed alone, again and again on its own input, does not run as it runs in a step,
    where every other stage has been through the caches and the allocator in between. The
    executor runs a step op by op, so its per-op times are the reference. Measured on the
    benchmark's residual MLP blocks (2-core CPU, one thread, glibc's heap kept, medians of
    interleaved repeats, the runner's op times summed over a store-all step): 32 blocks of width
    512, batch 256: recorded forwards 301.7 ms timed in the chain, 300.3 ms in the runner, 324.7 ms
    alone; backwards 619.1 / 619.8 / 682.8 ms; no-grad forwards 286 ms in the chain, 334 ms alone.
    Alone was 8-17% off; in the chain, within 0.5%.
    Each repeat here is therefore one store-all step (the stages' recorded forwards in order, each
    from a detached input that takes a gradient, as an `R` op runs them; then their backwards
    from the last, as `B` ops run them) followed by a forward under torch.no_grad() over the chain
    (`F` ops); a stage's three times are medians over the repeats. A floating a_0 takes a gradient
    here, as the executor's `R 1` gives it one (the chain model's `B 1` makes d_0).
    """
    fwd: list[list[float]] = [[] for _ in stages]
    bwd: list[list[float]] = [[] for _ in stages]
    nograd: list[list[float]] = [[] for _ in stages]
    try:
        for r in range(warmup + repeats):
            f_s, b_s, n_s = _chain_pass(stages, x0, dev, ctx)
            if r >= warmup:
                for i in range(len(stages)):
                    fwd[i].append(f_s[i])
                    bwd[i].append(b_s[i])
                    nograd[i].append(n_s[i])
    except torch.OutOfMemoryError as err:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        first = str(err).splitlines()[0] if str(err) else "out of memory"
        log.warning("timing: a store-all pass over the chain does not fit on %s (%s); timing each "
                    "stage alone instead (NOTE [ timing in context ])", dev, first)
        return None, "stage (a pass over the chain did not fit)"
    med = statistics.median
    return [(med(fwd[i]), med(bwd[i]), med(nograd[i])) for i in range(len(stages))], "chain"


def _chain_pass(stages, x0, dev, ctx) -> tuple[list[float], list[float], list[float]]:
    """One store-all step, then a no-grad forward, over the chain: seconds per stage of each."""
    L = len(stages)
    clock = _Clock(dev)
    records: list[tuple[torch.Tensor, torch.Tensor]] = []
    x = x0
    for stage in stages:
        inp = x.detach()
        if inp.is_floating_point():
            inp.requires_grad_(True)
        clock.mark()
        with torch.enable_grad(), ctx():
            out = stage(inp)
        clock.mark()
        records.append((inp, out))
        x = out.detach()
    del x, out
    f_spans = _spans(clock.take())
    grad: torch.Tensor | None = None
    for i in range(L - 1, -1, -1):
        inp, out = records.pop()  # its saved tensors are freed after its backward, as by `B i`
        if grad is None and i < L - 1:
            grad = torch.zeros_like(out)  # the next stage did not use its input
        clock.mark()
        if out.requires_grad:
            torch.autograd.backward(out, grad)
        clock.mark()
        grad = inp.grad if inp.requires_grad else None
        del inp, out
    del grad
    b_spans = _spans(clock.take())[::-1]
    x = x0
    with torch.no_grad():
        for stage in stages:
            clock.mark()
            with ctx():
                x = stage(x)
            clock.mark()
    del x
    return f_spans, b_spans, _spans(clock.take())


def _spans(marks: list[float]) -> list[float]:
    """Seconds between each pair of marks (start, end, start, end, ...)."""
    return [marks[k + 1] - marks[k] for k in range(0, len(marks), 2)]


class _Clock:
    """Time marks (seconds): CUDA events read after one synchronisation on a GPU, a monotonic
    clock after synchronisation on the CPU."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev
        self.marks: list = []

    def mark(self) -> None:
        if self.dev.type == "cuda":
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def take(self) -> list[float]:
        marks, self.marks = self.marks, []
        if self.dev.type != "cuda":
            return marks
        _sync(self.dev)
        return [marks[0].elapsed_time(e) / 1e3 for e in marks]


def _forward_flops(stage, x_prev, ctx) -> float:
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_flash(q, k, v, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(q, k, v)

    # the CPU flash kernel has no formula of its own in FlopCounterMode: count it like SDPA's
    x = x_prev.detach()
    counter = FlopCounterMode(
        display=False,
        custom_mapping={torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash},
    )
    with torch.no_grad(), counter, ctx():
        stage(x)
    return float(counter.get_total_flops())


# ---------------------------------------------------------------------------------------------
# fixed memory and module state


def _unique_params(stages) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for stage in stages:
        for p in stage.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def optimizer_state_bytes(params, optimizer: str, device: torch.device) -> int:
    """Bytes the optimizer allocates for `params` once it has stepped (torch.optim's layout):
    AdamW/Adam two moments like each parameter plus a 4-byte step tensor per parameter (kept on
    the CPU unless the parameters are on a GPU, where it is not counted); SGD with momentum one
    buffer; plain SGD and 'none' nothing."""
    trainable = [p for p in params if p.requires_grad]
    if optimizer in ("adamw", "adam"):
        moments = sum(2 * p.numel() * p.element_size() for p in trainable)
        steps = 4 * len(trainable) if device.type == "cpu" else 0
        return moments + steps
    if optimizer == "sgd-momentum":
        return sum(p.numel() * p.element_size() for p in trainable)
    return 0


def _fixed_bytes(stages, params, optimizer: str, dev: torch.device) -> dict[str, int]:
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    state = optimizer_state_bytes(params, optimizer, dev)
    buffers: dict[int, torch.Tensor] = {}
    for stage in stages:
        for b in stage.buffers():
            buffers.setdefault(id(b), b)
    buffer_bytes = sum(b.numel() * b.element_size() for b in buffers.values())
    # NOTE [ Parameters shared between stages ]: autograd sums a shared leaf's gradient
    # contributions in a buffer before accumulating them, so the later stage's contribution stays
    # allocated until the earlier stage's backward: through the whole backward, whatever the plan.
    # It is fixed memory (the chain model has no other place for it).
    owners: dict[int, set[int]] = {}
    for i, stage in enumerate(stages):
        for p in stage.parameters():
            owners.setdefault(id(p), set()).add(i)
    pending = sum(
        p.numel() * p.element_size() for p in params if p.requires_grad and len(owners[id(p)]) > 1
    )
    return {
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": state,
        "buffer_bytes": buffer_bytes,
        "pending_shared_grad_bytes": pending,
        "n_params": sum(p.numel() for p in params),
        "total_bytes": param_bytes + grad_bytes + state + buffer_bytes + pending,
    }


def param_dtype(stages) -> torch.dtype | None:
    """The dtype of the stages' first floating parameter (what they compute in without
    autocast); None when they have none."""
    for stage in stages:
        for p in stage.parameters():
            if p.is_floating_point():
                return p.dtype
    return None


def _snapshot_state(stages) -> dict[str, Any]:
    bufs = []
    for stage in stages:
        for b in stage.buffers():
            bufs.append((b, b.detach().clone()))
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in _unique_params(stages)]
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"buffers": bufs, "grads": grads, "cpu_rng": torch.get_rng_state(), "cuda_rng": cuda_rng}


def _restore_state(stages, snap: dict[str, Any]) -> None:
    with torch.no_grad():
        for b, saved in snap["buffers"]:
            b.copy_(saved)
        for p, g in snap["grads"]:
            if g is None:
                p.grad = None
            elif p.grad is not None:
                p.grad.copy_(g)
            else:
                p.grad = g
    torch.set_rng_state(snap["cpu_rng"])
    if snap["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(snap["cuda_rng"])


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
