"""The persistent job queue: a SQLite (WAL) store, a worker process that claims jobs, and one runner
process per job, so that a job that crashes or runs out of memory takes down neither the API nor
the worker, and cancelling a job frees its device memory (its process ends).

    API process ──(insert, read)──> jobs.sqlite <──(claim, heartbeat)── worker ──spawn──> runner
"""

from memplan.service.jobs.store import TERMINAL_STATES, Job, JobState, JobStore, QueueFull

__all__ = ["Job", "JobState", "JobStore", "QueueFull", "TERMINAL_STATES"]
