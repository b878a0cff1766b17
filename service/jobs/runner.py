"""One job in one process: `python -m memplan.service.jobs.runner DB JOB_ID --lease T --parent PID`.

The worker starts a runner per job. The runner calls the job's function (`Settings.run_job` or
`Settings.profile_job`, 'module:function', called as `fn(request: dict, ctx: JobContext)`) and
records its result or error in the store. Whatever happens inside (a segfault, the OOM killer,
a CUDA error that poisons the context), the damage ends with this process: the worker records
the crash and the device memory is released when the process exits. That is also how a cancel
frees memory: the worker ends this process.

Everything the runner writes carries the lease of the start it belongs to (NOTE [ Fencing a job's
execution ] in store.py), and a watchdog thread ends it when its worker is gone, its lease has
ended, or a cancel was asked while no worker is there to act on it (NOTE [ The runner's watchdog ]).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from memplan.service.jobs._proc import die_with_parent, import_object, start_ticks
from memplan.service.jobs.store import JobState, JobStore
from memplan.service.settings import Settings

__all__ = ["JobContext", "JobCancelled", "LeaseLost", "run_one", "is_out_of_memory", "main"]

log = logging.getLogger("memplan.runner")


class JobCancelled(BaseException):
    """Raised inside the job function when the worker asks the runner to stop (SIGTERM)."""


class LeaseLost(JobCancelled):
    """Raised inside the job function when its start is no longer the job's current one (the job
    was recovered, re-queued or finished elsewhere): nothing more it writes would be recorded."""


class JobContext:
    """What a job function gets besides its request: progress reporting and the device to use."""

    def __init__(self, store: JobStore, job_id: str, *, device: str | None, lease: str | None = None) -> None:
        self._store = store
        self.job_id = job_id
        self.device = device
        self.lease = lease
        self._last = 0.0

    def progress(self, fraction: float, message: str = "", *, force: bool = False) -> None:
        """Report `fraction` (0..1) done. Throttled to 10 updates a second unless `force`. Raises
        `LeaseLost` when the store refuses the write because this start is no longer current."""
        now = time.monotonic()
        if force or now - self._last >= 0.1 or fraction >= 1.0:
            self._last = now
            if not self._store.progress(self.job_id, fraction, message, lease=self.lease):
                raise LeaseLost()

    def log(self, message: str) -> None:
        """A line in the job's event stream (dropped when this start is no longer current)."""
        self._store.log_event(self.job_id, "log", {"message": message}, lease=self.lease)

    def keep_artifact(self, name: str, data: bytes, media_type: str | None = None) -> Any:
        """Keep `data` as the job's artifact `name` (NOTE [ Job artifacts ] in artifacts.py).
        Returns the `ArtifactInfo` listed for it (absent, with the reason, when over the size
        limits). Raises `LeaseLost` when this start is no longer current."""
        info = self._store.keep_artifact(self.job_id, name, data, media_type=media_type, lease=self.lease)
        if info is None:
            raise LeaseLost()
        return info

    def artifact_absent(self, name: str, reason: str) -> Any:
        """List artifact `name` as absent, saying `reason`. Returns its `ArtifactInfo`. Raises
        `LeaseLost` when this start is no longer current."""
        info = self._store.artifact_absent(self.job_id, name, reason, lease=self.lease)
        if info is None:
            raise LeaseLost()
        return info


_OOM_TEXT = ("can't allocate memory", "cannot allocate memory", "out of memory", "not enough memory")


