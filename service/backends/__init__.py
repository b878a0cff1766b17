"""Run backends: where the jobs the store holds are executed. The SQLite store stays the system of
record on every backend; a backend claims queued jobs, executes them and records their outcome.

- `LocalBackend` (the default): the job worker of `memplan.service.jobs`, one runner process per job on
  this machine's device.
- `RayBackend`, when the settings name a Ray cluster (`MEMPLAN_RAY_ADDRESS`): each job becomes a
  Ray task asking for one GPU when it runs on cuda (CPUs otherwise), retried by Ray when its
  worker process dies; cancel is `ray.cancel`; a task asking for more than the whole cluster has
  fails after `MEMPLAN_RAY_PENDING_TIMEOUT_S` instead of pending forever. Needs `memplan[ray]`.

`python -m service.jobs.worker` serves the store with `make_worker(settings)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from memplan.service.settings import Settings

__all__ = ["RunBackend", "make_worker", "backend_name", "job_function", "job_resources"]


class RunBackend(ABC):
    """What serves the store's queue. `run()` blocks until `stop()` (or SIGTERM), then gives the
    jobs it was running back to the queue."""

    name: str

    @abstractmethod
    def run(self) -> int:
        """Claim, execute and record jobs until stopped; returns the exit code."""

    @abstractmethod
    def stop(self, *_: Any) -> None:
        """Ask `run()` to return (safe from a signal handler)."""


def backend_name(settings: Settings) -> str:
    """'ray' when the settings name a Ray cluster, else 'local'."""
    return "ray" if settings.ray_address else "local"


def make_worker(settings: Settings, *, parent_pid: int | None = None) -> RunBackend:
    """The backend the settings ask for (Ray needs the `memplan[ray]` extra)."""
    if backend_name(settings) == "ray":
        from memplan.service.backends.ray_backend import RayBackend

        return RayBackend(settings, parent_pid=parent_pid)
    from memplan.service.backends.local import LocalBackend

    return LocalBackend(settings, parent_pid=parent_pid)


def job_function(kind: str, settings: Settings) -> str:
    """'module:function' of the job function for `kind` (as the local runner resolves it)."""
    paths = {"run": settings.run_job, "profile": settings.profile_job,
             "sweep-cell": settings.sweep_cell_job}
    if kind not in paths:
        raise ValueError(f"kind: no job function for {kind!r}")
    return paths[kind]


def job_resources(request: dict[str, Any], settings: Settings, *, cluster_gpus: float = 0.0
                  ) -> dict[str, float]:
    """What one job asks a cluster for: one GPU (and one CPU) when it runs on cuda (its `device`,
    else the server's, else cuda when the cluster has GPUs), else one CPU."""
    device = request.get("device") or settings.device
    if device is None:
        device = "cuda" if cluster_gpus > 0 else "cpu"
    if str(device).startswith("cuda"):
        return {"num_cpus": 1.0, "num_gpus": 1.0}
    return {"num_cpus": 1.0, "num_gpus": 0.0}
