"""`/v1/sweeps`: a grid of model configurations x budgets x strategies x precision policies, one
job per cell (kind 'sweep-cell', run by whichever backend serves the store: the local worker or a
Ray cluster), gathered into one report (`memplan.executor.sweep.gather`) and a plot.

The sweep itself is a row of the `sweeps` table beside the jobs in the same SQLite store (the
system of record): its request and its cells' job ids. Its state is derived from its cells'.
"""

from __future__ import annotations

import json
import re
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse, Response
from memplan.executor.report import ExecutorError
from memplan.executor.sweep import SweepReport, SweepSpec
from memplan.planner.request import Budget
from memplan.service.deps import SettingsDep, StoreDep, body_openapi, json_body, require_api_key
from memplan.service.jobs.store import TERMINAL_STATES, JobState, JobStore, QueueFull
from memplan.service.problems import FieldError, ProblemError, call_library, problem_responses
from memplan.service.routers._jobs import check_admission
from memplan.service.settings import Settings
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

__all__ = ["router", "Sweep"]

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], dependencies=[Depends(require_api_key)])

SweepId = Annotated[str, Path(min_length=1, max_length=64, description="the sweep's id")]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    request TEXT NOT NULL,
    cells TEXT NOT NULL,
    jobs TEXT NOT NULL
);
"""


class Sweep(BaseModel):
    """A sweep: its cells' progress and, once every cell has finished, the gathered report."""

    id: str
    state: JobState = Field(description="queued, running, or once every cell has finished: cancelled "
                            "when any cell was cancelled, else failed when every cell failed, else "
                            "succeeded (`cells` and the report's `failed` count the failed ones)")
    created_at: float
    n_cells: int
    finished: int
    progress: float = Field(ge=0, le=1)
    cells: dict[str, int] = Field(description="cells per state")
    jobs: list[str] = Field(description="the cells' job ids, in grid order")
    request: dict[str, Any]
    report: SweepReport | None = None
    plot_url: str | None = Field(default=None, description="the frontier plot (PNG), once finished")