def is_out_of_memory(err: BaseException) -> bool:
    """True for the ways a job runs out of memory in Python: MemoryError, torch's OutOfMemoryError
    (CUDA), and the CPU allocator's RuntimeError ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    return isinstance(err, RuntimeError) and any(t in str(err).lower() for t in _OOM_TEXT)


def _as_json(result: Any) -> dict[str, Any]:
    if hasattr(result, "model_dump"):
        return result.model_dump(mode="json")
    if isinstance(result, dict):
        return result
    raise TypeError(f"job function returned {type(result).__name__}; return a pydantic model or a dict")


def run_one(store: JobStore, job_id: str, settings: Settings, *, lease: str | None = None) -> JobState:
    """Run job `job_id` (already claimed: state running, under `lease`) and record its outcome;
    returns the state it recorded (running: nothing recorded, the job is its worker's again)."""
    job = store.get(job_id)
    if job is None or job.state is not JobState.running or (lease is not None and job.lease != lease):
        log.warning("job %s is not running under this lease (state %s); nothing to do", job_id, job and job.state)
        return job.state if job else JobState.failed
    path = {"run": settings.run_job, "profile": settings.profile_job,
            "sweep-cell": settings.sweep_cell_job}.get(job.kind)
    ctx = JobContext(store, job_id, device=settings.device, lease=lease)

    def fail(kind: str, detail: str) -> JobState:
        store.finish(job_id, JobState.failed, error={"type": kind, "detail": detail}, message="failed", lease=lease)
        return JobState.failed

    try:
        if path is None:
            raise ValueError(f"kind: no job function for {job.kind!r}")
        fn = import_object(path)
        result = _as_json(fn(job.request, ctx))
    except LeaseLost:
        log.warning("job %s: this start is no longer current; stopping without writing", job_id)
        return JobState.running
    except JobCancelled:
        state, current_lease, cancel = store.lease_state(job_id)
        if cancel and (lease is None or current_lease == lease):
            store.finish(job_id, JobState.cancelled, message="cancelled", lease=lease)
            return JobState.cancelled
        # stopped because the worker is shutting down: leave the job running for the worker to
        # give back to the queue
        return JobState.running
    except MemoryError as err:
        return fail("out-of-memory", f"the job ran out of memory: {type(err).__name__}: {err}")
    except (ValueError, KeyError) as err:
        # the library's input errors (PlanError, ProfileError, ExecutorError are ValueErrors)
        return fail("invalid-input", str(err))
    except ImportError as err:
        return fail("unavailable", f"not available in this build: {err}")
    except Exception as err:  # noqa: BLE001 - a job's bug must end as a failed job, not a crash
        if is_out_of_memory(err):
            return fail("out-of-memory", f"the job ran out of memory: {type(err).__name__}: {err}")
        log.error("job %s failed:\n%s", job_id, traceback.format_exc())
        return fail("internal", f"{type(err).__name__}: {err}")
    store.finish(job_id, JobState.succeeded, result=result, message="done", lease=lease)
    return JobState.succeeded


def _kill_own_group() -> None:
    """SIGKILL this runner's process group (the runner leads it: the worker starts it in a new
    session), so that a job's helper processes go with it."""
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(137)


def _watchdog(store: JobStore, job_id: str, lease: str | None, parent: int | None, period_s: float,
              grace_s: float) -> None:
    """NOTE [ The runner's watchdog ]
    A daemon thread, every `period_s`, ends the runner when it has no business running:
    - its parent is not the worker that started it (the parent-death signal did not come, e.g.
      no prctl, or it was adopted after a crash): SIGKILL its group, write nothing (the next worker
      recovers the job);
    - the job is no longer running under its lease (recovered, re-queued, finished): SIGKILL its
      group, nothing to write;
    - a cancel was requested: SIGTERM itself (the job function unwinds with JobCancelled and the
      cancel is recorded under the lease); if it is still there `grace_s` later, record the cancel
      from here and SIGKILL its group. The worker does the same when it is alive; whichever comes
      first records it, once (the write is fenced). So an orphaned runner is cancellable too."""
    cancel_seen: float | None = None
    while True:
        time.sleep(period_s)
        try:
            if parent is not None and os.getppid() != parent:
                log.warning("job %s: the worker that started this runner is gone; stopping", job_id)
                _kill_own_group()
            state, current, cancel = store.lease_state(job_id)
            if state != "running" or (lease is not None and current != lease):
                log.warning("job %s: this start is no longer current (%s); stopping", job_id, state)
                _kill_own_group()
            if cancel:
                now = time.monotonic()
                if cancel_seen is None:
                    cancel_seen = now
                    os.kill(os.getpid(), signal.SIGTERM)
                elif now - cancel_seen > grace_s:
                    store.finish(job_id, JobState.cancelled, message="cancelled", lease=lease)
                    _kill_own_group()
        except Exception:  # noqa: BLE001 - a busy store must not end the watchdog
            log.debug("watchdog: store unavailable", exc_info=True)


def _on_term(signum: int, frame: Any) -> None:
    raise JobCancelled()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memplan.service.jobs.runner")
    parser.add_argument("db")
    parser.add_argument("job_id")
    parser.add_argument("--lease", default=None, help="the attempt token of this start")
    parser.add_argument("--parent", type=int, default=None, help="the pid of the worker that started it")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent()  # again: a runner started by hand, or by an older worker
    if args.parent is not None and os.getppid() != args.parent:
        return 70  # NOTE [ A runner dies with its worker from its first instruction ] in _proc.py
    logging.basicConfig(level=logging.INFO, format=f"runner[{os.getpid()}] %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _on_term)
    settings = Settings()
    store = JobStore(args.db)
    if not store.set_runner(args.job_id, os.getpid(), lease=args.lease, start_ticks=start_ticks(os.getpid())):
        log.warning("job %s is not running under this lease; nothing to do", args.job_id)
        return 0
    threading.Thread(
        target=_watchdog, args=(store, args.job_id, args.lease, args.parent, 0.25, settings.cancel_grace_s),
        name="runner-watchdog", daemon=True,
    ).start()
    run_one(store, args.job_id, settings, lease=args.lease)
    return 0


if __name__ == "__main__":
    sys.exit(main())
