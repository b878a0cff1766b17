"""A job never runs twice at once: a runner dies with the worker that started it (from its first
instruction), every write of a runner is fenced by the lease of its start, a runner whose lease
ended stops by itself, a cancel reaches a runner no worker watches, and a worker taking over
kills a runner its dead predecessor left behind."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from memplan.service.jobs._proc import cmdline, start_ticks
from memplan.service.jobs.store import JobState, JobStore

from tests.service.server import ROOT, wait_for

JOB = "tests.service.test_fencing:exclusive_job"


def exclusive_job(request: dict, ctx) -> dict:
    """A job that proves it runs alone: it holds an exclusive flock on `config.lock` while it
    runs (a second runner of the same job, alive at once, cannot take it and records the overlap
    in `config.overlaps`), and reports its pid in every progress message."""
    cfg = request["config"]
    fd = os.open(cfg["lock"], os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with open(cfg["overlaps"], "a") as f:
            f.write(f"{os.getpid()}\n")
        raise RuntimeError("another runner of this job holds its lock") from None
    steps = int(request.get("steps", 3))
    for i in range(steps):
        time.sleep(float(cfg.get("sleep_s", 0.05)))
        ctx.progress((i + 1) / steps, f"pid {os.getpid()} step {i + 1}")
    return {"pid": os.getpid()}


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "MEMPLAN_RUN_JOB": JOB, "MEMPLAN_HEARTBEAT_S": "0.2", "MEMPLAN_CANCEL_GRACE_S": "1",
            "MEMPLAN_MAX_ATTEMPTS": "1000",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def _request(tmp: Path, *, steps: int, sleep_s: float) -> dict:
    return {"steps": steps, "config": {"lock": str(tmp / "job.lock"), "overlaps": str(tmp / "overlaps"),
                                       "sleep_s": sleep_s}}


def _runners(job_id: str) -> list[int]:
    """Live (not zombie) processes running this job's runner."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        args = cmdline(int(entry))
        if job_id in args and any(a.endswith("memplan.service.jobs.runner") for a in args):
            try:
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                out.append(int(entry))
    return out


def _worker(db: Path, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "memplan.service.jobs.worker", "--store", str(db)],
                            cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT)


