"""Memory-aware sizing: the largest compute-optimal model whose training step fits the devices,
with the checkpoint plan that makes it fit, its recompute overhead and the training time.

For each candidate depth the shape comes from the aspect-ratio rule (`shapes.py`), the per-stage
bytes and times from an analytic profile of that GPT (`memplan.profiler.analytic`, from shapes alone,
imported on call), and the plan from `memplan.planner.plan(profile, budget_bytes=..., strategy=...)`
(default "optimal"). A depth fits when the plan is feasible within the device memory left after
the fixed bytes. Memory grows with depth, so a bisection over n_layer finds the largest that fits;
the same search with "store-all" shows what fits without checkpointing.

NOTE [ the overhead cap ]
A depth fits only when its plan's recompute overhead is at most `max_overhead` (default
MAX_OVERHEAD = 0.3; None: any). Without the cap the answer buys size with any slowdown: on 8 x 141
GB the largest model that fits at all recomputes most of its forward. The optimal plan is the
least recompute within the memory, and a deeper model leaves less memory for a longer chain, so
its least overhead grows with depth and the bisection stays valid. Overheads are compared within
1e-12 (a store-all replay's overhead is rounding above 0). Each answer carries the
trade-off: the largest model under each cap of TRADEOFF_CAPS, from the same cached plans.

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

from memplan.planner.scaling.errors import (
    InfeasibleSizing,
    ScalingError,
    check_fraction,
    check_positive,
)
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN, Law, get_law
from memplan.planner.scaling.queries import Sizing, sizing
from memplan.planner.scaling.shapes import MAX_LAYERS, GPTShape, shape_for_layers
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MemorySizing", "TradeoffPoint", "memory_aware_size",
           "MAX_OVERHEAD", "TRADEOFF_CAPS", "analytic_gpt_profile", "Trial"]

log = logging.getLogger(__name__)

ProfileFn = Callable[[GPTShape, int, str], object]  # (shape, micro_batch, dtype) -> Profile

# The default recompute overhead a memory-aware answer may cost (recompute time over the store-all
# step time): without a cap the largest model that fits can spend most of its step recomputing.
MAX_OVERHEAD = 0.3
# the caps of the size-against-overhead table every memory-aware answer carries (None: no cap)
TRADEOFF_CAPS: tuple[float | None, ...] = (0.0, 0.1, 0.2, 0.3, 0.5, None)


class TradeoffPoint(BaseModel):
    """The largest model that fits within one recompute-overhead cap."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_overhead: float | None = Field(description="the cap (None: no cap)")
    n_layer: int = Field(description="its depth (0: no model fits under the cap)")
    params: float | None = Field(description="its parameters (None: none fits)")
    recompute_overhead: float | None = Field(description="its plan's overhead, within the cap")


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
    max_overhead: float | None = Field(description="the recompute overhead allowed (None: any)")
    recompute_overhead: float = Field(description="recompute time over the store-all time")
    checkpoints: int = Field(description="stage outputs the plan keeps for recomputation")
    store_all_params: float | None = Field(
        default=None, description="the largest model that fits without checkpointing (None: none)"
    )
    store_all_n_layer: int | None = None
    tradeoff: list[TradeoffPoint] = Field(
        default_factory=list, description="size against overhead: the largest model per cap")
    peak_flops: float | None = Field(default=None, description="per-device peak FLOP/s")
    utilization: float
    training_time_s: float | None = Field(default=None, description="wall-clock seconds (None: "
                                          "no peak FLOP/s given)")
    training_days: float | None = None
    notes: list[str] = Field(default_factory=list)


def analytic_gpt_profile(shape: GPTShape, micro_batch: int, dtype: str, *,
                         precision: str | None = None):
    """The analytic profile (`memplan.profiler.analytic.gpt_analytic_profile`, shapes alone, GPU byte
    accounting) of nanoGPT with `shape`: flash attention, no dropout, biases, tied embedding, and
    activations in `dtype`, or as the `precision` policy computes them (a mixed policy: under
    autocast, its residual stream fp32). Imported here, on call, so that the rest of sizing stays
    light."""
    try:
        from memplan.profiler.analytic import gpt_analytic_profile
    except ImportError as err:
        raise ScalingError(
            "memory-aware sizing needs profiler.analytic (the analytic GPT profile), which cannot "
            f"be imported here: {err}"
        ) from None
    cfg = dict(n_layer=shape.n_layer, n_embd=shape.d_model, n_head=shape.n_head,
               block_size=shape.seq_len, vocab_size=shape.vocab_size, batch_size=micro_batch,
               dropout=0.0, bias=True, attention="flash", tie_weights=True)
    if precision is None:
        return gpt_analytic_profile({**cfg, "dtype": dtype}, device="cuda")
    return gpt_analytic_profile(cfg, device="cuda", precision=precision)


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


def check_max_overhead(value: float | None) -> float | None:
    """The overhead cap, validated: None (no cap) or a finite number >= 0 (0.3 = 30%)."""
    if value is None:
        return None
    return check_positive("max_overhead", value, allow_zero=True)


