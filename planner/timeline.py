"""A plan's memory timeline: the bytes live during each op of its schedule, each op named, and
each stage's role, as the page, `memplan plan --plot` and a run's measured timeline share it.

Every predicted number is a replay (`memplan.planner.simulate`) of the plan's schedule, with the
plan's checkpoint storage; the format (`memplan-timeline/1`) is plain JSON, so a run can keep its
measured bytes beside the prediction in the same file.
"""

from __future__ import annotations

from typing import Literal

from memplan.planner.schema import Plan, PlanError
from memplan.planner.simulate import simulate
from memplan.profiler.schema import Profile, load_profile
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FORMAT", "StageRole", "PlanTimeline", "plan_timeline", "op_label"]

FORMAT = "memplan-timeline/1"

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)

Role = Literal["stored", "checkpoint", "recomputed"]


class StageRole(BaseModel):
    """What a plan does with one stage."""

    model_config = _STRICT

    stage: int = Field(ge=1, description="1-based stage index")
    name: str
    role: Role = Field(
        description="stored: run forward once with its record kept; checkpoint: its output a_i "
        "is kept from the forward for recomputation; recomputed: run forward more than once"
    )
    forwards: int = Field(ge=0, description="forwards (F or R) of this stage in one step")
    checkpoint: bool = Field(description="its output a_i is a checkpoint (kept, not recorded)")
    checkpoint_dtype: str | None = Field(default=None, description="storage dtype of a_i, if converted")
    saved_bytes: int = Field(ge=0, description="bytes of its record s_i (under its save policy)")
    policy: str = Field(default="all", description="the save policy its recorded forward runs "
                        "under (docs/chain-model.md section 10.8)")
    output_bytes: int = Field(ge=0, description="bytes of its output a_i")


class PlanTimeline(BaseModel):
    """Bytes live during each op of a plan's schedule (above fixed memory), predicted and, for a
    run, measured."""

    model_config = _STRICT

    format: Literal["memplan-timeline/1"] = FORMAT
    profile_name: str
    strategy: str
    n_stages: int = Field(ge=1)
    budget_bytes: int | None = Field(default=None, ge=0, description="the plan's activation budget")
    fixed_bytes: int = Field(ge=0, description="parameters, gradients, optimizer state (bytes)")
    ops: list[str] = Field(description="op labels in schedule order: 'F 3', 'R 3', 'drop 2', "
                           "'loss', 'B 3', 'offload 2', 'fetch 2', 'offload_record 3', "
                           "'fetch_record 3'")
    stage_of_op: list[int] = Field(description="the stage each op acts on; 0 for loss")
    predicted_bytes: list[int] = Field(description="bytes live during each op, a_0 included (the replay)")
    peak_bytes: int = Field(ge=0, description="largest of predicted_bytes")
    peak_op: int = Field(ge=0, description="index of the first op reaching the peak")
    time_s: float = Field(ge=0, description="predicted step time, seconds")
    overhead: float = Field(ge=0, description="recompute seconds / store-all seconds")
    predicted_host_bytes: list[int] | None = Field(
        default=None, description="bytes held in host memory at each op (the replay), for a plan "
        "with transfer ops (offload); None without them")
    host_peak_bytes: int = Field(default=0, ge=0, description="largest of predicted_host_bytes")
    transfer_wait_s: float = Field(default=0.0, ge=0, description="seconds compute waits for "
                                   "host-device copies (in time_s)")
    stages: list[StageRole]
    measured_bytes: list[int] | None = Field(
        default=None, description="a run's measured bytes during each op (same counting), if any"
    )
    measured_device: str | None = Field(default=None, description="where the measured bytes were taken")
    snapshot: str | None = Field(
        default=None, description="file name of the CUDA allocator snapshot kept with the run, if any"
    )


def op_label(op: list | tuple) -> str:
    """'F 3', 'loss', 'offload 2', 'fetch_record 3', ...: how the page and the plots name an op
    (its JSON name and stage, space-separated)."""
    return " ".join(str(x) for x in op)


def plan_timeline(profile: Profile | dict | str, plan: Plan) -> PlanTimeline:
    """The replayed memory timeline of `plan` over `profile` and the role of each stage.

    Returns a `PlanTimeline` (bytes above fixed memory, seconds). Raises `PlanError` when the plan
    has no schedule (infeasible) or its schedule does not replay over the profile. A plan with
    transfer ops replays at its `options["offload_bandwidth"]` (bytes/s)."""
    prof = load_profile(profile)
    if not plan.schedule:
        raise PlanError(f"plan: it has no schedule ({plan.message or 'infeasible'}), so no timeline")
    if plan.n_stages != prof.n_stages:
        raise PlanError(
            f"plan.n_stages: {plan.n_stages} stages, but the profile has {prof.n_stages}; "
            "plan this profile"
        )
    sim = simulate(prof, plan.schedule, storage=plan.checkpoint_dtypes or None,
                   policies=plan.stage_policies or None,
                   offload_bandwidth=plan.options.get("offload_bandwidth"))
    if not sim.valid:
        raise PlanError(f"plan.schedule: {sim.error}")
    counts = sim.forward_counts
    kept = set(plan.checkpoints)
    stages = []
    for i, layer in enumerate(prof.layers, start=1):
        n = counts[i - 1]
        role: Role = "recomputed" if n > 1 else ("checkpoint" if i in kept else "stored")
        stages.append(StageRole(
            stage=i, name=layer.name, role=role, forwards=n, checkpoint=i in kept,
            checkpoint_dtype=plan.checkpoint_dtypes.get(i),
            saved_bytes=layer.policy(plan.stage_policies.get(i, "all")).saved_bytes,
            policy=plan.stage_policies.get(i, "all"),
            output_bytes=layer.output_bytes,
        ))
    fixed = prof.fixed_bytes
    if plan.predicted is not None:
        # a sharded plan prices fixed memory per GPU: the plan's own figure is the one to show
        fixed = plan.predicted.total_peak_bytes - plan.predicted.peak_bytes
    return PlanTimeline(
        profile_name=prof.name,
        strategy=plan.strategy,
        n_stages=prof.n_stages,
        budget_bytes=plan.budget_bytes,
        fixed_bytes=max(0, fixed),
        ops=[op_label(op) for op in plan.schedule],
        stage_of_op=[int(op[1]) if len(op) > 1 else 0 for op in plan.schedule],
        predicted_bytes=list(sim.timeline),
        peak_bytes=sim.peak_bytes,
        peak_op=sim.peak_op,
        time_s=sim.time_s,
        overhead=sim.overhead,
        predicted_host_bytes=list(sim.host_timeline) if sim.host_timeline else None,
        host_peak_bytes=sim.host_peak_bytes,
        transfer_wait_s=sim.transfer_wait_s,
        stages=stages,
    )
