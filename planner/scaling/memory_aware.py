"""Memory-aware sizing: the largest compute-optimal model whose training step fits the devices,
with the checkpoint plan that makes it fit, its recompute overhead and the training time.

For each candidate depth the shape comes from the aspect-ratio rule (`shapes.py`), the per-stage
bytes and times from an analytic profile of that GPT (`memplan.profiler.analytic`, from shapes alone,
imported on call), and the plan from `memplan.planner.plan(profile, budget_bytes=..., strategy=...)`
(default "optimal"). A depth fits when the plan is feasible within the device memory left after
the fixed bytes. Memory grows with depth, so a bisection over n_layer finds the largest that fits;
the same search with "store-all" shows what fits without checkpointing.

NOTE [ what a device holds ]
Training state (weights, gradients, optimizer state) comes from `memplan.planner.precision` (the policy,
default "bf16-mixed": 16 bytes per parameter with AdamW) and `memplan.planner.sharding` (ZeRO stage,
default 3 = FSDP full sharding: each of the n devices holds 1/n of it, plus the gathered weights of
the largest unit, one block or the embedding; stage 0 is plain data parallel). Each device runs
`micro_batch` sequences through the whole model (no tensor or pipeline parallelism), so the
activation chain is the full model's at that micro-batch. Communication buckets and the
allocator's fragmentation are not modelled: leave headroom in `device_memory_bytes`.

NOTE [ the training time ]
time = 6 N D (1 + overhead) / (n_devices * peak_flops * utilization), where overhead is the plan's
recompute time over the store-all time (the extra forwards), N and D the model and its
compute-optimal tokens, and utilization the fraction of peak the run sustains on useful and
recomputed FLOPs alike (40% is typical of large dense training; Chowdhery et al. 2022, Table 3,
report 46% model-FLOPs utilisation for PaLM).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from memplan.planner.scaling.errors import ScalingError, check_fraction, check_positive
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN, Law, get_law
from memplan.planner.scaling.queries import Sizing, sizing
from memplan.planner.scaling.shapes import MAX_LAYERS, GPTShape, shape_for_layers
from pydantic import Field

__all__ = ["MemorySizing", "memory_aware_size", "DEVICE_PEAK_FLOPS", "analytic_gpt_profile"]

log = logging.getLogger(__name__)

# Dense bf16 tensor-core peak FLOP/s per device (NVIDIA datasheets, SXM parts, without sparsity).
DEVICE_PEAK_FLOPS: dict[str, float] = {
    "A100": 312e12,
    "A100-40GB": 312e12,
    "A100-80GB": 312e12,
    "H100": 989e12,
    "H200": 989e12,
}

ProfileFn = Callable[[GPTShape, int, str], object]  # (shape, micro_batch, dtype) -> Profile


class MemorySizing(Sizing):
    """The largest compute-optimal model that trains on the devices, and its plan."""

    device_memory_bytes: int = Field(gt=0)
    n_devices: int = Field(ge=1)
    n_layer: int
    d_model: int
    n_head: int
    vocab_size: int
    seq_len: int
    micro_batch: int
    dtype: str
    precision: str = Field(description="memplan.planner.precision policy of the training state")
    zero_stage: int = Field(description="ZeRO stage sharding that state over the devices")
    fixed_bytes_per_device: int = Field(description="training state held per device")
    activation_budget_bytes: int = Field(description="device memory minus the fixed bytes")
    peak_bytes: int = Field(description="the plan's activation peak")
    total_peak_bytes: int = Field(description="fixed bytes plus the activation peak")
    strategy: str = Field(description="the planner strategy used")
    recompute_overhead: float = Field(description="recompute time over the store-all time")
    checkpoints: int = Field(description="stage outputs the plan keeps for recomputation")
    store_all_params: float | None = Field(
        default=None, description="the largest model that fits without checkpointing (None: none)"
    )
    store_all_n_layer: int | None = None
    peak_flops: float | None = Field(default=None, description="per-device peak FLOP/s")
    utilization: float
    training_time_s: float | None = Field(default=None, description="wall-clock seconds (None: "
                                          "no peak FLOP/s given)")
    training_days: float | None = None
    notes: list[str] = Field(default_factory=list)


def analytic_gpt_profile(shape: GPTShape, micro_batch: int, dtype: str):
    """The analytic profile (`memplan.profiler.analytic.gpt_analytic_profile`, shapes alone, GPU byte
    accounting) of nanoGPT with `shape`: flash attention, no dropout, biases, tied embedding, and
    activations in `dtype`. Imported here, on call, so that the rest of sizing stays light."""
    try:
        from memplan.profiler.analytic import gpt_analytic_profile
    except ImportError as err:
        raise ScalingError(
            "memory-aware sizing needs profiler.analytic (the analytic GPT profile), which cannot "
            f"be imported here: {err}"
        ) from None
    cfg = dict(n_layer=shape.n_layer, n_embd=shape.d_model, n_head=shape.n_head,
               block_size=shape.seq_len, vocab_size=shape.vocab_size, batch_size=micro_batch,
               dropout=0.0, bias=True, attention="flash", tie_weights=True, dtype=dtype)
    return gpt_analytic_profile(cfg, device="cuda")


def _strategy(requested: str, notes: list[str]) -> str:
    from memplan import planner
    if requested in planner.STRATEGIES:
        return requested
    if requested == "optimal":
        # NOTE: stand-in until planner.optimal is registered; uniform needs at least as much
        # memory as the optimum, so the sizes below are conservative.
        notes.append("strategy 'optimal' is not available in this planner; used 'uniform' as a "
                     "stand-in (sizes are conservative)")
        return "uniform"
    raise ScalingError(f"strategy: unknown {requested!r}; choose one of {', '.join(planner.STRATEGIES)}")


def memory_aware_size(
    device_memory_bytes: int,
    *,
    n_devices: int = 1,
    law: str | Law | None = None,
    seq_len: int = 2048,
    micro_batch: int = 1,
    dtype: str | None = None,
    precision: str = "bf16-mixed",
    zero_stage: int = 3,
    aspect_ratio: int = 128,
    head_dim: int = 128,
    vocab_size: int = 50304,
    strategy: str = "optimal",
    device: str | None = None,
    peak_flops: float | None = None,
    utilization: float = 0.4,
    profile_fn: ProfileFn | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MemorySizing:
    """The largest compute-optimal GPT (by the law's N -> D_opt) whose training step fits on
    `n_devices` devices of `device_memory_bytes` bytes each, with its plan and training time.

    Raises `ScalingError` on bad input, or when not even one layer fits.
    """
    from memplan import planner
    mem = int(check_positive("device_memory_bytes", device_memory_bytes))
    for name, v in (("n_devices", n_devices), ("seq_len", seq_len), ("micro_batch", micro_batch),
                    ("aspect_ratio", aspect_ratio), ("head_dim", head_dim),
                    ("vocab_size", vocab_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScalingError(f"{name}: must be a whole number >= 1, got {v!r}")
    from memplan.planner.precision import get_policy
    from memplan.planner.sharding import sharded_fixed_bytes

    policy = get_policy(precision)
    util = check_fraction("utilization", utilization)
    if peak_flops is None and device is not None:
        key = device.strip().upper()
        if key not in DEVICE_PEAK_FLOPS:
            raise ScalingError(f"device: unknown {device!r}; choose one of "
                               f"{', '.join(DEVICE_PEAK_FLOPS)} or give peak_flops")
        peak_flops = DEVICE_PEAK_FLOPS[key]
    if peak_flops is not None:
        peak_flops = check_positive("peak_flops", peak_flops)
    lw = get_law(law)
    dtype = dtype or policy.compute_dtype
    notes: list[str] = []
    strat = _strategy(strategy, notes)
    make = profile_fn or analytic_gpt_profile
    shape_opts = dict(aspect_ratio=aspect_ratio, head_dim=head_dim, vocab_size=vocab_size,
                      seq_len=seq_len)
    cache: dict[tuple[int, str], tuple[bool, object, GPTShape, int]] = {}
    calls = [0]

    def attempt(n_layer: int, how: str):
        key = (n_layer, how)
        if key in cache:
            return cache[key]
        shape = shape_for_layers(n_layer, **shape_opts)
        d = shape.d_model
        unit = max(12 * d * d + 13 * d, shape.vocab_size * d)  # a block, or the embedding
        fixed = sharded_fixed_bytes(shape.params, n_gpus=n_devices, zero_stage=zero_stage,
                                    policy=policy, gathered_params=unit).fixed_bytes
        if fixed >= mem:
            out = (False, None, shape, fixed)
        else:
            prof = make(shape, micro_batch, dtype)
            prof = prof.model_copy(update={"fixed_bytes": fixed})
            plan = planner.plan(prof, budget_bytes=mem - fixed, strategy=how)
            out = (plan.feasible, plan, shape, fixed)
        cache[key] = out
        calls[0] += 1
        if progress:
            progress(calls[0], 0)  # total unknown in advance (0)
        return out

    def largest(how: str) -> int:
        if not attempt(1, how)[0]:
            return 0
        lo, hi = 1, 2
        while hi <= MAX_LAYERS and attempt(hi, how)[0]:
            lo, hi = hi, hi * 2
        hi = min(hi, MAX_LAYERS + 1)
        while hi - lo > 1:  # attempt(lo) fits, attempt(hi) does not (or is past the cap)
            mid = (lo + hi) // 2
            if attempt(mid, how)[0]:
                lo = mid
            else:
                hi = mid
        return lo

    best = largest(strat)
    if best == 0:
        shape = shape_for_layers(1, **shape_opts)
        raise ScalingError(
            f"device_memory_bytes: {mem} bytes per device cannot train even a 1-layer model "
            f"({shape.params:.3g} parameters) at seq_len {seq_len}, micro_batch {micro_batch}; "
            "add devices or memory, or shorten the sequence"
        )
    if best == MAX_LAYERS:
        notes.append(f"the search stopped at its cap of {MAX_LAYERS} layers")
    _, plan, shape, fixed = attempt(best, strat)
    store = largest("store-all") if strat != "store-all" else best
    N = float(shape.params)
    D = lw.optimal_flops_for_params(N) / (FLOPS_PER_PARAM_TOKEN * N)
    pred = plan.predicted
    hw_flops = FLOPS_PER_PARAM_TOKEN * N * D * (1.0 + pred.overhead)
    time_s = None if peak_flops is None else hw_flops / (n_devices * peak_flops * util)
    base = sizing(lw, "memory", N, D)
    return MemorySizing(
        **base,
        device_memory_bytes=mem, n_devices=n_devices, n_layer=shape.n_layer,
        d_model=shape.d_model, n_head=shape.n_head, vocab_size=vocab_size, seq_len=seq_len,
        micro_batch=micro_batch, dtype=dtype, precision=policy.name, zero_stage=zero_stage,
        fixed_bytes_per_device=fixed,
        activation_budget_bytes=mem - fixed, peak_bytes=pred.peak_bytes,
        total_peak_bytes=fixed + pred.peak_bytes, strategy=strat,
        recompute_overhead=pred.overhead, checkpoints=len(plan.checkpoints),
        store_all_params=float(attempt(store, "store-all")[2].params) if store else None,
        store_all_n_layer=store or None, peak_flops=peak_flops, utilization=util,
        training_time_s=time_s, training_days=None if time_s is None else time_s / 86400,
        notes=notes,
    )
