"""SQLite job store in WAL mode: the system of record for every accepted job.

A job is accepted once its row is committed; from then on it survives any crash of the API, the
worker or the job itself. States: queued -> running -> succeeded | failed | cancelled, and
running -> queued when the worker that ran it died (re-queued, up to `max_attempts` starts).

Each process opens its own connection (SQLite connections must not cross processes); writes are
short transactions, and `BEGIN IMMEDIATE` makes a claim atomic between workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any

from memplan.service.jobs.artifacts import (
    MAX_ARTIFACT_BYTES,
    MAX_JOB_ARTIFACT_BYTES,
    ArtifactInfo,
    check_name,
    media_type_for,
)
from pydantic import BaseModel, Field, PrivateAttr

__all__ = [
    "Job",
    "JobEvent",
    "JobState",
    "JobStore",
    "QueueFull",
    "IdempotencyConflict",
    "TERMINAL_STATES",
    "artifact_href",
    "body_hash",
]

log = logging.getLogger(__name__)


class JobState(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL_STATES = frozenset({JobState.succeeded, JobState.failed, JobState.cancelled})


class JobError(BaseModel):
    """Why a job failed."""

    type: str = Field(description="'invalid-input', 'crashed', 'timeout', 'internal', 'unavailable'")
    detail: str = Field(description="what happened, in a sentence")


class Job(BaseModel):
    """A queued, running or finished job (a validation run or a profile)."""

    id: str
    kind: str = Field(description="'run' or 'profile'")
    state: JobState
    progress: float = Field(ge=0, le=1, description="fraction done, 0..1")
    message: str = Field(default="", description="the latest progress message")
    attempts: int = Field(ge=0, description="times a worker started it")
    cancel_requested: bool = False
    created_at: float = Field(description="Unix seconds")
    started_at: float | None = None
    finished_at: float | None = None
    request: dict[str, Any] = Field(description="the accepted request body")
    result: dict[str, Any] | None = Field(default=None, description="the library's result, as JSON")
    error: JobError | None = None
    artifacts: list[ArtifactInfo] = Field(
        default_factory=list, description="files the job kept (GET the `href`), or could not keep and why: "
        "a run's measured timeline, on CUDA its allocator snapshot (NOTE [ Job artifacts ])")
    _lease: str | None = PrivateAttr(default=None)

    @property
    def lease(self) -> str | None:
        """The attempt token of the current start (None unless running). Worker side only: it is
        never serialized; see NOTE [ Fencing a job's execution ] in JobStore."""
        return self._lease


class JobEvent(BaseModel):
    """One entry of a job's event log (progress, state changes)."""

    seq: int
    job_id: str
    ts: float
    type: str = Field(description="'state', 'progress' or 'log'")
    data: dict[str, Any]


class QueueFull(Exception):
    """The queue holds `limit` unfinished jobs already."""

    def __init__(self, depth: int, retry_after_s: int) -> None:
        super().__init__(f"{depth} jobs queued or running; retry in {retry_after_s} s")
        self.depth = depth
        self.retry_after_s = retry_after_s


class IdempotencyConflict(Exception):
    """An Idempotency-Key reused with a different body."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    progress REAL NOT NULL DEFAULT 0,
    message TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    request TEXT NOT NULL,
    result TEXT,
    error TEXT,
    idempotency_key TEXT,
    body_hash TEXT,
    worker_id TEXT,
    runner_pid INTEGER,
    lease TEXT,
    runner_start INTEGER,
    artifacts TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idem ON jobs(kind, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, created_at);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    ts REAL NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, seq);
CREATE TABLE IF NOT EXISTS artifacts (
    job_id TEXT NOT NULL,
    name TEXT NOT NULL,
    media_type TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    device TEXT
);
"""


def body_hash(body: Any) -> str:
    """SHA-256 of a JSON body in canonical form (sorted keys, no spaces)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# columns added after the first release; `JobStore` adds them to an older store on open
_ADDED_COLUMNS = {"lease": "TEXT", "runner_start": "INTEGER", "artifacts": "TEXT"}


def artifact_href(job_id: str, name: str) -> str:
    """The path an artifact is served at (service/routers/runs.py's jobs router)."""
    return f"/v1/jobs/{job_id}/artifacts/{name}"


def _artifacts(job_id: str, raw: str | None) -> list[ArtifactInfo]:
    out = []
    for entry in json.loads(raw) if raw else []:
        kept = entry.get("size_bytes") is not None
        out.append(ArtifactInfo(**entry, href=artifact_href(job_id, entry["name"]) if kept else None))
    return out


def _row_to_job(row: sqlite3.Row) -> Job:
    job = Job(
        id=row["id"],
        kind=row["kind"],
        state=JobState(row["state"]),
        progress=row["progress"],
        message=row["message"],
        attempts=row["attempts"],
        cancel_requested=bool(row["cancel_requested"]),
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        request=json.loads(row["request"]),
        result=json.loads(row["result"]) if row["result"] is not None else None,
        error=json.loads(row["error"]) if row["error"] is not None else None,
        artifacts=_artifacts(row["id"], row["artifacts"]) if "artifacts" in row.keys() else [],
    )
    job._lease = row["lease"]
    return job


class JobStore:
    """One process's handle on the store. Thread-safe (a connection per thread).

    NOTE [ Fencing a job's execution ]
    Each start of a job (`claim`) draws a new random `lease` (an attempt token); re-queueing,
    recovering or finishing the job clears it. Everything a runner writes (progress, log events,
    its runner pid, its outcome) carries its lease and is applied only while the job is running
    under that same lease, in the same transaction as the check. A runner that outlived its worker
    (an orphan) and whose job was recovered and started again therefore cannot write past the
    new start: its writes change nothing, and its watchdog, seeing the lease gone, ends it. Writes
    without a lease (the API's, the Ray driver's) keep the old rule: the job must be running.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._conn().executescript(_SCHEMA)  # idempotent; executescript commits by itself
        self._migrate()

    # -- connections ---------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = sqlite3.connect(
                self.path, timeout=self._timeout_s, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            # WAL: readers never block the writer; synchronous=FULL: a committed job survives a
            # power cut, not only a process crash (the cost is one fsync per write, fine here).
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
            self._local.pid = os.getpid()
        return conn

    def _migrate(self) -> None:
        with self._tx() as db:
            have = {r["name"] for r in db.execute("PRAGMA table_info(jobs)").fetchall()}
            for name, decl in _ADDED_COLUMNS.items():
                if name not in have:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl}")

    @contextmanager
    def _tx(self, *, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- health ----------------------------------------------------------------------------------

    def writable(self) -> bool:
        """True when a write transaction can be taken and committed now."""
        try:
            with self._tx() as db:
                db.execute("UPDATE workers SET id = id WHERE 0")
            return True
        except sqlite3.Error as err:
            log.warning("job store not writable: %s", err)
            return False

    def integrity_check(self) -> str:
        """SQLite's `PRAGMA integrity_check` ('ok' when the file is sound)."""
        return self._conn().execute("PRAGMA integrity_check").fetchone()[0]

    # -- jobs --------------------------------------------------------------------------------------

    def submit(
        self,
        kind: str,
        request: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        max_depth: int | None = None,
    ) -> tuple[Job, bool]:
        """Accept a job; returns (job, created). With an `idempotency_key` seen before for this kind
        and the same body, returns that job and created=False; with another body raises
        `IdempotencyConflict`. Raises `QueueFull` when `max_depth` unfinished jobs exist."""
        digest = body_hash(request)
        with self._tx() as db:
            if idempotency_key is not None:
                row = db.execute(
                    "SELECT * FROM jobs WHERE kind = ? AND idempotency_key = ?",
                    (kind, idempotency_key),
                ).fetchone()
                if row is not None:
                    if row["body_hash"] != digest:
                        raise IdempotencyConflict(idempotency_key)
                    return _row_to_job(row), False
            if max_depth is not None:
                depth = db.execute(
                    "SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'running')"
                ).fetchone()[0]
                if depth >= max_depth:
                    raise QueueFull(depth, self._retry_after(db, depth))
            job_id = self._insert(db, kind, request, idempotency_key, digest)
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_job(row), True

    def _insert(
        self, db: sqlite3.Connection, kind: str, request: dict[str, Any], key: str | None, digest: str
    ) -> str:
        job_id = uuid.uuid4().hex
        db.execute(
            "INSERT INTO jobs (id, kind, state, created_at, request, idempotency_key, body_hash)"
            " VALUES (?, ?, 'queued', ?, ?, ?, ?)",
            (job_id, kind, time.time(), json.dumps(request), key, digest),
        )
        self._event(db, job_id, "state", {"state": "queued"})
        return job_id

    def submit_many(
        self,
        kind: str,
        requests: list[dict[str, Any]],
        *,
        max_depth: int | None = None,
        then: Callable[[sqlite3.Connection, list[str]], None] | None = None,
    ) -> list[str]:
        """Accept every request as a job of `kind`, or none: returns their ids, in order. Raises
        `QueueFull` when they would take the unfinished jobs past `max_depth`.

        NOTE [ One transaction for the room check and the inserts ]
        The count of unfinished jobs, the inserts and `then(db, ids)` (a row that names the jobs,
        such as a sweep's) run in one BEGIN IMMEDIATE transaction, which holds SQLite's write lock
        from the count on: two callers cannot both see room for their jobs and then both insert."""
        with self._tx() as db:
            if max_depth is not None:
                depth = db.execute(
                    "SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'running')"
                ).fetchone()[0]
                if depth + len(requests) > max_depth:
                    raise QueueFull(depth, self._retry_after(db, depth))
            ids = [self._insert(db, kind, req, None, body_hash(req)) for req in requests]
            if then is not None:
                then(db, ids)
        return ids

    @staticmethod
    def _retry_after(db: sqlite3.Connection, depth: int) -> int:
        # the median duration of recent finished jobs, times the jobs ahead, capped to an hour
        rows = db.execute(
            "SELECT finished_at - started_at FROM jobs WHERE finished_at IS NOT NULL"
            " AND started_at IS NOT NULL ORDER BY finished_at DESC LIMIT 20"
        ).fetchall()
        durations = sorted(r[0] for r in rows if r[0] is not None and r[0] >= 0)
        typical = durations[len(durations) // 2] if durations else 5.0
        return int(min(3600, max(1, round(typical))))

    def get(self, job_id: str) -> Job | None:
        row = self._conn().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_job(row) if row is not None else None

    def list(
        self,
        *,
        kind: str | None = None,
        state: JobState | None = None,
        limit: int = 50,
        before: float | None = None,
    ) -> list[Job]:
        """Jobs newest first, optionally of one kind and state, created before `before`."""
        sql = "SELECT * FROM jobs WHERE 1"
        args: list[Any] = []
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        if state is not None:
            sql += " AND state = ?"
            args.append(JobState(state).value)
        if before is not None:
            sql += " AND created_at < ?"
            args.append(before)
        sql += " ORDER BY created_at DESC, id LIMIT ?"
        args.append(limit)
        return [_row_to_job(r) for r in self._conn().execute(sql, args).fetchall()]

    def depth(self) -> int:
        """Unfinished (queued or running) jobs."""
        return self._conn().execute(
            "SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'running')"
        ).fetchone()[0]

    def request_cancel(self, job_id: str) -> Job | None:
        """Cancel a queued job now, or flag a running one for its worker to stop. Returns the job
        (None if unknown); a finished job is returned unchanged."""
        with self._tx() as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            if row["state"] == "queued":
                db.execute(
                    "UPDATE jobs SET state = 'cancelled', cancel_requested = 1, finished_at = ?,"
                    " message = 'cancelled before it started' WHERE id = ?",
                    (time.time(), job_id),
                )
                self._event(db, job_id, "state", {"state": "cancelled"})
            elif row["state"] == "running":
                db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
                self._event(db, job_id, "log", {"message": "cancel requested"})
            out = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_job(out)

    # -- worker side -----------------------------------------------------------------------------

    def claim(self, worker_id: str) -> Job | None:
        """Move the oldest queued job to running for `worker_id` under a new lease (`Job.lease`);
        None when the queue is empty."""
        with self._tx() as db:
            row = db.execute(
                "SELECT id FROM jobs WHERE state = 'queued' ORDER BY created_at, id LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            now = time.time()
            db.execute(
                "UPDATE jobs SET state = 'running', started_at = ?, attempts = attempts + 1,"
                " worker_id = ?, progress = 0, message = 'started', lease = ?, runner_pid = NULL,"
                " runner_start = NULL, artifacts = NULL WHERE id = ?",
                (now, worker_id, uuid.uuid4().hex, row["id"]),
            )
            db.execute("DELETE FROM artifacts WHERE job_id = ?", (row["id"],))
            self._event(db, row["id"], "state", {"state": "running"})
            out = db.execute("SELECT * FROM jobs WHERE id = ?", (row["id"],)).fetchone()
        return _row_to_job(out)

    @staticmethod
    def _fence(lease: str | None) -> tuple[str, tuple[Any, ...]]:
        """The WHERE clause (and its arguments) a write to a running job adds for `lease`."""
        return (" AND lease = ?", (lease,)) if lease is not None else ("", ())

    def set_runner(
        self, job_id: str, pid: int | None, *, lease: str | None = None, start_ticks: int | None = None
    ) -> bool:
        """Record the process running the job (its pid and start time, in clock ticks since boot,
        which with the pid names one process even after the pid is reused). False when the job is
        not running under `lease` any more."""
        fence, args = self._fence(lease)
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET runner_pid = ?, runner_start = ? WHERE id = ? AND state = 'running'"
                + fence,
                (pid, start_ticks, job_id, *args),
            )
            return bool(cur.rowcount)

    def runners(self, *, exclude_worker: str | None = None) -> list[dict[str, Any]]:
        """The running jobs' recorded runner processes ({'job_id', 'pid', 'start_ticks', 'lease'}),
        leaving out those of `exclude_worker`: what a worker taking over must stop first."""
        rows = self._conn().execute(
            "SELECT id, runner_pid, runner_start, lease FROM jobs WHERE state = 'running'"
            " AND runner_pid IS NOT NULL AND (worker_id IS NULL OR worker_id != ?)",
            (exclude_worker or "",),
        ).fetchall()
        return [{"job_id": r["id"], "pid": r["runner_pid"], "start_ticks": r["runner_start"],
                 "lease": r["lease"]} for r in rows]

    def lease_state(self, job_id: str) -> tuple[str | None, str | None, bool]:
        """(state, lease, cancel_requested) of a job, read in one statement; (None, None, False)
        for an unknown job. A runner's watchdog polls it."""
        row = self._conn().execute(
            "SELECT state, lease, cancel_requested FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        if row is None:
            return None, None, False
        return row["state"], row["lease"], bool(row["cancel_requested"])

    def progress(self, job_id: str, fraction: float, message: str = "", *, lease: str | None = None) -> bool:
        """Record progress of a running job (fraction clipped to 0..1) and log it as an event.
        False (nothing written) when the job is not running under `lease` any more."""
        fraction = min(1.0, max(0.0, float(fraction))) if fraction == fraction else 0.0
        fence, args = self._fence(lease)
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET progress = ?, message = ? WHERE id = ? AND state = 'running'" + fence,
                (fraction, message, job_id, *args),
            )
            if cur.rowcount:
                self._event(db, job_id, "progress", {"progress": fraction, "message": message})
            return bool(cur.rowcount)

    def finish(
        self,
        job_id: str,
        state: JobState,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, str] | None = None,
        message: str = "",
        lease: str | None = None,
    ) -> bool:
        """Move a running job to a final state; False if it was not running any more (or, with a
        `lease`, not under that lease: NOTE [ Fencing a job's execution ])."""
        state = JobState(state)
        fence, args = self._fence(lease)
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET state = ?, result = ?, error = ?, finished_at = ?, message = ?,"
                " progress = CASE WHEN ? = 'succeeded' THEN 1 ELSE progress END, runner_pid = NULL,"
                " runner_start = NULL, lease = NULL WHERE id = ? AND state = 'running'" + fence,
                (
                    state.value,
                    json.dumps(result) if result is not None else None,
                    json.dumps(error) if error is not None else None,
                    time.time(),
                    message or state.value,
                    state.value,
                    job_id,
                    *args,
                ),
            )
            if cur.rowcount:
                data: dict[str, Any] = {"state": state.value}
                if error is not None:
                    data["error"] = error
                self._event(db, job_id, "state", data)
            return bool(cur.rowcount)

    def recover(self, worker_id: str, *, max_attempts: int) -> list[str]:
        """After a worker (re)start holding the worker lock: every job left running by a dead worker
        goes back to the queue, or fails when it has had `max_attempts` starts; its lease ends, so
        a runner still alive from that start can write nothing more. Returns their ids."""
        out: list[str] = []
        with self._tx() as db:
            rows = db.execute(
                "SELECT id, attempts, cancel_requested FROM jobs WHERE state = 'running'"
                " AND (worker_id IS NULL OR worker_id != ?)",
                (worker_id,),
            ).fetchall()
            now = time.time()
            for row in rows:
                out.append(row["id"])
                if row["cancel_requested"]:
                    db.execute(
                        "UPDATE jobs SET state = 'cancelled', finished_at = ?, runner_pid = NULL,"
                        " runner_start = NULL, lease = NULL,"
                        " message = 'cancelled (its worker stopped)' WHERE id = ?",
                        (now, row["id"]),
                    )
                    self._event(db, row["id"], "state", {"state": "cancelled"})
                elif row["attempts"] >= max_attempts:
                    err = {
                        "type": "crashed",
                        "detail": f"its worker died during each of {row['attempts']} starts",
                    }
                    db.execute(
                        "UPDATE jobs SET state = 'failed', finished_at = ?, error = ?,"
                        " runner_pid = NULL, runner_start = NULL, lease = NULL, message = 'failed'"
                        " WHERE id = ?",
                        (now, json.dumps(err), row["id"]),
                    )
                    self._event(db, row["id"], "state", {"state": "failed", "error": err})
                else:
                    db.execute(
                        "UPDATE jobs SET state = 'queued', started_at = NULL, runner_pid = NULL,"
                        " runner_start = NULL, lease = NULL, worker_id = NULL, progress = 0,"
                        " message = 're-queued: its worker stopped mid-run' WHERE id = ?",
                        (row["id"],),
                    )
                    self._event(db, row["id"], "state", {"state": "queued", "requeued": True})
        if out:
            log.warning("recovered %d job(s) left running by a dead worker: %s", len(out), out)
        return out

    def requeue(self, job_id: str, *, message: str, lease: str | None = None) -> bool:
        """Give a running job back to the queue without counting the start (a worker stopping)."""
        fence, args = self._fence(lease)
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET state = 'queued', started_at = NULL, runner_pid = NULL,"
                " runner_start = NULL, lease = NULL, worker_id = NULL, progress = 0,"
                " attempts = MAX(attempts - 1, 0), message = ? WHERE id = ? AND state = 'running'"
                + fence,
                (message, job_id, *args),
            )
            if cur.rowcount:
                self._event(db, job_id, "state", {"state": "queued", "requeued": True})
            return bool(cur.rowcount)

    def note_retry(self, job_id: str, *, message: str) -> bool:
        """A running job started again by its backend (a Ray task retried after its worker died):
        count the start and log it. False if the job is not running."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET attempts = attempts + 1, progress = 0, message = ?"
                " WHERE id = ? AND state = 'running'",
                (message, job_id),
            )
            if cur.rowcount:
                self._event(db, job_id, "log", {"message": message, "retry": True})
            return bool(cur.rowcount)

    def heartbeat(self, worker_id: str, *, device: dict[str, Any] | None = None) -> None:
        """Record that `worker_id` is alive (and, once known, the device it runs jobs on)."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO workers (id, pid, host, started_at, heartbeat_at, device)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET heartbeat_at ="
                " excluded.heartbeat_at, device = COALESCE(excluded.device, workers.device)",
                (
                    worker_id,
                    os.getpid(),
                    os.uname().nodename,
                    now,
                    now,
                    json.dumps(device) if device is not None else None,
                ),
            )
            db.execute("DELETE FROM workers WHERE heartbeat_at < ?", (now - 86400,))

    def live_worker(self, *, stale_s: float) -> dict[str, Any] | None:
        """The most recent worker whose heartbeat is younger than `stale_s`, or None."""
        row = self._conn().execute(
            "SELECT * FROM workers WHERE heartbeat_at >= ? ORDER BY heartbeat_at DESC LIMIT 1",
            (time.time() - stale_s,),
        ).fetchone()
        if row is None:
            return None
        out = dict(row)
        out["device"] = json.loads(out["device"]) if out["device"] else None
        return out

    # -- artifacts -------------------------------------------------------------------------------

    def _record_artifact(self, job_id: str, entry: dict[str, Any], data: bytes | None,
                         lease: str | None) -> ArtifactInfo | None:
        """Replace the artifact `entry["name"]` of a running job (under `lease`) by `entry`, and its
        bytes by `data` (None: none stored). None when the job is not running under `lease`."""
        fence, args = self._fence(lease)
        name = entry["name"]
        with self._tx() as db:
            row = db.execute("SELECT artifacts FROM jobs WHERE id = ? AND state = 'running'" + fence,
                             (job_id, *args)).fetchone()
            if row is None:
                return None
            others = [e for e in (json.loads(row["artifacts"]) if row["artifacts"] else []) if e["name"] != name]
            if data is not None:
                held = sum(e.get("size_bytes") or 0 for e in others)
                if len(data) > MAX_ARTIFACT_BYTES or held + len(data) > MAX_JOB_ARTIFACT_BYTES:
                    entry = {"name": name, "media_type": entry["media_type"],
                             "reason": f"{len(data):,} bytes, over the store's limit of {MAX_ARTIFACT_BYTES:,} "
                                       f"bytes a file and {MAX_JOB_ARTIFACT_BYTES:,} a job ({held:,} held "
                                       "already; service/jobs/artifacts.py)"}
                    data = None
            db.execute("DELETE FROM artifacts WHERE job_id = ? AND name = ?", (job_id, name))
            if data is not None:
                db.execute("INSERT INTO artifacts (job_id, name, media_type, data) VALUES (?, ?, ?, ?)",
                           (job_id, name, entry["media_type"], sqlite3.Binary(data)))
            db.execute("UPDATE jobs SET artifacts = ? WHERE id = ?", (json.dumps([*others, entry]), job_id))
            kept = f"kept {name} ({len(data):,} bytes)" if data is not None else f"no {name}: {entry['reason']}"
            self._event(db, job_id, "log", {"message": kept, "artifact": name})
        return ArtifactInfo(**entry, href=artifact_href(job_id, name) if data is not None else None)

    def keep_artifact(self, job_id: str, name: str, data: bytes, *, media_type: str | None = None,
                      lease: str | None = None) -> ArtifactInfo | None:
        """Keep `data` as the running job's artifact `name` (NOTE [ Job artifacts ]); over the size
        limits it is listed as absent with the reason instead. Returns what the job's JSON now lists
        for it, or None (nothing written) when the job is not running under `lease`. Raises
        ValueError for a name that is not a plain artifact name."""
        check_name(name)
        entry = {"name": name, "media_type": media_type or media_type_for(name), "size_bytes": len(data)}
        return self._record_artifact(job_id, entry, bytes(data), lease)

    def artifact_absent(self, job_id: str, name: str, reason: str, *, lease: str | None = None
                        ) -> ArtifactInfo | None:
        """List artifact `name` of the running job as absent, for `reason` (e.g. no CUDA for an
        allocator snapshot). Returns the entry, or None when the job is not running under `lease`."""
        check_name(name)
        entry = {"name": name, "media_type": media_type_for(name), "reason": str(reason)[:1000]}
        return self._record_artifact(job_id, entry, None, lease)

    def artifact(self, job_id: str, name: str) -> tuple[str, bytes] | None:
        """(media type, bytes) of a job's kept artifact `name`; None when there is none."""
        row = self._conn().execute("SELECT media_type, data FROM artifacts WHERE job_id = ? AND name = ?",
                                   (job_id, name)).fetchone()
        return (row["media_type"], bytes(row["data"])) if row is not None else None

    # -- events ----------------------------------------------------------------------------------

    @staticmethod
    def _event(db: sqlite3.Connection, job_id: str, kind: str, data: dict[str, Any]) -> None:
        db.execute(
            "INSERT INTO events (job_id, ts, type, data) VALUES (?, ?, ?, ?)",
            (job_id, time.time(), kind, json.dumps(data)),
        )

    def log_event(self, job_id: str, kind: str, data: dict[str, Any], *, lease: str | None = None) -> bool:
        """Append an event to the job's log. With a `lease`, only while the job is running under
        it (a runner's lines); returns whether it was written."""
        with self._tx() as db:
            if lease is not None:
                row = db.execute(
                    "SELECT 1 FROM jobs WHERE id = ? AND state = 'running' AND lease = ?", (job_id, lease)
                ).fetchone()
                if row is None:
                    return False
            self._event(db, job_id, kind, data)
            return True

    def events(self, job_id: str, *, after: int = 0, limit: int = 500) -> list[JobEvent]:
        """A job's events with seq > `after`, oldest first."""
        rows = self._conn().execute(
            "SELECT * FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (job_id, after, limit),
        ).fetchall()
        return [
            JobEvent(seq=r["seq"], job_id=r["job_id"], ts=r["ts"], type=r["type"], data=json.loads(r["data"]))
            for r in rows
        ]
