"""The web page (`GET /`, its assets under `/ui/`) and the API it needs beyond the others:
`GET /v1/examples[/{name}]` (the example profiles shipped in the package) and
`POST /v1/plans/timeline` (a plan with its memory timeline, `memplan.planner.timeline`).

NOTE [ The page stays on its server ]
Every asset is a file of this package (service/static/: HTML, CSS, plain JavaScript; no build
step, no CDN), and the page is served with a Content-Security-Policy allowing only its own origin
(`default-src 'self'`), so the browser refuses any request elsewhere even if a file asked for one;
the browser test checks both. The page and its assets need no API key (they hold no data); every
`/v1` call the page makes sends the key as the API expects it (service/deps.py).
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, Response
from memplan.planner.schema import Plan, PlanError
from memplan.planner.timeline import PlanTimeline, plan_timeline
from memplan.profiler.schema import ProfileError, load_profile
from memplan.service.deps import SettingsDep, body_openapi, json_body, require_api_key
from memplan.service.problems import (
    ProblemError,
    call_library,
    problem_responses,
)
from memplan.service.routers.plans import (
    PlanRequest,
    check_stages,
    check_work,
    plan_problem,
    run_bounded,
)
from pydantic import BaseModel, Field

from memplan import planner

__all__ = ["router", "STATIC_DIR", "CSP", "TimelineResponse", "ExampleInfo"]

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
EXAMPLES_DIR = STATIC_DIR / "examples"

# NOTE [ The page stays on its server ]: only this origin; data: images for the screenshots' canvas
CSP = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
_MEDIA = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".js": "text/javascript; charset=utf-8", ".json": "application/json",
          ".svg": "image/svg+xml", ".png": "image/png", ".ico": "image/x-icon"}

page_router = APIRouter(include_in_schema=False)
api_router = APIRouter(tags=["ui"], dependencies=[Depends(require_api_key)])


@page_router.get("/")
def index() -> HTMLResponse:
    """The page (no key needed: it holds no data; its API calls send the key)."""
    return HTMLResponse((STATIC_DIR / "index.html").read_text(encoding="utf-8"), headers=_HEADERS)


@lru_cache(maxsize=1)
def _assets() -> dict[str, Path]:
    """Asset name -> file: exactly the files shipped under static/ (no path is built from input)."""
    return {p.relative_to(STATIC_DIR).as_posix(): p for p in STATIC_DIR.rglob("*")
            if p.is_file() and p.suffix in _MEDIA}


@page_router.get("/ui/{name:path}")
def asset(name: str) -> Response:
    """A file of the page (404 for anything not shipped)."""
    path = _assets().get(name)
    if path is None:
        raise ProblemError(404, f"no asset {name!r} on this server", kind="not-found")
    return FileResponse(path, media_type=_MEDIA[path.suffix], headers=_HEADERS)


class ExampleInfo(BaseModel):
    """One example profile shipped with memplan."""

    name: str = Field(description="pass to GET /v1/examples/{name}")
    profile_name: str
    n_stages: int
    fixed_bytes: int = Field(description="bytes")
    store_all_time_s: float = Field(description="seconds of one unplanned step")


@lru_cache(maxsize=1)
def _examples() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(EXAMPLES_DIR.glob("*.json")):
        out[path.stem] = json.loads(path.read_text(encoding="utf-8"))
    return out


@api_router.get("/v1/examples", response_model=list[ExampleInfo], summary="The example profiles",
                responses=problem_responses(401))
def list_examples() -> list[ExampleInfo]:
    out = []
    for name, raw in _examples().items():
        prof = load_profile(raw)
        out.append(ExampleInfo(
            name=name, profile_name=prof.name, n_stages=prof.n_stages, fixed_bytes=prof.fixed_bytes,
            store_all_time_s=sum(la.forward_s + la.backward_s for la in prof.layers),
        ))
    return out


@api_router.get("/v1/examples/{name}", summary="An example profile (a Profile)",
                responses={200: {"description": "the profile",
                                 "content": {"application/json": {"schema": {"type": "object"}}}},
                           **problem_responses(401, 404, 422)})
def get_example(name: Annotated[str, PathParam(min_length=1, max_length=64)]) -> Response:
    raw = _examples().get(name)
    if raw is None:
        raise ProblemError(404, f"no example {name!r}; GET /v1/examples lists them", kind="not-found")
    return Response(json.dumps(raw), media_type="application/json")


class TimelineResponse(BaseModel):
    """A plan and, when it has a schedule, its memory timeline."""

    plan: Plan
    timeline: PlanTimeline | None = Field(default=None, description="null when the plan is infeasible")


def _plan_with_timeline(body: PlanRequest) -> bytes:
    try:
        plan = call_library(planner.plan_for, body, value_errors=False)
        timeline = call_library(plan_timeline, body.profile, plan) if plan.schedule else None
    except (PlanError, ProfileError) as err:
        raise plan_problem(err, body) from None
    return TimelineResponse(plan=plan, timeline=timeline).model_dump_json().encode()


_parse = json_body(PlanRequest)


@api_router.post(
    "/v1/plans/timeline",
    response_model=TimelineResponse,
    summary="A plan and its memory timeline (bytes during each op of its schedule)",
    description="The body is POST /v1/plans' body; the `plan` is the same Plan, and `timeline` "
    "its replay op by op (`memplan.planner.timeline.plan_timeline`), null when infeasible.",
    responses=problem_responses(401, 413, 415, 422, 500, 503),
    openapi_extra=body_openapi(PlanRequest),
)
async def create_timeline(request: Request, settings: SettingsDep) -> Response:
    # the plan route's limits: stages, estimated work, concurrency and time (service/routers/plans.py)
    body = await _parse(request)
    check_stages(body.profile, settings.max_stages)
    check_work(body, settings)
    return Response(await run_bounded(request, settings, _plan_with_timeline, body),
                    media_type="application/json")


router = APIRouter()
router.include_router(page_router)
router.include_router(api_router)
