"""`POST /v1/plans` (a Plan for a profile and budget) and `POST /v1/plans/frontier`.

The bodies are the planner's own requests (`memplan.planner.request.PlanRequest` and
`FrontierRequest`): validated once, strictly, with every option's bound in the schema. Identical
requests are answered from a small in-memory cache (the planner is deterministic in its inputs).

NOTE [ Plans in the API process ]
1. Each request's work is estimated before any of it runs (`estimate_work`, NOTE [ work
   estimate ] in planner/request.py) and refused with a 422 naming the option that drives it
   when over `plan_max_steps` or `plan_max_table_bytes`.
2. At most `plan_concurrency` plans are computed at once; more wait for a slot.
3. An admitted plan estimated above `plan_process_min_steps` is computed in a planning process
   (service/compute.py, NOTE [ Planning processes ]): at `plan_timeout_s` the process is killed
   and the client gets a 503 with Retry-After; a client that disconnects has its process killed
   too; a crash there is a 500 and the API goes on.
4. Smaller plans (the baselines, short chains: milliseconds) are computed in a thread, where a
   process would cost more than the plan; past `plan_timeout_s` they answer 503 too, and the
   thread runs on to its end, which the threshold keeps near.
5. Both paths run the same function on the same validated request, so they answer the same bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import OrderedDict
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response
from memplan.planner.request import (
    FrontierRequest,
    PlanRequest,
    StrategyName,
    estimate_work,
)
from memplan.planner.schema import Plan, PlanError
from memplan.profiler.schema import Profile, ProfileError
from memplan.service.compute import ClientLeft, ComputePool
from memplan.service.deps import (
    SettingsDep,
    body_openapi,
    check_json_content_type,
    json_body,
    require_api_key,
)
from memplan.service.problems import (
    FieldError,
    ProblemError,
    call_library,
    library_error,
    problem_responses,
)
from memplan.service.settings import Settings
from pydantic import StrictBool, StrictFloat, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool

from memplan import planner

__all__ = ["router", "PlanRequest", "FrontierRequest", "StrategyName", "OptionValue", "plan_problem"]

router = APIRouter(prefix="/v1/plans", tags=["plans"], dependencies=[Depends(require_api_key)])

# (used by the runs and profiles routers for their own configs)
OptionValue = StrictBool | StrictInt | StrictFloat | StrictStr | None


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


def check_work(body: PlanRequest | FrontierRequest, settings: Settings) -> None:
    """422 naming the field that drives the work when `body`'s estimate is over the limits (NOTE
    [ Plans in the API process ])."""
    work = estimate_work(body)
    over = []
    if work.steps > settings.plan_max_steps:
        over.append(f"about {work.steps:.3g} DP steps, over this server's limit of "
                    f"{settings.plan_max_steps:.3g} (MEMPLAN_PLAN_MAX_STEPS)")
    if work.table_bytes > settings.plan_max_table_bytes:
        over.append(f"tables of about {work.table_bytes:.3g} bytes, over this server's limit of "
                    f"{settings.plan_max_table_bytes} (MEMPLAN_PLAN_MAX_TABLE_BYTES)")
    if not over:
        return
    field = f"body.{work.driver}"
    fix = (f"leave out {work.driver} (a host budget multiplies the offload DP's work)"
           if work.driver == "options.host_memory_bytes"
           else f"lower {work.driver} (or give a budget, or fewer groups)")
    msg = f"this plan would need {' and '.join(over)}; {fix}, or plan locally with `memplan plan`"
    raise ProblemError(422, msg, kind="too-much-work", errors=[FieldError(field=field, message=msg)])


async def run_bounded(request: Request, settings: Settings, fn, *args, in_process: bool | None = None):
    """`fn(*args)` under the plan limits (NOTE [ Plans in the API process ]): its value, or a 503
    problem after `plan_timeout_s`. `in_process` chooses a planning process (True) or a thread;
    default: by the work estimate of a PlanRequest or FrontierRequest first argument."""
    state = request.app.state
    sem = getattr(state, "plan_slots", None)
    if sem is None:
        sem = state.plan_slots = asyncio.Semaphore(settings.plan_concurrency)
    if in_process is None:
        in_process = (bool(args) and isinstance(args[0], (PlanRequest, FrontierRequest))
                      and estimate_work(args[0]).steps > settings.plan_process_min_steps)
    async with sem:
        if in_process:
            try:
                return await compute_pool(request, settings).run(
                    fn, *args, timeout_s=settings.plan_timeout_s,
                    disconnected=request.is_disconnected)
            except ClientLeft:
                # nobody reads the answer; the status is for the access log
                raise ProblemError(503, "the client disconnected; its computation was stopped",
                                   kind="client-left") from None
        task = asyncio.ensure_future(run_in_threadpool(fn, *args))
        try:
            return await asyncio.wait_for(asyncio.shield(task), settings.plan_timeout_s)
        except TimeoutError:
            # the thread runs on to its end (near: under the threshold), outside the slots
            task.add_done_callback(lambda t: t.exception())
            raise ProblemError(
                503, f"the plan was not done within this server's {settings.plan_timeout_s:g} s "
                "(MEMPLAN_PLAN_TIMEOUT_S); try again later, or plan locally with `memplan plan`",
                kind="timeout", headers={"Retry-After": str(max(1, int(settings.plan_timeout_s)))},
            ) from None


def compute_pool(request: Request, settings: Settings) -> ComputePool:
    """The app's pool of planning processes (created on first use; its children too)."""
    pool = getattr(request.app.state, "plan_pool", None)
    if pool is None:
        pool = request.app.state.plan_pool = ComputePool(
            settings.plan_processes, max_bytes=settings.plan_process_max_bytes,
            kill_grace_s=settings.plan_kill_grace_s)
    return pool


