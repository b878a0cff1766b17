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
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

__all__ = [
    "Job",
    "JobEvent",
    "JobState",
    "JobStore",
    "QueueFull",
    "IdempotencyConflict",
    "TERMINAL_STATES",
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
    runner_pid INTEGER
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


def _row_to_job(row: sqlite3.Row) -> Job:
    return Job(
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
    )


class JobStore:
    """One process's handle on the store. Thread-safe (a connection per thread)."""

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._conn().executescript(_SCHEMA)  # idempotent; executescript commits by itself

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
            job_id = uuid.uuid4().hex
            now = time.time()
            db.execute(
                "INSERT INTO jobs (id, kind, state, created_at, request, idempotency_key, body_hash)"
                " VALUES (?, ?, 'queued', ?, ?, ?, ?)",
                (job_id, kind, now, json.dumps(request), idempotency_key, digest),
            )
            self._event(db, job_id, "state", {"state": "queued"})
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_job(row), True

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
        """Move the oldest queued job to running for `worker_id`; None when the queue is empty."""
        with self._tx() as db:
            row = db.execute(
                "SELECT id FROM jobs WHERE state = 'queued' ORDER BY created_at, id LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            now = time.time()
            db.execute(
                "UPDATE jobs SET state = 'running', started_at = ?, attempts = attempts + 1,"
                " worker_id = ?, progress = 0, message = 'started' WHERE id = ?",
                (now, worker_id, row["id"]),
            )
            self._event(db, row["id"], "state", {"state": "running"})
            out = db.execute("SELECT * FROM jobs WHERE id = ?", (row["id"],)).fetchone()
        return _row_to_job(out)

    def set_runner(self, job_id: str, pid: int | None) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET runner_pid = ? WHERE id = ?", (pid, job_id))

    def progress(self, job_id: str, fraction: float, message: str = "") -> None:
        """Record progress of a running job (fraction clipped to 0..1) and log it as an event."""
        fraction = min(1.0, max(0.0, float(fraction))) if fraction == fraction else 0.0
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET progress = ?, message = ? WHERE id = ? AND state = 'running'",
                (fraction, message, job_id),
            )
            if cur.rowcount:
                self._event(db, job_id, "progress", {"progress": fraction, "message": message})

    def finish(
        self,
        job_id: str,
        state: JobState,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, str] | None = None,
        message: str = "",
    ) -> bool:
        """Move a running job to a final state; False if it was not running any more."""
        state = JobState(state)
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET state = ?, result = ?, error = ?, finished_at = ?, message = ?,"
                " progress = CASE WHEN ? = 'succeeded' THEN 1 ELSE progress END, runner_pid = NULL"
                " WHERE id = ? AND state = 'running'",
                (
                    state.value,
                    json.dumps(result) if result is not None else None,
                    json.dumps(error) if error is not None else None,
                    time.time(),
                    message or state.value,
                    state.value,
                    job_id,
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
        goes back to the queue, or fails when it has had `max_attempts` starts. Returns their ids."""
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
                        " runner_pid = NULL, message = 'failed' WHERE id = ?",
                        (now, json.dumps(err), row["id"]),
                    )
                    self._event(db, row["id"], "state", {"state": "failed", "error": err})
                else:
                    db.execute(
                        "UPDATE jobs SET state = 'queued', started_at = NULL, runner_pid = NULL,"
                        " worker_id = NULL, progress = 0,"
                        " message = 're-queued: its worker stopped mid-run' WHERE id = ?",
                        (row["id"],),
                    )
                    self._event(db, row["id"], "state", {"state": "queued", "requeued": True})
        if out:
            log.warning("recovered %d job(s) left running by a dead worker: %s", len(out), out)
        return out

    def requeue(self, job_id: str, *, message: str) -> bool:
        """Give a running job back to the queue without counting the start (a worker stopping)."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET state = 'queued', started_at = NULL, runner_pid = NULL,"
                " worker_id = NULL, progress = 0, attempts = MAX(attempts - 1, 0), message = ?"
                " WHERE id = ? AND state = 'running'",
                (message, job_id),
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

    # -- events ----------------------------------------------------------------------------------

    @staticmethod
    def _event(db: sqlite3.Connection, job_id: str, kind: str, data: dict[str, Any]) -> None:
        db.execute(
            "INSERT INTO events (job_id, ts, type, data) VALUES (?, ?, ?, ?)",
            (job_id, time.time(), kind, json.dumps(data)),
        )

    def log_event(self, job_id: str, kind: str, data: dict[str, Any]) -> None:
        with self._tx() as db:
            self._event(db, job_id, kind, data)

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
