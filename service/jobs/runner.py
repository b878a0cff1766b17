"""One job in one process: `python -m service.jobs.runner DB JOB_ID`.

The worker starts a runner per job. The runner calls the job's function (`Settings.run_job` or
`Settings.profile_job`, 'module:function', called as `fn(request: dict, ctx: JobContext)`) and
records its result or error in the store. Whatever happens inside (a segfault, the OOM killer,
a CUDA error that poisons the context), the damage ends with this process: the worker records
the crash and the device memory is released when the process exits. That is also how a cancel
frees memory: the worker ends this process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from typing import Any

from memplan.service.jobs._proc import die_with_parent, import_object
from memplan.service.jobs.store import JobState, JobStore
from memplan.service.settings import Settings

__all__ = ["JobContext", "JobCancelled", "run_one", "main"]

log = logging.getLogger("memplan.runner")


class JobCancelled(BaseException):
    """Raised inside the job function when the worker asks the runner to stop (SIGTERM)."""


class JobContext:
    """What a job function gets besides its request: progress reporting and the device to use."""

    def __init__(self, store: JobStore, job_id: str, *, device: str | None) -> None:
        self._store = store
        self.job_id = job_id
        self.device = device
        self._last = 0.0

    def progress(self, fraction: float, message: str = "", *, force: bool = False) -> None:
        """Report `fraction` (0..1) done. Throttled to 10 updates a second unless `force`."""
        now = time.monotonic()
        if force or now - self._last >= 0.1 or fraction >= 1.0:
            self._last = now
            self._store.progress(self.job_id, fraction, message)

    def log(self, message: str) -> None:
        """A line in the job's event stream."""
        self._store.log_event(self.job_id, "log", {"message": message})


def _as_json(result: Any) -> dict[str, Any]:
    if hasattr(result, "model_dump"):
        return result.model_dump(mode="json")
    if isinstance(result, dict):
        return result
    raise TypeError(f"job function returned {type(result).__name__}; return a pydantic model or a dict")


def run_one(store: JobStore, job_id: str, settings: Settings) -> JobState:
    """Run job `job_id` (already claimed: state running) and record its outcome."""
    job = store.get(job_id)
    if job is None or job.state is not JobState.running:
        log.warning("job %s is not running (state %s); nothing to do", job_id, job and job.state)
        return job.state if job else JobState.failed
    path = {"run": settings.run_job, "profile": settings.profile_job,
            "sweep-cell": settings.sweep_cell_job}.get(job.kind)
    ctx = JobContext(store, job_id, device=settings.device)
    try:
        if path is None:
            raise ValueError(f"kind: no job function for {job.kind!r}")
        fn = import_object(path)
        result = _as_json(fn(job.request, ctx))
    except JobCancelled:
        current = store.get(job_id)
        if current is not None and current.cancel_requested:
            store.finish(job_id, JobState.cancelled, message="cancelled")
            return JobState.cancelled
        # stopped because the worker is shutting down: leave the job running for the worker to
        # give back to the queue
        return JobState.running
    except (ValueError, KeyError) as err:
        # the library's input errors (PlanError, ProfileError, ExecutorError are ValueErrors)
        store.finish(
            job_id, JobState.failed, error={"type": "invalid-input", "detail": str(err)}, message="failed"
        )
        return JobState.failed
    except ImportError as err:
        store.finish(
            job_id,
            JobState.failed,
            error={"type": "unavailable", "detail": f"not available in this build: {err}"},
            message="failed",
        )
        return JobState.failed
    except Exception as err:  # noqa: BLE001 - a job's bug must end as a failed job, not a crash
        log.error("job %s failed:\n%s", job_id, traceback.format_exc())
        store.finish(
            job_id,
            JobState.failed,
            error={"type": "internal", "detail": f"{type(err).__name__}: {err}"},
            message="failed",
        )
        return JobState.failed
    store.finish(job_id, JobState.succeeded, result=result, message="done")
    return JobState.succeeded


def _on_term(signum: int, frame: Any) -> None:
    raise JobCancelled()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m service.jobs.runner DB JOB_ID", file=sys.stderr)
        return 2
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"runner[{os.getpid()}] %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _on_term)
    settings = Settings()
    store = JobStore(argv[0])
    run_one(store, argv[1], settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
