"""`POST /v1/plans` (a Plan for a profile and budget) and `POST /v1/plans/frontier`.

Plans are computed in the request (the planner is pure Python and fast); identical requests are
answered from a small in-memory cache (the planner is deterministic in its inputs).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response
from memplan.planner.checkpoint_dtype import CHOICES as CHECKPOINT_DTYPES
from memplan.planner.schema import Plan, PlanError
from memplan.profiler.schema import Profile, ProfileError
from memplan.service.deps import SettingsDep, body_openapi, json_body, require_api_key
from memplan.service.problems import (
    FieldError,
    ProblemError,
    call_library,
    library_error,
    problem_responses,
)
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool

from memplan import planner

__all__ = ["router", "PlanRequest", "FrontierRequest"]

router = APIRouter(prefix="/v1/plans", tags=["plans"], dependencies=[Depends(require_api_key)])

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)

# the planner's registry decides which strategies exist (the enum follows it)
StrategyName = Literal[tuple(planner.STRATEGIES)]  # type: ignore[valid-type]
OptionValue = StrictBool | StrictInt | StrictFloat | StrictStr | None


class PlanRequest(BaseModel):
    """A profile, a budget and a strategy, as `memplan.planner.plan` takes them."""

    model_config = _STRICT

    profile: Profile
    budget_bytes: int | None = Field(
        default=None, ge=0, description="activation budget above fixed_bytes, bytes; null: no limit"
    )
    strategy: StrategyName | None = Field(  # type: ignore[valid-type]
        default=None, description="planner strategy; null: the planner's default"
    )
    options: dict[str, OptionValue] = Field(
        default_factory=dict,
        description="the strategy's keyword options (e.g. uniform's k); unknown ones: 422",
    )
    checkpoint_dtype: Literal[CHECKPOINT_DTYPES] = Field(  # type: ignore[valid-type]
        default="compute",
        description="storage dtype of kept activations: compute (as computed), auto, or one dtype",
    )
    tolerance: float | None = Field(
        default=None, ge=0,
        description="largest relative gradient error lossy storage may add; null: the policy's own",
    )
    memory_bytes: int | None = Field(
        default=None, ge=0,
        description="memory per GPU instead of budget_bytes: the budget is this minus the fixed bytes",
    )
    n_gpus: int = Field(default=1, ge=1, le=1_000_000, description="data-parallel GPUs")
    zero_stage: int = Field(default=0, ge=0, le=3, description="ZeRO stage sharding model states")


class FrontierRequest(BaseModel):
    """A profile whose memory-time trade-off to trace, as `memplan.planner.frontier` takes it."""

    model_config = _STRICT

    profile: Profile
    options: dict[str, OptionValue] = Field(
        default_factory=dict, description="memplan.planner.frontier's keyword options (e.g. points)"
    )


class _Cache:
    """A small thread-safe LRU of plan JSON keyed by the request's canonical hash."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: str, value: bytes) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


def _cache(request: Request, size: int) -> _Cache:
    cache = getattr(request.app.state, "plan_cache", None)
    if cache is None:
        cache = request.app.state.plan_cache = _Cache(size)
    return cache


def _check_stages(profile: Profile, max_stages: int) -> None:
    if profile.n_stages > max_stages:
        msg = (
            f"{profile.n_stages} stages is over this server's limit of {max_stages} "
            "(MEMPLAN_MAX_STAGES); merge stages or plan locally"
        )
        raise ProblemError(
            422, msg, kind="too-many-stages", errors=[FieldError(field="body.profile.layers", message=msg)]
        )


