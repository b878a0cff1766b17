"""What the job resources (runs, profiles) share: submit with idempotency and a queue limit, read,
list, cancel, wait (`Prefer: wait=N`), stream events (server-sent events) and serve the files a job
kept (its artifacts); and the parameters their submit and list endpoints take, as one dependency
each (`SubmissionDep`, `JobPageDep`)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from memplan.service.deps import IdempotencyKey, PreferWait, SettingsDep, StoreDep
from memplan.service.jobs.admission import AdmissionError, admit
from memplan.service.jobs.artifacts import check_name
from memplan.service.jobs.store import (
    TERMINAL_STATES,
    IdempotencyConflict,
    Job,
    JobState,
    JobStore,
    QueueFull,
)
from memplan.service.problems import FieldError, ProblemError
from memplan.service.settings import Settings
from pydantic import BaseModel, Field

__all__ = ["JobList", "submit", "check_admission", "get_or_404", "list_jobs", "cancel", "stream_events",
           "artifact_response", "MAX_WAIT_S", "Submission", "SubmissionDep", "JobPage", "JobPageDep"]

MAX_WAIT_S = 60.0
# a number with its exponent: `wait=1e400` is a wait past the limit (60 s), not `wait=1`
_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)", re.IGNORECASE)


class JobList(BaseModel):
    """A page of jobs, newest first."""

    items: list[Job]
    next_before: float | None = Field(
        default=None, description="pass as `before` for the next page; null on the last page"
    )


def _wait_s(prefer: str | None) -> float:
    if not prefer:
        return 0.0
    m = _WAIT.search(prefer)
    return min(MAX_WAIT_S, float(m.group(1))) if m else 0.0


async def _await_terminal(store: JobStore, job: Job, wait_s: float, poll_s: float) -> Job:
    deadline = time.monotonic() + wait_s
    while job.state not in TERMINAL_STATES and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
        job = store.get(job.id) or job
    return job


def _job_response(job: Job, *, location: str, created: bool, waited: bool) -> JSONResponse:
    done = job.state in TERMINAL_STATES
    headers = {"Location": location}
    if waited:
        headers["Preference-Applied"] = "wait"
    status = 200 if (done and (waited or not created)) else 202
    if status == 202:
        headers["Retry-After"] = "1"
    return JSONResponse(job.model_dump(mode="json"), status_code=status, headers=headers)


def check_admission(kind: str, request: dict[str, Any], store: JobStore, settings: Settings, *,
                    model_prefix: str = "body", job_path: str | None = None) -> None:
    """`admission.admit` for a job of `kind` with the server's job function (or `job_path`), its
    refusals as 422 problems naming the field (NOTE [ The estimate of a job ] in admission.py)."""
    from memplan.service.backends import job_function

    worker = store.live_worker(stale_s=max(settings.worker_stale_s, 3600.0))
    try:
        admit(kind, request, settings, job_path=job_path or job_function(kind, settings),
              worker_device=(worker or {}).get("device"), model_prefix=model_prefix)
    except AdmissionError as err:
        raise ProblemError(
            422, str(err), kind=err.kind, errors=[FieldError(field=err.field, message=err.message)]
        ) from None


async def submit(
    *,
    kind: str,
    body: BaseModel,
    base_path: str,
    store: JobStore,
    settings: Settings,
    idempotency_key: str | None,
    prefer: str | None,
) -> JSONResponse:
    """Accept a job: 202 with Location (200 when `Prefer: wait=N` saw it finish). The same
    Idempotency-Key with the same body returns the same job; with another body, 422."""
    if idempotency_key is not None and not (1 <= len(idempotency_key) <= 255):
        raise ProblemError(
            422,
            "Idempotency-Key: must be 1 to 255 characters",
            kind="validation",
            errors=[FieldError(field="header.Idempotency-Key", message="1 to 255 characters")],
        )
    request = body.model_dump(mode="json")
    await run_in_threadpool(check_admission, kind, request, store, settings)
    try:
        job, created = store.submit(
            kind, request, idempotency_key=idempotency_key, max_depth=settings.max_queue_depth
        )
    except IdempotencyConflict:
        msg = "this Idempotency-Key was used before with a different body; use a new key"
        raise ProblemError(
            422, msg, kind="idempotency-key-reused",
            errors=[FieldError(field="header.Idempotency-Key", message=msg)],
        ) from None
    except QueueFull as full:
        raise ProblemError(
            429,
            f"{full.depth} jobs are queued or running (limit {settings.max_queue_depth}, "
            f"MEMPLAN_MAX_QUEUE_DEPTH); retry in {full.retry_after_s} s",
            kind="queue-full",
            headers={"Retry-After": str(full.retry_after_s)},
        ) from None
    wait_s = _wait_s(prefer)
    if wait_s > 0:
        job = await _await_terminal(store, job, wait_s, settings.sse_poll_s)
    return _job_response(job, location=f"{base_path}/{job.id}", created=created, waited=wait_s > 0)


@dataclass(frozen=True)
class Submission:
    """What a job submission takes besides its body: the store, the settings and the request's
    `Idempotency-Key` and `Prefer` headers."""

    store: JobStore
    settings: Settings
    idempotency_key: str | None
    prefer: str | None

    async def submit(self, kind: str, body: BaseModel, *, base_path: str) -> JSONResponse:
        """`submit` of a job of `kind` whose resource is at `base_path` (e.g. /v1/runs)."""
        return await submit(kind=kind, body=body, base_path=base_path, store=self.store,
                            settings=self.settings, idempotency_key=self.idempotency_key,
                            prefer=self.prefer)


def _submission(store: StoreDep, settings: SettingsDep, idempotency_key: IdempotencyKey = None,
                prefer: PreferWait = None) -> Submission:
    return Submission(store, settings, idempotency_key, prefer)


SubmissionDep = Annotated[Submission, Depends(_submission)]


@dataclass(frozen=True)
class JobPage:
    """A list request's filter and page: jobs in `state` (None: any), at most `limit`, created
    before `before` (a created_at cursor, seconds since the epoch; None: the newest)."""

    store: JobStore
    state: JobState | None
    limit: int
    before: float | None

    def jobs(self, kind: str) -> JobList:
        """`list_jobs` of `kind` for this page."""
        return list_jobs(self.store, kind=kind, state=self.state, limit=self.limit, before=self.before)


def _job_page(
    store: StoreDep,
    state: Annotated[JobState | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[float | None, Query(ge=0, allow_inf_nan=False, description="created_at cursor")] = None,
) -> JobPage:
    return JobPage(store, state, limit, before)


JobPageDep = Annotated[JobPage, Depends(_job_page)]


def get_or_404(store: JobStore, job_id: str, *, kind: str) -> Job:
    job = store.get(job_id)
    if job is None or job.kind != kind:
        raise ProblemError(404, f"no {kind} with id {job_id!r}", kind="not-found")
    return job


def artifact_response(store: JobStore, job_id: str, name: str) -> Response:
    """The bytes of job `job_id`'s artifact `name` with its media type, as an attachment. A name
    that is not a plain file name: 422 naming `path.name`; an unknown job or artifact: 404 (saying
    why, when the job lists the artifact as absent)."""
    try:
        check_name(name)
    except ValueError as err:
        msg = str(err).removeprefix("name: ")
        raise ProblemError(422, f"path.name: {msg}", kind="validation",
                           errors=[FieldError(field="path.name", message=msg)]) from None
    job = store.get(job_id)
    if job is None:
        raise ProblemError(404, f"no job with id {job_id!r}", kind="not-found")
    found = store.artifact(job_id, name)
    if found is None:
        listed = next((a for a in job.artifacts if a.name == name), None)
        why = (f"job {job_id} did not keep {name!r}: {listed.reason}" if listed is not None and listed.reason
               else f"job {job_id} has no artifact {name!r}; its JSON lists those it has "
                    f"({', '.join(a.name for a in job.artifacts if a.href) or 'none'})")
        raise ProblemError(404, why, kind="not-found")
    media_type, data = found
    return Response(data, media_type=media_type, headers={
        "Content-Disposition": f'attachment; filename="{name}"', "X-Content-Type-Options": "nosniff",
        "Cache-Control": "private, no-cache"})


def list_jobs(
    store: JobStore, *, kind: str, state: JobState | None, limit: int, before: float | None
) -> JobList:
    items = store.list(kind=kind, state=state, limit=limit + 1, before=before)
    more = len(items) > limit
    items = items[:limit]
    return JobList(items=items, next_before=items[-1].created_at if more and items else None)


def cancel(store: JobStore, job_id: str, *, kind: str) -> JSONResponse:
    """200 when the job is cancelled now (or was), 202 when a running job was asked to stop,
    409 when it already finished otherwise."""
    job = get_or_404(store, job_id, kind=kind)
    if job.state in (JobState.succeeded, JobState.failed):
        raise ProblemError(
            409, f"{kind} {job_id} already finished ({job.state.value}); nothing to cancel",
            kind="already-finished", state=job.state.value,
        )
    job = store.request_cancel(job_id) or job
    status = 202 if job.state is JobState.running else 200
    return JSONResponse(job.model_dump(mode="json"), status_code=status)


def _sse(event: str, data: Any, *, event_id: int | None = None) -> bytes:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


async def stream_events(
    request: Request, store: JobStore, job: Job, *, after: int, settings: Settings
) -> StreamingResponse:
    """The job's events as `text/event-stream` from seq > `after` (or Last-Event-ID), ending with an
    `end` event carrying the final job once it has finished."""

    async def gen() -> AsyncIterator[bytes]:
        last = after
        idle_since = time.monotonic()
        yield b"retry: 1000\n\n"
        while True:
            events = store.events(job.id, after=last)
            for ev in events:
                last = ev.seq
                yield _sse(ev.type, ev.data | {"ts": ev.ts}, event_id=ev.seq)
            if events:
                idle_since = time.monotonic()
                continue
            current = store.get(job.id)
            if current is None or current.state in TERMINAL_STATES:
                if not store.events(job.id, after=last):
                    final = current.model_dump(mode="json") if current else {}
                    yield _sse("end", final)
                    return
                continue
            if await request.is_disconnected():
                return
            if time.monotonic() - idle_since >= settings.sse_keepalive_s:
                idle_since = time.monotonic()
                yield b": keep-alive\n\n"
            await asyncio.sleep(settings.sse_poll_s)

    return StreamingResponse(
        gen(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def last_event_id(header: str | None, after: int | None) -> int:
    if after is not None:
        return after
    if header is None:
        return 0
    try:
        return max(0, int(header.strip()))
    except ValueError:
        raise ProblemError(
            422, "Last-Event-ID: expected the integer id of an event", kind="validation",
            errors=[FieldError(field="header.Last-Event-ID", message="an integer event id")],
        ) from None