class Trial:
    """Plans of GPT shapes on the devices, cached: the one pricing every memory-aware answer
    (the fixed bytes by the precision policy and ZeRO stage, the activations by an analytic
    profile and the planner's strategy)."""

    def __init__(self, mem: int, *, n_devices: int, policy, zero_stage: int, dtype: str,
                 strategy: str, profile_fn: ProfileFn | None,
                 progress: Callable[[int, int], None] | None = None):
        self.mem, self.n_devices, self.policy, self.zero_stage = mem, n_devices, policy, zero_stage
        self.dtype, self.strategy, self.progress = dtype, strategy, progress
        if profile_fn is not None:
            self.make = profile_fn
        else:  # activations as the policy computes them (bf16-mixed: under autocast), when it can
            from memplan.profiler.precision import POLICY_DTYPES

            priced = policy.name in POLICY_DTYPES and POLICY_DTYPES[policy.name][1] == dtype

            def make(shape, micro_batch, dt):
                return analytic_gpt_profile(shape, micro_batch, dt,
                                            precision=policy.name if priced else None)

            self.make = make
        self.cache: dict[tuple, tuple[bool, object, int]] = {}
        self.calls = 0

    def __call__(self, shape: GPTShape, micro_batch: int, how: str | None = None):
        """(feasible, plan or None, fixed bytes per device) for `shape` at `micro_batch`."""
        from memplan.planner.sharding import sharded_fixed_bytes

        from memplan import planner

        how = how or self.strategy
        key = (shape, micro_batch, how)
        if key in self.cache:
            return self.cache[key]
        d = shape.d_model
        unit = max(12 * d * d + 13 * d, shape.vocab_size * d)  # a block, or the embedding
        fixed = sharded_fixed_bytes(shape.params, n_gpus=self.n_devices, zero_stage=self.zero_stage,
                                    policy=self.policy, gathered_params=unit).fixed_bytes
        if fixed >= self.mem:
            out = (False, None, fixed)
        else:
            prof = self.make(shape, micro_batch, self.dtype)
            prof = prof.model_copy(update={"fixed_bytes": fixed})
            plan = planner.plan(prof, budget_bytes=self.mem - fixed, strategy=how)
            out = (plan.feasible, plan, fixed)
        self.cache[key] = out
        self.calls += 1
        if self.progress:
            self.progress(self.calls, 0)  # total unknown in advance (0)
        return out

    def fits(self, shape: GPTShape, micro_batch: int, cap: float | None, how: str | None = None):
        """Whether `shape` trains at `micro_batch` with a plan whose overhead is within `cap`."""
        ok, plan, _ = self(shape, micro_batch, how)
        return ok and (cap is None or plan.predicted.overhead <= cap + 1e-12)


