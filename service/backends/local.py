"""The local backend: the job worker of `service.jobs` (one runner process per job, one job at a
time on this machine's device), unchanged."""

from __future__ import annotations

from service.backends import RunBackend
from service.jobs.worker import Worker

__all__ = ["LocalBackend"]


class LocalBackend(Worker, RunBackend):
    """`service.jobs.worker.Worker` as a `RunBackend`."""

    name = "local"
