"""A plan's measured memory timeline: the bytes allocated during each op of one training step,
beside the replay's prediction (`memplan.planner.timeline.PlanTimeline`), and on CUDA the
allocator's history of that step as a snapshot for PyTorch's memory viewer.

NOTE [ Measuring op by op ]
The step runs inside one `memplan.profiler.memory.measure_memory` block, and the runner's
`op_context` marks each op's start (`meter.mark`), so the meter's phase k is op k: its peak,
relative to the block's start, plus the bytes of the input a_0 (allocated before the block, and
counted by the replay as live throughout) is what the replay calls "bytes live during op k". On
the CPU that is the exact allocation accounting (NOTE [ CPU memory accounting ]); on CUDA each mark
synchronises and reads the caching allocator's counters, so the per-op numbers are as exact as the
run's peak is. The steps before the measured one warm the state (lazily initialised observers,
the loss buffer); parameter gradients are allocated before them, as `run_plan` does, so the
measured step allocates only what the schedule does. The optimizer does not step: the timeline
is the schedule's, and the schedule's memory does not depend on the parameters' values.

With `snapshot`, on CUDA, `torch.cuda.memory._record_memory_history` records every allocation of
the measured step with its stack, and `_dump_snapshot` writes the pickle that
https://pytorch.org/memory_viz opens; on the CPU there is no allocator history to record, and the
timeline itself (JSON) is what the run keeps.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from memplan.executor.report import ExecutorError
from memplan.executor.run import check_plan, device_of, policy_recompute
from memplan.executor.runner import ScheduleRunner
from memplan.planner.schema import Op, Plan
from memplan.planner.timeline import PlanTimeline, plan_timeline
from memplan.profiler.schema import Profile
from memplan.profiler.tensors import storage_bytes, unique_params
from torch import nn

__all__ = ["measure_timeline", "builtin_timeline", "save_timeline"]

log = logging.getLogger(__name__)

SNAPSHOT_MAX_ENTRIES = 200_000  # allocator events kept in a snapshot (one step of a large model fits)


@contextlib.contextmanager
def _history(device: torch.device, snapshot: Path | None) -> Iterator[None]:
    """Record the CUDA allocator's history inside the block and dump it to `snapshot`."""
    if snapshot is None or device.type != "cuda":
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES)
    try:
        yield
        torch.cuda.memory._dump_snapshot(str(snapshot))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def measure_timeline(
    stages: Sequence[nn.Module],
    example_input: Any,
    plan: Plan | dict | str,
    profile: Profile | dict | str,
    *,
    warmup: int = 1,
    autocast_dtype: torch.dtype | None = None,
    snapshot: str | Path | None = None,
) -> PlanTimeline:
    """Run `plan`'s schedule over `stages` (`warmup` steps, then one measured step) and measure
    the bytes live during each op.

    Returns the plan's `PlanTimeline` (bytes, seconds) with `measured_bytes` filled in, counted as
    the replay counts (above fixed memory, a_0 included); NOTE [ Measuring op by op ]. With
    `snapshot` (a file path) on CUDA, the measured step's allocator history is written there
    and named in the timeline's `snapshot`; on the CPU no snapshot is written. Raises
    `ExecutorError` when the plan does not fit the stages or profile (see `check_plan`)."""
    plan, prof = check_plan(stages, plan, profile)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ExecutorError(f"warmup: expected an integer of at least 0, got {warmup!r}")
    from memplan.profiler.memory import measure_memory

    stages = list(stages)
    device = device_of(stages, example_input)
    params = [p for p in unique_params(stages) if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    runner = ScheduleRunner(stages, plan.ops(), device=device, autocast_dtype=autocast_dtype,
                            storage=plan.checkpoint_dtypes, policies=policy_recompute(plan, prof))
    scale = 2.0**10 if autocast_dtype is torch.float16 else None
    for _ in range(warmup):
        runner.prepare()
        runner.step(example_input, loss_scale=scale)
        for p in params:
            p.grad.zero_()
    runner.prepare()
    snap = Path(snapshot) if snapshot is not None else None

    with _history(device, snap), measure_memory(device) as meter:

        @contextlib.contextmanager
        def mark(k: int, op: Op) -> Iterator[None]:
            meter.mark(f"op {k}")
            yield

        runner.step(example_input, loss_scale=scale, op_context=mark)
    for p in params:
        p.grad.zero_()
    a0 = storage_bytes([example_input])
    measured = [meter.phases[f"op {k}"].peak_bytes + a0 for k in range(len(plan.schedule))]
    timeline = _predicted(prof, plan)
    kept = snap.name if snap is not None and device.type == "cuda" else None
    if snap is not None and kept is None:
        log.info("no allocator snapshot on %s (CUDA only); the timeline JSON is the record", device)
    return timeline.model_copy(update={"measured_bytes": measured, "measured_device": str(device),
                                       "snapshot": kept})


def _predicted(prof: Profile, plan: Plan) -> PlanTimeline:
    """The replay's timeline of `plan`, its stages recorded under `plan.stage_policies`: the
    profile with each stage's policy as its record (`Profile.with_policies`), so the bytes per op
    are the replay's under the policies whether or not `plan_timeline` reads them."""
    if not plan.stage_policies:
        return plan_timeline(prof, plan)
    return plan_timeline(prof.with_policies(plan.stage_policies),
                         plan.model_copy(update={"stage_policies": {}}))


def builtin_timeline(spec: Any, profile: Profile, plan: Plan, *,
                     snapshot: str | Path | None = None) -> PlanTimeline:
    """`measure_timeline` for a built-in model of `memplan.executor.pipeline.RunSpec` `spec`, as
    `run_builtin` built it (the same seed, the same features), for the plan it made.

    Returns the `PlanTimeline` with measured bytes per op (bytes above fixed memory)."""
    from memplan.executor.features import apply_features
    from memplan.executor.pipeline import _build

    stages, x = _build(spec)
    apply_features(stages, spec.features)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(spec.autocast_dtype or "")
    return measure_timeline(stages, x, plan, profile, autocast_dtype=dtype, snapshot=snapshot)


def save_timeline(timeline: PlanTimeline, path: str | Path) -> Path:
    """Write `timeline` as JSON (`memplan-timeline/1`) at `path`. Returns the path."""
    path = Path(path)
    path.write_text(timeline.model_dump_json(indent=1) + "\n", encoding="utf-8")
    return path


def keeping(run_builtin: Callable[..., tuple], kept: dict[str, Any]) -> Callable[..., tuple]:
    """`run_builtin`, wrapped to keep the profile and the plan it made in `kept` (keys 'profile'
    and 'plan'), so that the same plan can be measured op by op afterwards (`plot_run`)."""

    def run(spec: Any, **kwargs: Any) -> tuple:
        out = run_builtin(spec, **kwargs)
        kept["profile"], kept["plan"] = out[1], out[2]
        return out

    return run


def plot_run(spec: Any, profile: Profile, plan: Plan, png: str | Path) -> list[Path]:
    """Measure `plan` op by op on the built-in model of `spec` (`builtin_timeline`) and keep it:
    the PNG of predicted against measured bytes at `png`, the timeline as JSON beside it
    (`<stem>.timeline.json`) and, on CUDA, the allocator snapshot (`<stem>.snapshot.pickle`, for
    https://pytorch.org/memory_viz). Returns the paths written."""
    from memplan.planner.timeline_plot import plot_timeline

    png = Path(png)
    on_cuda = str(spec.device).startswith("cuda")
    snap = png.with_name(png.stem + ".snapshot.pickle") if on_cuda else None
    timeline = builtin_timeline(spec, profile, plan, snapshot=snap)
    out = [plot_timeline(timeline, png), save_timeline(timeline, png.with_name(png.stem + ".timeline.json"))]
    if snap is not None and snap.exists():
        out.append(snap)
    return out
