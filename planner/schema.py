"""The plan: a schedule of operations over a profile's chain, and what it is predicted to cost.

A schedule is plain data, a list of ops encoded exactly as docs/chain-model.md does:
`["F", i]`, `["R", i]`, `["drop", i]`, `["loss"]`, `["B", i]`, with i the 1-based stage index, and
the transfer ops of offload (docs/chain-model.md section 10.9): `["offload", i]` and `["fetch", i]`
move a_i between device and host memory, `["offload_record", i]` and `["fetch_record", i]` the
record of stage i. In Python each op is a tuple: `("F", 3)`, `("loss",)`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Op", "Predicted", "Plan", "PlanError", "parse_schedule", "STAGE_OPS", "TRANSFER_OPS",
           "COMPUTE_OPS"]

# ops that name a tensor moved between device and host memory (one stage index each)
TRANSFER_OPS = ("offload", "fetch", "offload_record", "fetch_record")
# every op with one stage index
STAGE_OPS = ("F", "R", "drop", "B") + TRANSFER_OPS
# the ops that run on the compute stream; a transfer op rides on the next one (its window)
COMPUTE_OPS = ("F", "R", "loss", "B")

Op = tuple[str, int] | tuple[str]

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]-]*): (.*)$", re.S)


class PlanError(ValueError):
    """Invalid planner input (profile, budget, options or schedule).

    `field` names the input at fault as a dotted path of the plan request (`budget_bytes`,
    `options.k`, `profile.layers.3.saved_bytes`; None when no one input is), `reason` says what is
    wrong and how to fix it, and `str(err)` is "field: reason". Raised as `PlanError(reason,
    field=...)`; a message already written as "field: reason" gives the same (so the strategies'
    own checks carry their field too)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        if field is None:
            m = _FIELD.match(message)
            if m:
                field, message = m.group(1), m.group(2)
        self.field = field
        self.reason = message
        super().__init__(f"{field}: {message}" if field else message)

    def __reduce__(self):  # pickles (a process pool's result) with its field
        return (_rebuild_plan_error, (self.reason, self.field))


def _rebuild_plan_error(reason: str, field: str | None) -> PlanError:
    return PlanError(reason, field=field)


def _parse_op(raw: Any, k: int) -> Op:
    if not isinstance(raw, (list, tuple)) or not raw:
        raise PlanError(f"schedule[{k}]: expected an op such as [\"F\", 3] or [\"loss\"], got {raw!r}")
    name = raw[0]
    if name == "loss":
        if len(raw) != 1:
            raise PlanError(f"schedule[{k}]: [\"loss\"] takes no stage index, got {list(raw)!r}")
        return ("loss",)
    if name not in STAGE_OPS:
        raise PlanError(
            f"schedule[{k}]: unknown op {name!r}; use one of F, R, drop, B, offload, fetch, "
            "offload_record, fetch_record (with a stage) or loss"
        )
    if len(raw) != 2 or isinstance(raw[1], bool) or not isinstance(raw[1], int):
        raise PlanError(f"schedule[{k}]: [{name!r}, i] needs one integer stage index, got {list(raw)!r}")
    return (name, int(raw[1]))


def parse_schedule(raw: Any) -> list[Op]:
    """Ops as tuples from JSON-like data (lists of lists). Raises `PlanError` naming the bad op.

    Stage ranges are checked by the simulator, which knows the chain's length."""
    if not isinstance(raw, (list, tuple)):
        raise PlanError(f"schedule: expected a list of ops, got {type(raw).__name__}")
    return [_parse_op(op, k) for k, op in enumerate(raw)]


class Predicted(BaseModel):
    """What replaying the schedule predicts for one training step."""

    model_config = _STRICT

    time_s: float = Field(ge=0, description="seconds of forward, recompute and backward")
    peak_bytes: int = Field(ge=0, description="largest bytes live during any op, a_0 included")
    total_peak_bytes: int = Field(ge=0, description="fixed_bytes + peak_bytes")
    recompute_s: float = Field(ge=0, description="seconds above the store-all time (extra forwards)")
    overhead: float = Field(ge=0, description="recompute_s / store-all time")
    host_peak_bytes: int = Field(
        default=0, ge=0, description="largest bytes held in host memory by offload ops at any op "
        "(0 without offload)")
    transfer_wait_s: float = Field(
        default=0.0, ge=0, description="seconds the compute stream waits for host-device copies "
        "(included in time_s; 0 without offload)")


class Plan(BaseModel):
    """A strategy's answer for one profile and budget. Infeasible is a status, not an exception."""

    model_config = _STRICT

    strategy: str
    budget_bytes: int | None = Field(
        default=None, ge=0, description="activation budget (the peak over fixed_bytes); None: none"
    )
    feasible: bool
    message: str = ""
    schedule: list[Annotated[list[str | int], Field(min_length=1, max_length=2)]] = Field(
        default_factory=list, description="ops as the chain model encodes them"
    )
    predicted: Predicted | None = None
    n_stages: int = Field(ge=1)
    profile_fingerprint: str = ""
    checkpoints: list[int] = Field(
        default_factory=list,
        description="stages i whose outputs a_i are kept from the forward for recomputation (live at loss, not pinned by a record)",
    )
    recomputed: list[int] = Field(
        default_factory=list, description="stages run forward more than once"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="strategy options used")
    checkpoint_dtypes: dict[int, str] = Field(
        default_factory=dict,
        description="stage i -> dtype its kept output a_i is stored in (float32, bfloat16, "
        "float8_e4m3fn, ...); stages not listed: as computed (docs/precision.md)",
    )

    stage_policies: dict[int, str] = Field(
        default_factory=dict,
        description="stage i -> the save policy its recorded forward runs under (selective "
        "recompute, docs/chain-model.md section 10.8); stages not listed: 'all'")

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule_form(cls, raw: Any) -> Any:
        return [list(op) for op in parse_schedule(raw)]

    def ops(self) -> list[Op]:
        """The schedule as tuples."""
        return [tuple(op) for op in self.schedule]  # type: ignore[misc]

