"""The FastAPI application: `uvicorn service.app:app`, or `memplan serve`.

It translates HTTP to library calls and back, and nothing more: plans come from `memplan.planner.plan`,
sizing from `memplan.planner.scaling`, profiles and runs from the profiler and executor via the job worker.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from memplan.service.jobs.store import JobStore
from memplan.service.jobs.supervisor import WorkerSupervisor
from memplan.service.limits import BodyLimitMiddleware
from memplan.service.problems import Problem, install_problem_handlers
from memplan.service.routers import capacity, health, plans, profiles, runs, sizing, sweeps, ui
from memplan.service.settings import Settings, get_settings

__all__ = ["app", "create_app", "HeadMiddleware"]

log = logging.getLogger(__name__)



def create_app(settings: Settings | None = None) -> FastAPI:
    """A new application for `settings` (default: from the environment)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.store = JobStore(settings.db_path)
        supervisor = None
        if settings.start_worker:
            supervisor = WorkerSupervisor(settings)
            supervisor.start()
        app.state.supervisor = supervisor
        log.info("memplan service: store %s, worker %s", settings.db_path, "on" if supervisor else "off")
        # the start-up objects (FastAPI, pydantic schemas, numpy, ...) live for the whole process:
        # move them out of the collector's reach, so that full collections stay short under load
        gc.freeze()
        try:
            yield
        finally:
            if supervisor is not None:
                supervisor.stop()
            pool = getattr(app.state, "plan_pool", None)  # planning processes (service/compute.py)
            if pool is not None:
                pool.close()
            app.state.store.close()

    from importlib import metadata

    try:
        version = metadata.version("memplan")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        version = "0+unknown"

    app = FastAPI(
        title="memplan",
        version=version,
        summary="Plan activation checkpointing, size models, and prove plans by running them.",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.settings = settings
    app.state.started_at = time.time()  # health's uptime reads it here (no import of this module)
    install_problem_handlers(app)
    for module in (health, plans, sizing, capacity, profiles, runs, sweeps, ui):
        app.include_router(module.router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(HeadMiddleware, app_routes=app.router.routes)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


class HeadMiddleware:
    """HEAD on a GET route answers as GET without the body (RFC 9110: HEAD is GET's headers).
    FastAPI routes list only the methods they declare, so HEAD was a 405 on every GET route; the
    OpenAPI document keeps listing GET only."""

    def __init__(self, app: Any, *, app_routes: list) -> None:
        self.app = app
        self.routes = app_routes

    def _get_route(self, scope: dict) -> bool:
        from starlette.routing import Match

        probe = {**scope, "method": "GET"}
        return any(route.matches(probe)[0] is Match.FULL for route in self.routes)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or not self._get_route(scope):
            await self.app(scope, receive, send)
            return
        # NOTE [ HEAD ends at the headers ]
        # HEAD answers as soon as the GET's headers are out: the first body message is replaced by
        # an empty final one, and a GET that means to stream on (more_body: the SSE stream of an
        # unfinished job, which polls until the job ends) is cancelled there. Dropping its chunks
        # while it ran on held the keep-alive connection for the job's whole life.
        with anyio.CancelScope() as scope_of_get:
            ended = False

            async def headers_only(message: dict) -> None:
                nonlocal ended
                if message["type"] != "http.response.body":
                    await send(message)
                    return
                if ended:
                    return
                ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                if message.get("more_body"):
                    scope_of_get.cancel()

            await self.app({**scope, "method": "GET"}, receive, headers_only)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the `Problem` schema that every error response refers to."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in problem.pop("$defs", {}).items():
        comps.setdefault(name, sub)
    comps["Problem"] = problem
    from memplan.service.deps import BODY_MODELS
    from pydantic.json_schema import models_json_schema

    _, bodies = models_json_schema(
        [(m, "validation") for m in BODY_MODELS.values()], ref_template="#/components/schemas/{model}"
    )
    for name, sub in bodies.get("$defs", {}).items():
        comps.setdefault(name, sub)
    from memplan.service.problems import problem_responses

    for ops in schema.get("paths", {}).values():
        for op in ops.values():
            responses = op.get("responses", {})
            if "HTTPValidationError" in str(responses.get("422", "")):
                responses["422"] = problem_responses(422)[422]
    comps.pop("HTTPValidationError", None)
    comps.pop("ValidationError", None)
    app.openapi_schema = schema
    return schema


app = create_app()