def _runner(db: Path, job_id: str, lease: str, log) -> subprocess.Popen:
    """A runner started by this test process, standing in for a worker that then does nothing."""
    return subprocess.Popen([sys.executable, "-m", "memplan.service.jobs.runner", str(db), job_id,
                             "--lease", lease, "--parent", str(os.getpid())],
                            cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_every_write_carries_the_lease(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    job, _ = store.submit("run", {"steps": 1})
    first = store.claim("w1")
    assert first.id == job.id and first.lease
    assert "lease" not in first.model_dump() and "lease" not in first.model_dump_json()
    assert store.set_runner(job.id, 123, lease=first.lease, start_ticks=1)
    assert store.progress(job.id, 0.5, "first", lease=first.lease)
    # the first worker dies; the next one takes over and starts the job again
    assert store.recover("w2", max_attempts=5) == [job.id]
    second = store.claim("w2")
    assert second.id == job.id and second.lease not in (None, first.lease) and second.attempts == 2
    # the first start's runner is still alive somewhere: nothing it writes lands
    assert not store.progress(job.id, 0.9, "stale", lease=first.lease)
    assert not store.log_event(job.id, "log", {"message": "stale"}, lease=first.lease)
    assert not store.set_runner(job.id, 456, lease=first.lease)
    assert not store.finish(job.id, JobState.succeeded, result={"stale": True}, lease=first.lease)
    assert not store.requeue(job.id, message="stale", lease=first.lease)
    assert store.get(job.id).state is JobState.running
    assert store.progress(job.id, 0.5, "second", lease=second.lease)
    assert store.finish(job.id, JobState.succeeded, result={"ok": 1}, lease=second.lease)
    assert not store.finish(job.id, JobState.failed, lease=second.lease)  # once
    done = store.get(job.id)
    assert done.state is JobState.succeeded and done.result == {"ok": 1} and done.lease is None
    events = store.events(job.id)
    assert [e.data["message"] for e in events if e.type == "progress"] == ["first", "second"]
    assert not [e for e in events if e.type == "log" and e.data.get("message") == "stale"]
    assert sum(1 for e in events if e.type == "state" and e.data["state"] in ("succeeded", "failed")) == 1


@contextlib.contextmanager
def _unwatched_runner(tmp_path: Path, worker: str):
    """A long run job claimed by `worker` and a runner of it started by this process (no worker
    watches it), once the runner has reported progress. Yields (store, job, claim, runner
    process); kills the runner on leaving."""
    store = JobStore(tmp_path / "jobs.sqlite")
    job, _ = store.submit("run", _request(tmp_path, steps=400, sleep_s=0.05))
    claimed = store.claim(worker)
    with open(tmp_path / "runner.log", "ab") as log:
        proc = _runner(tmp_path / "jobs.sqlite", job.id, claimed.lease, log)
    try:
        wait_for(lambda: store.get(job.id).progress > 0, timeout_s=60, what="the runner's first progress")
        yield store, job, claimed, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_runner_whose_lease_ended_stops_writing_and_exits(tmp_path):
    with _unwatched_runner(tmp_path, "w-gone") as (store, job, _, proc):
        store.recover("w-next", max_attempts=5)  # a new worker took over without killing it
        proc.wait(timeout=15)  # its watchdog ends it
        requeued = max(e.seq for e in store.events(job.id) if e.type == "state" and e.data.get("requeued"))
        assert not [e for e in store.events(job.id, after=requeued) if e.type == "progress"]
        assert store.get(job.id).state is JobState.queued


def test_a_cancel_reaches_a_runner_no_worker_watches(tmp_path):
    with _unwatched_runner(tmp_path, "w-hung") as (store, job, _, proc):
        store.request_cancel(job.id)  # what POST /v1/runs/{id}/cancel does
        assert proc.wait(timeout=15) is not None
        done = store.get(job.id)
        assert done.state is JobState.cancelled, done
        assert [e.data["state"] for e in store.events(job.id) if e.type == "state"] == [
            "queued", "running", "cancelled"]


def test_a_new_worker_kills_the_runner_its_predecessor_left(tmp_path):
    from memplan.service.jobs.worker import Worker
    from memplan.service.settings import Settings

    db = tmp_path / "jobs.sqlite"
    with _unwatched_runner(tmp_path, "w-dead") as (store, job, claimed, proc):
        row = store.runners()[0]
        assert row["pid"] == proc.pid and row["start_ticks"] == start_ticks(proc.pid)
        # a process whose pid was reused is not touched: same pid, another start time
        store.set_runner(job.id, proc.pid, lease=claimed.lease, start_ticks=row["start_ticks"] + 1)
        assert Worker(Settings(store_path=db))._stop_orphans() == []
        assert proc.poll() is None
        store.set_runner(job.id, proc.pid, lease=claimed.lease, start_ticks=row["start_ticks"])
        assert Worker(Settings(store_path=db))._stop_orphans() == [proc.pid]
        assert proc.wait(timeout=10) == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killing_the_worker_anywhere_in_a_runners_start_never_runs_the_job_twice(tmp_path):
    """Kill -9 the worker at 24 points from the claim of the job to well into its runner's run
    (the runner's spawn, its interpreter's start, its imports, its first steps). After each kill,
    before any other worker starts, no runner of the job is alive; then the next worker starts the
    job again. At the end the job succeeds once, no two runners ever held its lock at once, and
    no progress of an earlier start was recorded after the job was re-queued."""
    db = tmp_path / "jobs.sqlite"
    store = JobStore(db)
    job, _ = store.submit("run", _request(tmp_path, steps=30, sleep_s=0.1))
    delays = [0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.35, 0.4,
              0.5, 0.6, 0.7, 0.8, 1.0, 1.2, 1.5, 1.8, 2.2]
    log = open(tmp_path / "workers.log", "ab")  # noqa: SIM115 - the workers write to it
    try:
        for delay in delays:
            started = store.get(job.id).attempts
            worker = _worker(db, log)
            try:
                wait_for(lambda: (j := store.get(job.id)).state == "running" and j.attempts > started,  # noqa: B023
                         timeout_s=60, every_s=0.002, what="the worker to claim the job")
                time.sleep(delay)
            finally:
                worker.send_signal(signal.SIGKILL)
                worker.wait()
            # the runner (if it was spawned) dies with the worker, with no one else's help
            wait_for(lambda: not _runners(job.id), timeout_s=5, every_s=0.01,  # noqa: B023
                     what=f"the runner to die with its worker (killed {delay:g} s after the claim)")
            assert store.get(job.id).state is JobState.running  # until the next worker recovers it
        worker = _worker(db, log)
        try:
            done = wait_for(lambda: (j := store.get(job.id)).state in ("succeeded", "failed") and j,
                            timeout_s=120, every_s=0.05, what="the job to finish")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
    finally:
        log.close()
    assert done.state is JobState.succeeded, (done, (tmp_path / "workers.log").read_text()[-3000:])
    assert done.attempts == len(delays) + 1
    assert not (tmp_path / "overlaps").exists()
    events = store.events(job.id, limit=100_000)
    assert sum(1 for e in events if e.type == "state" and e.data["state"] == "succeeded") == 1
    # fencing: after each re-queue, no progress from a runner of an earlier start
    seen: set[str] = set()
    current: set[str] = set()
    for e in events:
        if e.type == "state" and e.data.get("requeued"):
            seen |= current
            current = set()
        elif e.type == "progress":
            pid = e.data["message"].split()[1]
            assert pid not in seen, f"progress from runner {pid} after its start was re-queued"
            current.add(pid)
    assert json.loads(json.dumps(done.result))["pid"] > 0