def check_stages(profile: Profile, max_stages: int) -> None:
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
    "`feasible: false` and the reason in `message`; invalid input is a 422 naming the field, and so "
    "is a request whose estimated work is over the server's limits (`GET /v1/info`: limits).",
    responses=problem_responses(401, 413, 415, 422, 500, 503),
    openapi_extra=body_openapi(PlanRequest),
)
async def create_plan(request: Request, settings: SettingsDep) -> Response:
    # NOTE [ The plan cache ]
    # Identical bytes, identical plan: answered before parsing (the planner is deterministic). Only
    # the parsing is skipped: what is checked of the request itself (the API key, by the router's
    # dependency; the Content-Type, here) is checked first, so that a body the API refuses (415)
    # is refused whether or not the same bytes were planned before.
    check_json_content_type(request)
    key = hashlib.sha256(await request.body()).hexdigest()
    cache = _cache(request, settings.plan_cache_size)
    cached = cache.get(key)
    if cached is None:
        body = await _parse_plan(request)
        check_stages(body.profile, settings.max_stages)
        check_work(body, settings)
        cached = await run_bounded(request, settings, _plan_json, body)
        cache.put(key, cached)
    return Response(cached, media_type="application/json")


_parse_plan = json_body(PlanRequest)


def _plan_json(body: PlanRequest) -> bytes:
    try:
        plan = call_library(planner.plan_for, body, value_errors=False)
    except (PlanError, ProfileError) as err:
        raise plan_problem(err, body) from None
    return plan.model_dump_json().encode()


def plan_problem(err: PlanError | ProfileError, body: PlanRequest) -> ProblemError:
    """The 422 for a library error while planning `body`, naming the field where the request has
    it: a strategy's own check names its option (plan_optimal's "offload_bandwidth: ..."), which
    the request nests under `options`."""
    field = getattr(err, "field", None)
    nested = field is not None and "." not in field and field in type(body.options).model_fields
    return library_error(err, prefix="body.options" if nested else "body")


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
        **problem_responses(401, 406, 413, 415, 422, 500, 503),
    },
    openapi_extra=body_openapi(FrontierRequest),
)
async def create_frontier(
    request: Request,
    body: Annotated[FrontierRequest, Depends(json_body(FrontierRequest))],
    settings: SettingsDep,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    check_stages(body.profile, settings.max_stages)
    media = _negotiate(accept, ("application/json", "image/png"))
    check_work(body, settings)
    result = await run_bounded(request, settings, _frontier, body)
    if media == "image/png":
        import tempfile
        from pathlib import Path

        from memplan.planner.frontier import plot_frontier

        with tempfile.TemporaryDirectory() as tmp:
            path = plot_frontier(result, Path(tmp) / "frontier.png")
            return Response(Path(path).read_bytes(), media_type="image/png")
    return Response(result.model_dump_json(), media_type="application/json")


def _frontier(body: FrontierRequest):
    try:
        return call_library(planner.frontier, body.profile, value_errors=False,
                            **body.options.model_dump(exclude_unset=True))
    except (PlanError, ProfileError) as err:
        raise library_error(err, prefix="body.options"
                            if getattr(err, "field", None) in FrontierRequest.model_fields["options"]
                            .annotation.model_fields else "body") from None


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
