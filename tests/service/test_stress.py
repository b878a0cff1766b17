"""Stress: bounded concurrent plans, runs, profiles, sweeps, cancels and bad requests against a
live server on 127.0.0.1, with the worker killed (-9) every few seconds. No 5xx, no transport
error, the API never dies, healthz answers throughout, and every accepted job ends exactly once
(one terminal state event per job; the store holds exactly the accepted jobs)."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter

import httpx
import pytest

from tests.service.conftest import make_profile
from tests.service.server import TERMINAL, Server, wait_for

TRAFFIC_S = 60.0  # seconds of traffic; then every accepted job must finish (bounded)
CLIENTS = 5
KILL_EVERY_S = 6.0


def stress_cell(request: dict, ctx) -> dict:
    """A sweep cell in milliseconds: a plausible `SweepCell` for the report (no profiler)."""
    time.sleep(0.05)
    ctx.progress(1.0, "planned")
    base = {k: request[k] for k in ("index", "label", "model", "config", "budget_bytes", "strategy",
                                    "precision", "n_gpus", "zero_stage", "profile")}
    return {**base, "state": "succeeded", "feasible": True, "predicted_total_bytes": 1000 + request["index"],
            "predicted_time_s": 1.0 / (1 + request["index"]), "predicted_overhead": 0.0}


BAD = [
    ("POST", "/v1/plans", b"{not json", "application/json"),
    ("POST", "/v1/plans", json.dumps({"profile": make_profile(3), "budget": 1}).encode(), "application/json"),
    ("POST", "/v1/plans", json.dumps({"profile": {**make_profile(3), "input_bytes": -1}}).encode(),
     "application/json"),
    ("POST", "/v1/plans", b'{"profile": NaN}', "application/json"),
    ("POST", "/v1/runs", b"steps=3", "application/x-www-form-urlencoded"),
    ("POST", "/v1/runs", json.dumps({"steps": "3"}).encode(), "application/json"),
    ("POST", "/v1/runs", json.dumps({"steps": 10**30}).encode(), "application/json"),
    ("POST", "/v1/runs", json.dumps({"timeout_s": 10**9}).encode(), "application/json"),
    ("POST", "/v1/profiles", json.dumps({"repeats": 10**9}).encode(), "application/json"),
    ("POST", "/v1/sweeps", json.dumps({"models": [{"config": {"n_layer": 10**6}}]}).encode(), "application/json"),
    ("POST", "/v1/sweeps", json.dumps({"models": []}).encode(), "application/json"),
    ("GET", "/v1/runs/" + "x" * 65, b"", ""),
    ("GET", "/v1/runs?limit=0", b"", ""),
    ("GET", "/v1/sweeps/nope", b"", ""),
    ("POST", "/v1/runs/nope/cancel", b"", ""),
    ("DELETE", "/v1/runs", b"", ""),
]


class _Traffic:
    """What the clients did: every response status by kind, transport errors, accepted job ids."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: Counter[tuple[str, int]] = Counter()
        self.errors: list[str] = []
        self.jobs: dict[str, str] = {}  # job id -> its resource path
        self.sweeps: list[str] = []

    def note(self, what: str, r: httpx.Response) -> None:
        with self.lock:
            self.codes[(what, r.status_code)] += 1
            if r.status_code >= 500:
                self.errors.append(f"{what}: {r.status_code} {r.text[:300]}")


