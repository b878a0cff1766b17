"""The run report: what a plan cost when it ran, against what the planner predicted.

Plain pydantic data (no torch), so that the service and the CLI can read and write it anywhere.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RunReport", "StepRecord", "ExecutorError", "InfeasiblePlanError", "error_pct",
           "PEAK_TOLERANCE_PCT", "peak_problem"]

# The largest |measured - predicted| activation peak, in percent of the measured one, that a run
# still calls ok. The replay is exact to the byte on the CPU's accounting for the built-in
# families and within 0.02% of max_memory_allocated on an H200 (docs/executor.md); 2% leaves room
# for what the chain model does not price (QAT's fake-quantizer state, allocator rounding on small
# peaks) and still calls a ResNet 2.9% off a mismatch.
PEAK_TOLERANCE_PCT = 2.0

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class ExecutorError(ValueError):
    """Invalid executor input (plan, stages, options); the message names the field and the fix."""


class InfeasiblePlanError(ExecutorError):
    """The plan to run does not fit its budget: nothing to run (the CLI's exit code 1, as for
    `memplan plan`, not bad input's 2). The message names the budget and the least it can meet."""


def peak_problem(measured: int, predicted: int | None, tolerance_pct: float | None) -> str | None:
    """Why a measured peak (bytes) is a mismatch with its prediction: beyond `tolerance_pct`
    percent of the measured peak. None when within it, or when either is unknown."""
    err = error_pct(measured, predicted)
    if tolerance_pct is None or err is None or abs(err) <= tolerance_pct:
        return None
    return (f"peak {measured} B measured, {predicted} B predicted ({err:+.2f}%, beyond the "
            f"{tolerance_pct:g}% tolerance)")


def error_pct(measured: float | None, predicted: float | None) -> float | None:
    """(measured - predicted) / measured in percent; None when either is unknown or measured is 0."""
    if measured is None or predicted is None or measured == 0:
        return None
    return 100.0 * (measured - predicted) / measured


class StepRecord(BaseModel):
    """One training step of the planned run and of the unplanned reference."""

    model_config = _STRICT

    step: int = Field(ge=1)
    loss: float
    reference_loss: float | None = None
    schedule_s: float | None = Field(default=None, ge=0, description="seconds running the schedule (no "
                                     "optimizer step); None for the step whose memory is measured "
                                     "(the profiler's accounting slows it), which is not timed")
    grad_max_abs_diff: float | None = None
    grad_max_rel_diff: float | None = None


class RunReport(BaseModel):
    """A plan run for `steps` training steps, measured and compared.

    Peaks are bytes above fixed memory (parameters, gradients, optimizer state), the step's input
    a_0 included, exactly as `Plan.predicted.peak_bytes` counts them. Errors are
    (measured - predicted) / measured in percent. Gradient differences are against the plain
    (unplanned) forward and backward of a copy of the model from the same state: the largest
    absolute difference of any gradient element, and the largest per-tensor
    max|g - g_ref| / max|g_ref|.
    """

    model_config = _STRICT

    status: Literal["ok", "mismatch"] = Field(
        description="ok: gradients, buffers and loss within tolerance of the unplanned run, and "
        "the measured peak within peak_tolerance_pct of the predicted one"
    )
    message: str = ""
    strategy: str
    n_stages: int = Field(ge=1)
    steps: int = Field(ge=1)
    device: str
    dtype: str = Field(description="compute dtype: float32, or the autocast dtype")
    optimizer: str
    features: list[str] = Field(default_factory=list)
    stage_policies: dict[int, str] = Field(
        default_factory=dict, description="stage i -> the save policy its R ops ran under "
        "(the plan's; docs/chain-model.md section 10.8); stages not listed: 'all'")
    compiled: bool = Field(default=False, description="each stage ran through torch.compile")

    predicted_peak_bytes: int | None = Field(default=None, ge=0)
    measured_peak_bytes: int = Field(ge=0, description="largest bytes allocated above fixed memory")
    peak_error_pct: float | None = None
    predicted_time_s: float | None = Field(default=None, ge=0)
    measured_time_s: float | None = Field(ge=0, description="median schedule seconds over the timed "
                                          "steps; None when no step was timed (steps=1: the one step "
                                          "measures memory)")
    time_error_pct: float | None = None
    predicted_overhead: float | None = Field(default=None, ge=0)
    measured_fixed_bytes: int = Field(
        ge=0, description="parameters, gradients and optimizer state after the run"
    )
    predicted_fixed_bytes: int | None = Field(default=None, ge=0)

    loss: float = Field(description="loss of the first planned step")
    reference_loss: float | None = None
    grad_max_abs_diff: float | None = Field(default=None, description="over all steps")
    grad_max_rel_diff: float | None = Field(default=None, description="over all steps")
    buffer_max_abs_diff: float | None = Field(
        default=None, description="BatchNorm statistics, observers, counters after the last step"
    )
    param_max_abs_diff: float | None = Field(default=None, description="after the last step")
    tolerance: float = Field(description="largest grad_max_rel_diff accepted for this dtype")
    peak_tolerance_pct: float | None = Field(
        default=PEAK_TOLERANCE_PCT, description="largest |peak_error_pct| accepted (None: the peak "
        "is not judged)")

    forward_counts: list[int] = Field(
        default_factory=list, description="per stage 1..L: forwards run in one planned step"
    )
    guard_notes: list[str] = Field(
        default_factory=list, description="what the guards did: RNG, buffers, decisions, hooks"
    )
    notes: list[str] = Field(default_factory=list, description="feature reports, fallbacks")
    step_records: list[StepRecord] = Field(default_factory=list)
    extras: dict[str, Any] = Field(default_factory=dict, description="feature metrics")