def largest_int(fits: Callable[[int], bool], cap: int) -> int:
    """The largest n in 1..cap with fits(n), for `fits` true up to a point and false after it
    (doubling, then bisection); 0 when fits(1) is false."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= cap and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, cap + 1)
    while hi - lo > 1:  # fits(lo), and not fits(hi) (or hi is past the cap)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def setup(device_memory_bytes: int, whole: dict[str, int], *, law: str | Law | None,
          dtype: str | None, precision: str, zero_stage: int, strategy: str,
          max_overhead: float | None, device: str | None, peak_flops: float | None,
          utilization: float, profile_fn: ProfileFn | None,
          progress: Callable[[int, int], None] | None):
    """Validate what `memory_aware_size` and `memory_fit` both take, in this order: the device
    memory (bytes), the `whole` numbers (each >= 1, named by its key), the overhead cap, the
    precision policy, utilization, peak FLOP/s or device, law and strategy. Returns (device
    memory in bytes, overhead cap or None, utilization, per-device peak FLOP/s or None, law,
    notes to report, the `Trial` pricing activations in `dtype` (None: the policy's compute
    dtype); its policy, dtype and strategy are the answer's). Raises `ScalingError` naming the
    field."""
    mem = int(check_positive("device_memory_bytes", device_memory_bytes))
    for name, v in whole.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScalingError(f"{name}: must be a whole number >= 1, got {v!r}")
    cap = check_max_overhead(max_overhead)
    from memplan.planner.precision import get_policy

    policy = get_policy(precision)
    util = check_fraction("utilization", utilization)
    peak = _peak_flops(device, peak_flops)
    lw = get_law(law)
    notes: list[str] = []
    strat = _strategy(strategy, notes)
    trial = Trial(mem, n_devices=whole["n_devices"], policy=policy, zero_stage=zero_stage,
                  dtype=dtype or policy.compute_dtype, strategy=strat, profile_fn=profile_fn,
                  progress=progress)
    return mem, cap, util, peak, lw, notes, trial


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
    max_overhead: float | None = MAX_OVERHEAD,
    device: str | None = None,
    peak_flops: float | None = None,
    utilization: float = 0.4,
    profile_fn: ProfileFn | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MemorySizing:
    """The largest compute-optimal GPT (by the law's N -> D_opt) whose training step fits on
    `n_devices` devices of `device_memory_bytes` bytes each with a plan of recompute overhead at
    most `max_overhead` (NOTE [ the overhead cap ]), with its plan, training time (seconds) and
    the size-against-overhead trade-off.

    Raises `ScalingError` on bad input, or when not even one layer fits.
    """
    mem, cap, util, peak_flops, lw, notes, trial = setup(
        device_memory_bytes, dict(n_devices=n_devices, seq_len=seq_len, micro_batch=micro_batch,
                                  aspect_ratio=aspect_ratio, head_dim=head_dim,
                                  vocab_size=vocab_size),
        law=law, dtype=dtype, precision=precision, zero_stage=zero_stage, strategy=strategy,
        max_overhead=max_overhead, device=device, peak_flops=peak_flops, utilization=utilization,
        profile_fn=profile_fn, progress=progress)
    policy, dtype, strat = trial.policy, trial.dtype, trial.strategy
    shape_opts = dict(aspect_ratio=aspect_ratio, head_dim=head_dim, vocab_size=vocab_size,
                      seq_len=seq_len)

    def largest(limit: float | None, how: str | None = None) -> int:
        return largest_int(lambda n: trial.fits(shape_for_layers(n, **shape_opts), micro_batch,
                                                limit, how), MAX_LAYERS)

    best = largest(cap)
    if best == 0:
        shape = shape_for_layers(1, **shape_opts)
        within = "" if cap is None else f" within {cap:.0%} recompute overhead"
        raise InfeasibleSizing(
            f"device_memory_bytes: {mem} bytes per device cannot train even a 1-layer model "
            f"({shape.params:.3g} parameters) at seq_len {seq_len}, micro_batch {micro_batch}"
            f"{within}; add devices or memory, shorten the sequence or allow more overhead"
        )
    if best == MAX_LAYERS:
        notes.append(f"the search stopped at its cap of {MAX_LAYERS} layers")
    shape = shape_for_layers(best, **shape_opts)
    _, plan, fixed = trial(shape, micro_batch)
    store = largest(None, "store-all") if strat != "store-all" else best
    tradeoff = []
    for c in TRADEOFF_CAPS:
        n = largest(c)
        pl = trial(shape_for_layers(n, **shape_opts), micro_batch)[1] if n else None
        tradeoff.append(TradeoffPoint(
            max_overhead=c, n_layer=n,
            params=float(shape_for_layers(n, **shape_opts).params) if n else None,
            recompute_overhead=pl.predicted.overhead if pl else None))
    N = float(shape.params)
    D = lw.optimal_flops_for_params(N) / (FLOPS_PER_PARAM_TOKEN * N)
    pred = plan.predicted
    time_s = _training_time(N, D, pred.overhead, n_devices, peak_flops, util)
    base = sizing(lw, "memory", N, D)
    return MemorySizing(
        **base,
        device_memory_bytes=mem, n_devices=n_devices, n_layer=shape.n_layer,
        d_model=shape.d_model, n_head=shape.n_head, vocab_size=vocab_size, seq_len=seq_len,
        micro_batch=micro_batch, dtype=dtype, precision=policy.name, zero_stage=zero_stage,
        fixed_bytes_per_device=fixed,
        activation_budget_bytes=mem - fixed, peak_bytes=pred.peak_bytes,
        total_peak_bytes=fixed + pred.peak_bytes, strategy=strat, max_overhead=cap,
        recompute_overhead=pred.overhead, checkpoints=len(plan.checkpoints),
        store_all_params=float(shape_for_layers(store, **shape_opts).params) if store else None,
        store_all_n_layer=store or None, tradeoff=tradeoff, peak_flops=peak_flops, utilization=util,
        training_time_s=time_s, training_days=None if time_s is None else time_s / 86400,
        notes=notes,
    )


def _peak_flops(device: str | None, peak_flops: float | None) -> float | None:
    """Per-device peak FLOP/s: `peak_flops`, else the named device's; None when neither."""
    if peak_flops is not None and device is not None:
        raise ScalingError("peak_flops: give peak_flops or device, not both")
    if peak_flops is None and device is not None:
        from memplan.planner.devices import DEVICES, device_preset
        from memplan.planner.schema import PlanError

        try:
            return device_preset(device).peak_bf16_flops
        except PlanError:
            raise ScalingError(f"device: unknown {device!r}; choose one of {', '.join(DEVICES)} "
                               "or give peak_flops") from None
    if peak_flops is not None:
        return check_positive("peak_flops", peak_flops)
    return None


def _training_time(N: float, D: float, overhead: float, n_devices: int,
                   peak_flops: float | None, util: float) -> float | None:
    """Seconds to train N parameters on D tokens (NOTE [ the training time ]); None without a
    peak FLOP/s."""
    if peak_flops is None:
        return None
    return FLOPS_PER_PARAM_TOKEN * N * D * (1.0 + overhead) / (n_devices * peak_flops * util)
