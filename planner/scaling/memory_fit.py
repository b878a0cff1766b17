"""Does a given model train on the devices? The memory-aware answer for one size: the shape of N
parameters (the aspect-ratio rule), whether its step fits with a plan within the overhead cap,
the recompute that plan costs, and the largest micro-batch (at the sequence length) and the
longest sequence (at the micro-batch) that still fit.

Priced exactly as `memory_aware.py` prices every depth (`Trial`: fixed bytes by the precision
policy and ZeRO stage, activations by the analytic profile and the planner).
"""

from __future__ import annotations

from collections.abc import Callable

from memplan.planner.scaling.errors import check_positive
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN, Law
from memplan.planner.scaling.memory_aware import (
    MAX_OVERHEAD,
    ProfileFn,
    _training_time,
    largest_int,
    setup,
)
from memplan.planner.scaling.queries import Sizing, sizing
from memplan.planner.scaling.shapes import gpt_shape, shape_for_layers
from pydantic import Field

__all__ = ["MemoryFit", "memory_fit", "MAX_MICRO_BATCH", "MAX_SEQ_LEN"]

MAX_MICRO_BATCH = 1 << 16  # the searches' ceilings (a bisection needs one)
MAX_SEQ_LEN = 1 << 22


class MemoryFit(Sizing):
    """Whether a model of `params` parameters trains on the devices, and how."""

    fits: bool = Field(description="the step fits with a plan within max_overhead")
    message: str = Field(description="why not, or the plan in a sentence")
    device_memory_bytes: int = Field(gt=0)
    n_devices: int = Field(ge=1)
    n_layer: int
    d_model: int
    n_head: int
    shape_params: float = Field(description="parameters of the shape the rule gives for params")
    seq_len: int
    micro_batch: int
    precision: str
    zero_stage: int
    strategy: str
    max_overhead: float | None = Field(description="the recompute overhead allowed (None: any)")
    fixed_bytes_per_device: int = Field(description="training state held per device")
    activation_budget_bytes: int = Field(description="device memory minus the fixed bytes (<= 0: "
                                         "the state alone does not fit)")
    peak_bytes: int | None = Field(description="the plan's activation peak (None: no plan)")
    total_peak_bytes: int | None = None
    recompute_overhead: float | None = Field(description="the plan's recompute time over the "
                                             "store-all time (None: no plan fits)")
    checkpoints: int | None = None
    largest_micro_batch: int = Field(description="at seq_len, within max_overhead (0: none)")
    largest_seq_len: int = Field(description="at micro_batch, within max_overhead (0: none)")
    peak_flops: float | None = None
    utilization: float
    training_time_s: float | None = None
    training_days: float | None = None


def memory_fit(
    params: float,
    device_memory_bytes: int,
    *,
    n_devices: int = 1,
    law: str | Law | None = None,
    seq_len: int = 2048,
    micro_batch: int = 1,
    precision: str = "bf16-mixed",
    zero_stage: int = 3,
    strategy: str = "optimal",
    max_overhead: float | None = MAX_OVERHEAD,
    device: str | None = None,
    peak_flops: float | None = None,
    utilization: float = 0.4,
    profile_fn: ProfileFn | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MemoryFit:
    """Whether the GPT of about `params` parameters (the aspect-ratio shape nearest it) trains on
    `n_devices` devices of `device_memory_bytes` bytes with a plan of recompute overhead at most
    `max_overhead`; with the plan's bytes, overhead and checkpoints, the largest micro-batch and
    sequence that fit, the law's D_opt for `params` and the training time (seconds).
    Raises `ScalingError` on bad input; a model that does not fit is an answer (fits False)."""
    N = check_positive("params", params)
    mem, cap, util, peak, lw, notes, trial = setup(
        device_memory_bytes, dict(n_devices=n_devices, seq_len=seq_len, micro_batch=micro_batch),
        law=law, dtype=None, precision=precision, zero_stage=zero_stage, strategy=strategy,
        max_overhead=max_overhead, device=device, peak_flops=peak_flops, utilization=utilization,
        profile_fn=profile_fn, progress=progress)
    policy, strat = trial.policy, trial.strategy
    shape = gpt_shape(N, seq_len=seq_len)
    ok, plan, fixed = trial(shape, micro_batch)
    fits = trial.fits(shape, micro_batch, cap)

    def at_seq(t: int):
        return shape_for_layers(shape.n_layer, seq_len=t)

    mb = largest_int(lambda b: trial.fits(shape, b, cap), MAX_MICRO_BATCH)
    sl = largest_int(lambda t: trial.fits(at_seq(t), micro_batch, cap), MAX_SEQ_LEN)
    if fits:
        message = (f"fits: {plan.predicted.overhead:.1%} recompute overhead, "
                   f"{len(plan.checkpoints)} checkpoints")
    elif fixed >= mem:
        # ZeRO-3 (the default) already shards every state: only more devices or a smaller model help
        fix = (f"add devices or raise the ZeRO stage (now {zero_stage})" if zero_stage < 3
               else "add devices, or give a smaller model")
        message = (f"does not fit: the training state alone is {fixed} bytes per device, more "
                   f"than {mem}; {fix}")
    elif not ok:
        message = (f"does not fit: no {strat} plan fits the {mem - fixed} bytes left for "
                   "activations; shorten the sequence or the micro-batch, or add memory")
    else:
        message = (f"does not fit within {cap:.0%} recompute overhead: the least is "
                   f"{plan.predicted.overhead:.1%}; allow more overhead or add memory")
    pred = plan.predicted if (ok and plan is not None) else None
    D = lw.optimal_flops_for_params(N) / (FLOPS_PER_PARAM_TOKEN * N)
    time_s = _training_time(N, D, pred.overhead, n_devices, peak, util) if pred else None
    return MemoryFit(
        **sizing(lw, "fits", N, D, warnings=notes),
        fits=fits, message=message, device_memory_bytes=mem, n_devices=n_devices,
        n_layer=shape.n_layer, d_model=shape.d_model, n_head=shape.n_head,
        shape_params=float(shape.params), seq_len=seq_len, micro_batch=micro_batch,
        precision=policy.name, zero_stage=zero_stage, strategy=strat, max_overhead=cap,
        fixed_bytes_per_device=fixed, activation_budget_bytes=mem - fixed,
        peak_bytes=pred.peak_bytes if pred else None,
        total_peak_bytes=fixed + pred.peak_bytes if pred else None,
        recompute_overhead=pred.overhead if pred else None,
        checkpoints=len(plan.checkpoints) if pred else None,
        largest_micro_batch=mb, largest_seq_len=sl, peak_flops=peak, utilization=util,
        training_time_s=time_s, training_days=None if time_s is None else time_s / 86400,
    )
