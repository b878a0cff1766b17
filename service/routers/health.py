"""`/v1/healthz` (the process answers), `/v1/readyz` (store writable, worker alive), `/v1/info`."""

from __future__ import annotations

import importlib.util
import platform
import time
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Depends, Request
from memplan.service.deps import SettingsDep, StoreDep, require_api_key
from memplan.service.jobs.admission import job_memory_limit
from memplan.service.problems import problem_response, problem_responses
from pydantic import BaseModel, Field

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["health"])


class Health(BaseModel):
    status: str = Field(description="'ok'")


class Readiness(BaseModel):
    status: str = Field(description="'ready' or 'not ready'")
    store_writable: bool
    worker_alive: bool
    worker_pid: int | None = None
    queue_depth: int = Field(ge=0, description="queued plus running jobs")


class Limits(BaseModel):
    """What this server accepts (docs/service.md, Limits)."""

    max_body_bytes: int = Field(description="larger request bodies: 413")
    max_stages: int = Field(description="longest profile a plan accepts")
    max_queue_depth: int = Field(description="unfinished jobs before 429")
    job_timeout_s: float = Field(description="a job running longer fails")
    max_json_depth: int = Field(description="deeper request bodies: 422")
    max_size_bytes: int = Field(description="one byte size of a profile (2^53)")
    max_profile_bytes: int = Field(description="a profile's byte sizes together (2^58)")
    max_budget_bytes: int = Field(description="a budget or a device's memory (2^60)")
    max_seconds: float = Field(description="one time of a profile")
    plan_max_steps: float = Field(description="a plan's estimated work, DP steps; more: 422")
    plan_max_table_bytes: int = Field(description="a plan's estimated tables, bytes; more: 422")
    plan_timeout_s: float = Field(description="a plan not done by then: 503")
    plan_concurrency: int = Field(description="plans computed at once")
    plan_process_min_steps: float = Field(
        description="a plan estimated above this many DP steps runs in a planning process, "
        "killed at the time limit or when its client leaves; smaller ones in a thread"
    )
    plan_processes: int = Field(description="planning processes at most")
    plan_process_max_bytes: int = Field(
        description="address space of one planning process, bytes (0: no limit)"
    )
    plan_kill_grace_s: float = Field(description="SIGTERM to SIGKILL of a stopped planning process")
    job_max_bytes: int | None = Field(
        description="bytes one job may use (its estimate above: 422; its process above: stopped)"
    )
    job_cpu_flops_per_s: float = Field(description="a job's time is estimated at this rate on a CPU")
    job_gpu_flops_per_s: float = Field(description="a job's time is estimated at this rate on a GPU")


class Info(BaseModel):
    """What this server is and what it can do."""

    versions: dict[str, str | None] = Field(description="memplan, python, fastapi, pydantic, torch")
    device: dict[str, Any] | None = Field(
        description="the device jobs run on, as the worker probed it (None until it has)"
    )
    limits: Limits
    auth_required: bool
    strategies: list[str]
    features: dict[str, bool] = Field(
        description="which endpoints have their library in this build: frontier, sizing, fit, "
        "profiles, runs"
    )
    uptime_s: float


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _has(module: str, attr: str | None = None) -> bool:
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):
        return False
    if attr is None:
        return True
    try:
        return hasattr(importlib.import_module(module), attr)
    except Exception:  # noqa: BLE001 - a half-built module counts as missing
        return False


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness: the job store is writable and a worker is alive",
    responses=problem_responses(503),
)
def readyz(settings: SettingsDep, store: StoreDep) -> Any:
    writable = store.writable()
    worker = store.live_worker(stale_s=settings.worker_stale_s)
    body = Readiness(
        status="ready" if writable and worker else "not ready",
        store_writable=writable,
        worker_alive=worker is not None,
        worker_pid=worker["pid"] if worker else None,
        queue_depth=store.depth(),
    )
    if writable and worker:
        return body
    why = []
    if not writable:
        why.append(f"the job store {settings.db_path} is not writable")
    if worker is None:
        why.append(f"no worker has sent a heartbeat in the last {settings.worker_stale_s:g} s")
    return problem_response(
        503, "; ".join(why), instance="/v1/readyz", kind="not-ready", checks=body.model_dump()
    )


@router.get(
    "/info",
    response_model=Info,
    summary="Versions, device and limits",
    dependencies=[Depends(require_api_key)],
    responses=problem_responses(401),
)
def info(request: Request, settings: SettingsDep, store: StoreDep) -> Info:
    from memplan.planner.request import MAX_BUDGET_BYTES
    from memplan.profiler.schema import MAX_BYTES, MAX_PROFILE_BYTES, MAX_SECONDS
    from memplan.service.deps import MAX_JSON_DEPTH

    from memplan import planner

    worker = store.live_worker(stale_s=max(settings.worker_stale_s, 3600.0))
    return Info(
        versions={
            "memplan": _version("memplan"),
            "python": platform.python_version(),
            "fastapi": _version("fastapi"),
            "pydantic": _version("pydantic"),
            "torch": _version("torch"),
        },
        device=worker["device"] if worker else None,
        limits=Limits(
            max_body_bytes=settings.max_body_bytes,
            max_stages=settings.max_stages,
            max_queue_depth=settings.max_queue_depth,
            job_timeout_s=settings.job_timeout_s,
            max_json_depth=MAX_JSON_DEPTH,
            max_size_bytes=MAX_BYTES,
            max_profile_bytes=MAX_PROFILE_BYTES,
            max_budget_bytes=MAX_BUDGET_BYTES,
            max_seconds=MAX_SECONDS,
            plan_max_steps=settings.plan_max_steps,
            plan_max_table_bytes=settings.plan_max_table_bytes,
            plan_timeout_s=settings.plan_timeout_s,
            plan_concurrency=settings.plan_concurrency,
            plan_process_min_steps=settings.plan_process_min_steps,
            plan_processes=settings.plan_processes,
            plan_process_max_bytes=settings.plan_process_max_bytes,
            plan_kill_grace_s=settings.plan_kill_grace_s,
            job_max_bytes=job_memory_limit(settings),
            job_cpu_flops_per_s=settings.job_cpu_flops_per_s,
            job_gpu_flops_per_s=settings.job_gpu_flops_per_s,
        ),
        auth_required=settings.api_key is not None,
        strategies=list(planner.STRATEGIES),
        features={
            "frontier": _has("memplan.planner.frontier"),
            "sizing": _has("memplan.planner.scaling.queries"),
            "fit": _has("memplan.planner.scaling.fit"),
            "profiles": _has("memplan.profiler.models"),
            "runs": _has("memplan.executor.run"),  # found, not imported: no torch in the API
        },
        uptime_s=time.time() - request.app.state.started_at,
    )
