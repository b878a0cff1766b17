"""Crash safety: kill -9 the worker, the API, or both in the middle of a run. After a restart every
accepted run is there and completes (re-queued where it was cut off), and SQLite's integrity check
passes."""

from __future__ import annotations

import os
import signal
import sqlite3

import httpx
import pytest

from tests.service.server import Server, wait_for


def _submit(c: httpx.Client, n: int) -> list[str]:
    body = {"steps": 20, "config": {"sleep_s": 0.1}}
    ids = []
    for i in range(n):
        r = c.post("/v1/runs", json={**body, "config": {**body["config"], "echo": i}})
        assert r.status_code == 202
        ids.append(r.json()["id"])
    return ids


def _running(c: httpx.Client, job_id: str) -> bool:
    job = c.get(f"/v1/runs/{job_id}").json()
    return job["state"] == "running" and job["progress"] > 0


def _all_succeed(c: httpx.Client, ids: list[str], timeout_s: float = 90) -> list[dict]:
    def done():
        jobs = [c.get(f"/v1/runs/{i}").json() for i in ids]
        return jobs if all(j["state"] in ("succeeded", "failed", "cancelled") for j in jobs) else None

    jobs = wait_for(done, timeout_s=timeout_s, every_s=0.2, what="every run to finish")
    assert [j["state"] for j in jobs] == ["succeeded"] * len(ids), jobs
    assert [j["result"]["echo"] for j in jobs] == list(range(len(ids)))
    return jobs


def _integrity(db) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kill_worker_mid_run(tmp_path):
    srv = Server(tmp_path / "svc").start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            # the worker's pid first: read after the run started, on a loaded machine the run
            # could finish before the kill, which would then cut off the second one instead
            old = srv.worker_pid()
            ids = _submit(c, 3)
            wait_for(lambda: _running(c, ids[0]), what="the first run to start")
            os.kill(old, signal.SIGKILL)
            # the API stays up, notices, and starts a new worker that re-queues the run
            assert c.get("/v1/healthz").status_code == 200
            wait_for(lambda: (srv.worker_pid() or old) != old, what="a new worker")
            jobs = _all_succeed(c, ids)
            assert jobs[0]["attempts"] == 2  # cut off once, re-queued, completed
            assert [j["attempts"] for j in jobs[1:]] == [1, 1]
    finally:
        srv.stop()
    assert _integrity(tmp_path / "svc" / "jobs.sqlite") == "ok"


@pytest.mark.parametrize("victims", ["api", "api+worker"])
def test_kill_api_mid_run_and_restart(tmp_path, victims):
    data = tmp_path / "svc"
    srv = Server(data).start()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        ids = _submit(c, 3)
        wait_for(lambda: _running(c, ids[0]), what="the first run to start")
        worker = srv.worker_pid()
        runner = c.get(f"/v1/runs/{ids[0]}").json()["result"]  # None while running
        assert runner is None
    if victims == "api+worker":
        os.kill(worker, signal.SIGKILL)
    srv.kill9()
    # nothing of ours keeps running without the API: the worker follows its parent
    wait_for(lambda: not _alive(worker), timeout_s=30, what="the orphaned worker to stop")
    assert _integrity(data / "jobs.sqlite") == "ok"
    with sqlite3.connect(data / "jobs.sqlite") as conn:
        stored = {row[0] for row in conn.execute("SELECT id FROM jobs")}
    assert set(ids) <= stored  # every accepted run survived the crash
    srv2 = Server(data).start()
    try:
        with httpx.Client(base_url=srv2.url, timeout=30) as c:
            jobs = _all_succeed(c, ids)
            assert all(j["attempts"] <= 2 for j in jobs)
    finally:
        srv2.stop()
    assert _integrity(data / "jobs.sqlite") == "ok"


def test_stop_can_be_reentered_by_a_second_signal(tmp_path):
    # NOTE [ Stopping from a signal handler ]: a second SIGTERM may run the handler again at any
    # line of the first one; emulate that at every line stop() executes, down into what it calls
    import sys
    import threading

    from memplan.service.jobs.worker import Worker
    from memplan.service.settings import Settings

    worker = Worker(Settings(data_dir=tmp_path))
    busy = [False]

    def tracer(frame, event, arg):
        if event == "line" and not busy[0]:
            busy[0] = True  # the nested call runs untraced, as a handler runs to its end
            try:
                worker.stop()
            finally:
                busy[0] = False
        return tracer

    done = threading.Event()

    def first_signal():
        sys.settrace(tracer)
        try:
            worker.stop()
        finally:
            sys.settrace(None)
            done.set()

    threading.Thread(target=first_signal, daemon=True).start()
    assert done.wait(10), "stop() deadlocked when a second signal re-entered it"