@router.post(
    "",
    response_model=Plan,
    summary="Plan checkpoints for a profile within a memory budget",
    description="Returns the `Plan` of `memplan.planner.plan`. An infeasible budget is a 200 with "
    "`feasible: false` and the reason in `message`; invalid input is a 422 naming the field.",
    responses=problem_responses(401, 413, 415, 422),
    openapi_extra=body_openapi(PlanRequest),
)
async def create_plan(request: Request, settings: SettingsDep) -> Response:
    # identical bytes, identical plan: answered before parsing (the planner is deterministic)
    key = hashlib.sha256(await request.body()).hexdigest()
    cache = _cache(request, settings.plan_cache_size)
    cached = cache.get(key)
    if cached is None:
        body = await _parse_plan(request)
        _check_stages(body.profile, settings.max_stages)
        cached = await run_in_threadpool(_plan_json, body)
        cache.put(key, cached)
    return Response(cached, media_type="application/json")


_parse_plan = json_body(PlanRequest)


def _plan_json(body: PlanRequest) -> bytes:
    kwargs: dict[str, Any] = dict(body.options)
    if body.strategy is not None:
        kwargs["strategy"] = body.strategy
    try:
        plan = call_library(
            planner.plan, body.profile, budget_bytes=body.budget_bytes, value_errors=False,
            memory_bytes=body.memory_bytes, n_gpus=body.n_gpus, zero_stage=body.zero_stage,
            checkpoint_dtype=body.checkpoint_dtype, tolerance=body.tolerance, **kwargs
        )
    except ProblemError:
        raise
    except (PlanError, ProfileError) as err:
        raise library_error(err, prefix="body.options" if _is_option_error(err, body) else "body") from None
    except TypeError as err:
        # an option of the right name but the wrong type reaches the strategy as a TypeError
        raise ProblemError(422, f"options: {err}", kind="invalid-input") from None
    return plan.model_dump_json().encode()


def _is_option_error(err: Exception, body: PlanRequest) -> bool:
    name = str(err).split(":", 1)[0]
    return name in body.options


@router.post(
    "/frontier",
    summary="The memory-time frontier of a profile (JSON, or PNG with Accept: image/png)",
    responses={
        200: {
            "description": "the frontier (`memplan.planner.frontier`'s result) or its plot",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "image/png": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        **problem_responses(401, 406, 413, 415, 422, 501),
    },
    openapi_extra=body_openapi(FrontierRequest),
)
def create_frontier(
    body: Annotated[FrontierRequest, Depends(json_body(FrontierRequest))],
    settings: SettingsDep,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    _check_stages(body.profile, settings.max_stages)
    media = _negotiate(accept, ("application/json", "image/png"))
    frontier_fn = getattr(planner, "frontier", None)
    if frontier_fn is None:
        raise ProblemError(
            501, "memplan.planner.frontier is not available in this build of memplan", kind="not-implemented"
        )
    try:
        result = call_library(frontier_fn, body.profile, **body.options)
    except ProblemError:
        raise
    except (PlanError, ProfileError) as err:
        raise library_error(err, prefix="body") from None
    except TypeError as err:
        raise ProblemError(422, f"options: {err}", kind="invalid-input") from None
    if media == "image/png":
        import tempfile
        from pathlib import Path

        from memplan.planner.frontier import plot_frontier

        with tempfile.TemporaryDirectory() as tmp:
            path = plot_frontier(result, Path(tmp) / "frontier.png")
            return Response(Path(path).read_bytes(), media_type="image/png")
    return Response(result.model_dump_json(), media_type="application/json")


def _negotiate(accept: str | None, offered: tuple[str, ...]) -> str:
    """The offered media type the Accept header prefers (RFC 9110 q-values); 406 if none."""
    if not accept:
        return offered[0]
    best: tuple[float, int, str] | None = None
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        q = 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if not (q > 0):
            continue
        for rank, m in enumerate(offered):
            typ, sub = m.split("/")
            if media in (m, f"{typ}/*", "*/*"):
                specificity = 2 if media == m else (1 if media.endswith("/*") and media != "*/*" else 0)
                cand = (q, specificity * 10 - rank, m)
                if best is None or cand > best:
                    best = cand
    if best is None:
        raise ProblemError(
            406, f"Accept: none of {accept!r} is offered here; ask for one of {', '.join(offered)}",
            kind="not-acceptable",
        )
    return best[2]
