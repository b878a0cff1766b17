"""The local backend: the job worker of `memplan.service.jobs` (one runner process per job, one job at a
time on this machine's device), unchanged."""

from __future__ import annotations

from memplan.service.backends import RunBackend
from memplan.service.jobs.worker import Worker

__all__ = ["LocalBackend"]


class LocalBackend(Worker, RunBackend):
    """`memplan.service.jobs.worker.Worker` as a `RunBackend`."""

    name = "local"