def _client(url: str, seed: int, stop: threading.Event, t: _Traffic) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=60) as c:
        while not stop.is_set():
            what = rng.choices(["plan", "run", "profile", "sweep", "bad", "cancel", "read"],
                               weights=[4, 4, 1, 1, 4, 1, 2])[0]
            try:
                if what == "plan":
                    body = {"profile": make_profile(rng.randint(2, 40), seed=rng.randint(0, 99)),
                            "strategy": rng.choice(["sqrt", "store-all", "optimal", "uniform"])}
                    r = c.post("/v1/plans", json=body)
                    t.note(what, r)
                    assert r.status_code == 200, r.text
                elif what in ("run", "profile"):
                    if what == "run":
                        body = {"steps": rng.randint(1, 8), "config": {"sleep_s": 0.02, "echo": rng.random()}}
                    else:
                        body = {"config": {"n_layer": rng.randint(1, 6)}}
                    r = c.post(f"/v1/{what}s", json=body)
                    t.note(what, r)
                    assert r.status_code in (202, 429), r.text
                    if r.status_code == 202:
                        with t.lock:
                            t.jobs[r.json()["id"]] = f"/v1/{what}s"
                elif what == "sweep":
                    body = {"models": [{"config": {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16,
                                                   "dropout": 0.0}}],
                            "budgets_bytes": [None, rng.randint(1, 10**6)], "run": False, "profile": "analytic"}
                    r = c.post("/v1/sweeps", json=body)
                    t.note(what, r)
                    assert r.status_code in (202, 429), r.text
                    if r.status_code == 202:
                        with t.lock:
                            t.sweeps.append(r.json()["id"])
                            for j in r.json()["jobs"]:
                                t.jobs[j] = "/v1/sweeps"
                elif what == "bad":
                    method, path, content, ctype = rng.choice(BAD)
                    r = c.request(method, path, content=content or None,
                                  headers={"Content-Type": ctype} if ctype else {})
                    t.note(what, r)
                    assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text)
                elif what == "cancel":
                    with t.lock:
                        runs = [j for j, p in t.jobs.items() if p == "/v1/runs"]
                    if runs:
                        r = c.post(f"/v1/runs/{rng.choice(runs)}/cancel")
                        t.note(what, r)
                        assert r.status_code in (200, 202, 409), r.text
                else:
                    with t.lock:
                        items = list(t.jobs.items())
                    if items:
                        job_id, path = rng.choice(items)
                        if path != "/v1/sweeps":
                            r = c.get(f"{path}/{job_id}")
                            t.note(what, r)
                            assert r.status_code == 200, r.text
                    r = c.get("/v1/runs", params={"limit": 5})
                    t.note(what, r)
                    assert r.status_code == 200, r.text
            except (httpx.HTTPError, AssertionError) as err:
                with t.lock:
                    t.errors.append(f"{what}: {type(err).__name__}: {err}"[:400])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stress_with_worker_kills(tmp_path):
    srv = Server(tmp_path / "svc", env={
        "MEMPLAN_SWEEP_CELL_JOB": "tests.service.test_stress:stress_cell",
        "MEMPLAN_MAX_QUEUE_DEPTH": "40", "MEMPLAN_MAX_ATTEMPTS": "3",
    }).start()
    traffic = _Traffic()
    stop = threading.Event()
    health: list[str] = []
    kills: list[int] = []

    def healthz() -> None:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            while not stop.is_set():
                try:
                    r = c.get("/v1/healthz")
                    if r.status_code != 200:
                        health.append(f"{r.status_code}")
                except httpx.HTTPError as err:
                    health.append(f"{type(err).__name__}: {err}")
                time.sleep(0.25)

    def killer() -> None:
        while not stop.wait(KILL_EVERY_S):
            try:
                pid = srv.worker_pid()
            except httpx.HTTPError:
                continue
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass

    threads = [threading.Thread(target=healthz), threading.Thread(target=killer)]
    threads += [threading.Thread(target=_client, args=(srv.url, seed, stop, traffic)) for seed in range(CLIENTS)]
    try:
        for th in threads:
            th.start()
        stop.wait(TRAFFIC_S)
        stop.set()
        for th in threads:
            th.join(timeout=120)
        assert srv.proc.poll() is None, "the API died"
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            def all_done():
                with sqlite3.connect(srv.data_dir / "jobs.sqlite") as conn:
                    return conn.execute("SELECT COUNT(*) FROM jobs WHERE state NOT IN"
                                        " ('succeeded', 'failed', 'cancelled')").fetchone()[0] == 0
            wait_for(all_done, timeout_s=240, every_s=0.5, what="every accepted job to finish")
            for sweep in traffic.sweeps:  # a sweep's report gathers from its finished cells
                r = c.get(f"/v1/sweeps/{sweep}")
                assert r.status_code == 200 and r.json()["report"] is not None, r.text
            assert c.get("/v1/healthz").status_code == 200
    finally:
        stop.set()
        srv.stop()
    assert not traffic.errors, (Counter(e.split(":")[0] for e in traffic.errors), traffic.errors[:5])
    assert not health, health[:10]
    assert kills, "the worker was never killed"
    with sqlite3.connect(srv.data_dir / "jobs.sqlite") as conn:
        stored = dict(conn.execute("SELECT id, state FROM jobs").fetchall())
        ends = Counter(job_id for job_id, data in conn.execute("SELECT job_id, data FROM events WHERE type = 'state'")
                       if json.loads(data)["state"] in TERMINAL)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert set(stored) == set(traffic.jobs), "the store holds other jobs than the accepted ones"
    assert all(state in TERMINAL for state in stored.values())
    assert {j: n for j, n in ends.items() if n != 1} == {}, "a job ended more than once"
    assert set(ends) == set(stored)
    print(f"stress: {sum(traffic.codes.values())} requests {dict(sorted(traffic.codes.items()))}, "
          f"{len(traffic.jobs)} jobs accepted ({Counter(stored.values())}), {len(kills)} worker kills")
    # enough traffic to mean something, on any machine
    assert sum(n for (w, code), n in traffic.codes.items() if w == "plan") >= 10
    assert len(traffic.jobs) >= 10