def _db(store: JobStore) -> sqlite3.Connection:
    conn = sqlite3.connect(store.path, timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.executescript(_SCHEMA)
    return conn


def _load(store: JobStore, sweep_id: str) -> sqlite3.Row:
    conn = _db(store)
    try:
        row = conn.execute("SELECT * FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
    finally:
        conn.close()
    if row is None:
        raise ProblemError(404, f"no sweep with id {sweep_id!r}", kind="not-found")
    return row


def _finished_state(counts: dict[str, int], n_cells: int) -> JobState:
    """The state of a sweep whose cells have all finished, from the cells per state.

    NOTE [ A finished sweep's state ]
    A sweep takes the job states (docs/service.md, Sweeps). Once every cell has finished it is
    `cancelled` when any cell was cancelled (it was cut short), else `failed` when every cell
    failed (there is nothing to report but errors), else `succeeded`: a sweep with some failed
    cells succeeded as a sweep, and says which failed in `cells` (per state) and in its report
    (`failed`, each cell's `state` and `error`). An infeasible budget is a succeeded cell."""
    if counts.get("cancelled"):
        return JobState.cancelled
    if n_cells and counts.get("failed", 0) == n_cells:
        return JobState.failed
    return JobState.succeeded


def _view(store: JobStore, row: sqlite3.Row) -> Sweep:
    from memplan.executor.sweep import gather

    ids = json.loads(row["jobs"])
    reqs = json.loads(row["cells"])
    jobs = [store.get(i) for i in ids]
    counts: dict[str, int] = {}
    for j in jobs:
        key = j.state.value if j else "failed"
        counts[key] = counts.get(key, 0) + 1
    finished = sum(1 for j in jobs if j is None or j.state in TERMINAL_STATES)
    progress = sum(1.0 if (j is None or j.state in TERMINAL_STATES) else j.progress for j in jobs)
    report = None
    if finished == len(jobs):
        state = _finished_state(counts, len(jobs))
        outcomes = [
            (j.state.value, j.result, (j.error.detail if j.error else None)) if j else
            ("failed", None, "the cell's job is missing from the store") for j in jobs
        ]
        report = gather(reqs, outcomes)
    elif counts.get("queued", 0) == len(jobs):
        state = JobState.queued
    else:
        state = JobState.running
    return Sweep(
        id=row["id"], state=state, created_at=row["created_at"], n_cells=len(jobs),
        finished=finished, progress=progress / len(jobs) if jobs else 1.0, cells=counts, jobs=ids,
        request=json.loads(row["request"]), report=report,
        plot_url=f"/v1/sweeps/{row['id']}/plot.png" if report is not None else None,
    )


_BUDGETS = TypeAdapter(Budget)
_INDEX = re.compile(r"\[([0-9]+)\]")


def _check_budgets(body: SweepSpec) -> None:
    """Each of the sweep's budgets held to the bound POST /v1/plans holds a budget to (0..2^60 bytes,
    planner.request.Budget), as a 422 naming `body.budgets_bytes.<k>`."""
    for k, budget in enumerate(body.budgets_bytes):
        try:
            _BUDGETS.validate_python(budget)
        except ValidationError as err:
            msg = str(err.errors(include_url=False)[0]["msg"]).removeprefix("Value error, ")
            msg += "; use null for no limit"
            field = f"body.budgets_bytes.{k}"
            raise ProblemError(422, f"{field}: {msg}", kind="validation",
                               errors=[FieldError(field=field, message=msg)]) from None


def _cells(body: SweepSpec) -> list[dict[str, Any]]:
    """executor.sweep.cells, its refusal of the spec ('models[0].config.features: ...') naming the
    field as the rest of the API does ('models.0.config.features'; call_library adds `body.`)."""
    from memplan.executor.sweep import cells

    try:
        return cells(body)
    except ExecutorError as err:
        raise ValueError(_INDEX.sub(r".\1", str(err))) from None


def _admit_cells(body: SweepSpec, reqs: list[dict[str, Any]], store: JobStore, settings: Settings) -> None:
    """Each model of the grid checked once (its config's bounds, its estimated memory and time,
    as a run's: `_jobs.check_admission`), with the fields named as in the sweep's body. Whatever
    function runs the cells, a sweep's model config means executor.pipeline.RunSpec's settings
    (SweepSpec says so), so it is checked as the built-in cell function's."""
    per_model = len(reqs) // len(body.models)  # cells() walks the models outermost
    for k in range(len(body.models)):
        check_admission("sweep-cell", reqs[k * per_model], store, settings, model_prefix=f"body.models.{k}",
                        job_path="memplan.executor.sweep:sweep_cell")


@router.post(
    "",
    status_code=202,
    response_model=Sweep,
    summary="Submit a sweep (one job per cell of the grid)",
    description="Expands models x budgets_bytes x strategies x precisions into cells, queues one "
    "job per cell and answers 202 with `Location: /v1/sweeps/{id}`. 429 when the queue has no "
    "room for every cell.",
    responses={**problem_responses(401, 413, 415, 422, 429)},
    openapi_extra=body_openapi(SweepSpec),
)
def create_sweep(
    body: Annotated[SweepSpec, Depends(json_body(SweepSpec))],
    store: StoreDep,
    settings: SettingsDep,
) -> JSONResponse:
    _check_budgets(body)
    reqs = call_library(_cells, body)
    _admit_cells(body, reqs, store, settings)
    sweep_id = uuid.uuid4().hex

    def record(db: sqlite3.Connection, ids: list[str]) -> None:
        db.execute("INSERT INTO sweeps (id, created_at, request, cells, jobs) VALUES (?, ?, ?, ?, ?)",
                   (sweep_id, time.time(), body.model_dump_json(), json.dumps(reqs), json.dumps(ids)))

    _db(store).close()  # the sweeps table, before the transaction
    try:
        # NOTE [ One transaction for the room check and the inserts ] (store.py)
        store.submit_many("sweep-cell", reqs, max_depth=settings.max_queue_depth, then=record)
    except QueueFull as full:
        room = max(settings.max_queue_depth - full.depth, 0)
        raise ProblemError(
            429, f"the sweep has {len(reqs)} cells but the queue has room for {room} "
            f"(MEMPLAN_MAX_QUEUE_DEPTH={settings.max_queue_depth}); wait, or split the sweep",
            kind="queue-full", headers={"Retry-After": str(full.retry_after_s)}) from None
    view = _view(store, _load(store, sweep_id))
    return JSONResponse(view.model_dump(mode="json"), status_code=202,
                        headers={"Location": f"/v1/sweeps/{sweep_id}", "Retry-After": "1"})


@router.get("/{sweep_id}", response_model=Sweep, summary="A sweep: progress, then its report",
            responses=problem_responses(401, 404, 422))
def get_sweep(sweep_id: SweepId, store: StoreDep) -> Sweep:
    return _view(store, _load(store, sweep_id))


@router.get(
    "/{sweep_id}/plot.png",
    summary="The sweep's frontier plot",
    response_class=Response,
    responses={200: {"content": {"image/png": {"schema": {"type": "string", "format": "binary"}}}},
               **problem_responses(401, 404, 409, 422)},
)
def sweep_plot(sweep_id: SweepId, store: StoreDep) -> Response:
    from memplan.executor.sweep import plot_sweep

    view = _view(store, _load(store, sweep_id))
    if view.report is None:
        raise ProblemError(409, f"sweep {sweep_id} has {view.n_cells - view.finished} cells to "
                           "finish; the plot comes with the report", kind="not-finished")
    with tempfile.TemporaryDirectory() as tmp:
        path = plot_sweep(view.report, FsPath(tmp) / "sweep.png")
        return Response(path.read_bytes(), media_type="image/png")


@router.post("/{sweep_id}/cancel", response_model=Sweep, summary="Cancel every unfinished cell",
             responses=problem_responses(401, 404, 422))
def cancel_sweep(sweep_id: SweepId, store: StoreDep) -> Sweep:
    row = _load(store, sweep_id)
    for job_id in json.loads(row["jobs"]):
        job = store.get(job_id)
        if job is not None and job.state not in TERMINAL_STATES:
            store.request_cancel(job_id)
    return _view(store, row)
