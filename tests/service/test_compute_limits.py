"""Plans computed in planning processes (service/compute.py): stopped at their time limit or when
their client leaves, a crash there answered as a 500 while the API goes on, memory limited, and
the same bytes as a plan computed in the API's thread."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import threading

import httpx
import psutil
import pytest
from memplan.planner.request import PlanRequest, estimate_work

from tests.service.conftest import make_profile
from tests.service.server import Server, process_gone, wait_for

# an admitted plan that runs for a long time: the exact DP on 200 stages without a budget,
# 8 x 200^3 = 6.4e7 steps (half a minute or more on two cores); the servers below admit it
LONG = {"profile": make_profile(200), "options": {"mode": "exact"}}
# a plan just over the default threshold (1.33e6 steps), under a second
MEDIUM = {"profile": make_profile(110), "budget_bytes": 330_000}
CHILD = "memplan.service.compute_child"


def _children(server: Server) -> list[psutil.Process]:
    """The server's planning processes."""
    out = []
    for p in psutil.Process(server.proc.pid).children():
        try:
            if CHILD in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _problem(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["status"] == status and body["type"].endswith("/" + kind), body
    return body


def _env(**extra: str) -> dict[str, str]:
    return {"MEMPLAN_START_WORKER": "false", "MEMPLAN_PLAN_CACHE_SIZE": "0",
            "MEMPLAN_PLAN_MAX_STEPS": "1e12", "MEMPLAN_PLAN_PROCESSES": "1",
            "MEMPLAN_PLAN_KILL_GRACE_S": "0.2", **extra}


@pytest.fixture(scope="module")
def pool_server(tmp_path_factory):
    """Every plan in a planning process (threshold 0), a generous time limit."""
    srv = Server(tmp_path_factory.mktemp("svc-pool"), env=_env(
        MEMPLAN_PLAN_PROCESS_MIN_STEPS="0", MEMPLAN_PLAN_TIMEOUT_S="120")).start(ready=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def timed_server(tmp_path_factory):
    """The default threshold (small plans in a thread, large ones in a process), 5 s per plan
    (the first optimal plan in a process loads the compiled kernel: about 2 s under load)."""
    srv = Server(tmp_path_factory.mktemp("svc-timed"), env=_env(
        MEMPLAN_PLAN_TIMEOUT_S="5")).start(ready=False)
    yield srv
    srv.stop()


def test_info_reports_the_compute_limits(pool_server):
    limits = httpx.get(pool_server.url + "/v1/info", timeout=30).json()["limits"]
    assert limits["plan_process_min_steps"] == 0
    assert limits["plan_processes"] == 1
    assert limits["plan_process_max_bytes"] == 8 << 30
    assert limits["plan_kill_grace_s"] == 0.2
    assert limits["plan_timeout_s"] == 120


SMALL = [
    ("/v1/plans", {"profile": make_profile(20), "budget_bytes": 60_000}),
    ("/v1/plans", {"profile": make_profile(12)}),
    ("/v1/plans", {"profile": make_profile(12), "budget_bytes": 1}),  # infeasible: a 200 too
    ("/v1/plans", {"profile": make_profile(30), "strategy": "uniform", "options": {"k": 5}}),
    ("/v1/plans", {"profile": make_profile(30), "strategy": "heuristic", "budget_bytes": 90_000}),
    ("/v1/plans", {"profile": make_profile(16), "budget_bytes": 60_000,
                   "options": {"mode": "slotted", "slots": 64}}),
    ("/v1/plans/frontier", {"profile": make_profile(12), "options": {"points": 5}}),
    ("/v1/plans/timeline", {"profile": make_profile(10), "budget_bytes": 40_000}),
]


def _untimed(content: bytes) -> bytes:
    """`content` with the solve's wall time in the optimal plan's message ("mode exact, 0.03 s")
    masked: the one part of a plan that differs between two computations of it."""
    return re.sub(rb", \d+\.\d\d s([;\"])", rb", <time> s\1", content)


def test_a_plan_is_the_same_bytes_in_a_process_and_in_a_thread(pool_server, timed_server):
    from memplan.service.routers.plans import _plan_json

    with httpx.Client(timeout=120) as c:
        for path, body in SMALL:
            if path == "/v1/plans":  # the timed server computes it in its thread
                assert estimate_work(PlanRequest.model_validate(body)).steps <= 1e6
            in_process = c.post(pool_server.url + path, json=body)
            in_thread = c.post(timed_server.url + path, json=body)
            assert in_process.status_code == 200, in_process.text
            assert _untimed(in_process.content) == _untimed(in_thread.content), path
            if path == "/v1/plans":  # and both are the library's own plan, byte for byte
                here = _plan_json(PlanRequest.model_validate(body))
                assert _untimed(in_process.content) == _untimed(here)
    assert len(_children(pool_server)) == 1  # the process path did run in a child
    assert not _children(timed_server)  # and the thread path did not


def test_a_plan_past_its_time_limit_is_stopped(timed_server):
    out: dict = {}

    def post() -> None:
        out["r"] = httpx.post(timed_server.url + "/v1/plans", json=LONG, timeout=120)

    t = threading.Thread(target=post)
    t.start()
    child = wait_for(lambda: _children(timed_server), what="a planning process")[0]
    t.join(120)
    problem = _problem(out["r"], 503, "timeout")
    assert "MEMPLAN_PLAN_TIMEOUT_S" in problem["detail"]
    assert out["r"].headers["retry-after"] == "5"
    assert process_gone(child.pid)  # killed and reaped before the answer
    assert "stopped: its time limit" in timed_server.log.read_text()
    # the pool started another in its place, which serves the next large request
    (again,) = _children(timed_server)
    assert again.pid != child.pid
    assert estimate_work(PlanRequest.model_validate(MEDIUM)).steps > 1e6
    r = httpx.post(timed_server.url + "/v1/plans", json=MEDIUM, timeout=120)
    assert r.status_code == 200 and r.json()["feasible"]
    assert [p.pid for p in _children(timed_server)] == [again.pid]


def _warm_child(server: Server) -> psutil.Process:
    """The server's one planning process, started by a small plan."""
    r = httpx.post(server.url + "/v1/plans", json=SMALL[1][1], timeout=120)
    assert r.status_code == 200, r.text
    (child,) = _children(server)
    return child


def test_a_client_that_leaves_has_its_plan_stopped(pool_server):
    child = _warm_child(pool_server)
    with httpx.Client(timeout=httpx.Timeout(30, read=1.0)) as c, pytest.raises(httpx.ReadTimeout):
        c.post(pool_server.url + "/v1/plans", json=LONG)
    # the connection is closed: the server notices within its polling period and kills the
    # child (its time limit, 120 s, is far off)
    wait_for(lambda: process_gone(child.pid), timeout_s=20, what="the planning process to end")
    wait_for(lambda: "stopped: its client left" in pool_server.log.read_text(), timeout_s=5,
             what="the log line")
    r = httpx.post(pool_server.url + "/v1/plans", json=SMALL[0][1], timeout=120)
    assert r.status_code == 200 and r.json()["feasible"]


def test_a_crash_in_the_planning_process_is_a_500_and_the_api_goes_on(pool_server):
    child = _warm_child(pool_server)
    idle_cpu = child.cpu_times().user
    out: dict = {}

    def post() -> None:
        with httpx.Client(timeout=120) as c:
            out["r"] = c.post(pool_server.url + "/v1/plans", json=LONG)
            out["next"] = c.get(pool_server.url + "/v1/healthz")  # same keep-alive connection

    t = threading.Thread(target=post)
    t.start()
    # once it computes the plan, it crashes
    wait_for(lambda: child.cpu_times().user > idle_cpu + 0.3, timeout_s=60, what="the plan to run")
    os.kill(child.pid, signal.SIGSEGV)
    t.join(120)
    problem = _problem(out["r"], 500, "plan-crashed")
    assert "SIGSEGV" in problem["detail"]
    assert out["next"].status_code == 200
    assert process_gone(child.pid)
    r = httpx.post(pool_server.url + "/v1/plans", json=SMALL[0][1], timeout=120)
    assert r.status_code == 200 and r.json()["feasible"]
    (new,) = _children(pool_server)
    assert new.pid != child.pid


def _raise_memory_hog() -> bytes:
    return bytes(64 << 30)  # 64 GiB: past any limit below


def test_the_planning_process_memory_limit_and_abort():
    from memplan.service.compute import ComputePool
    from memplan.service.problems import ProblemError

    async def scenario() -> None:
        pool = ComputePool(1, max_bytes=4 << 30, kill_grace_s=0.2)
        try:
            assert await pool.run(sum, [1, 2], timeout_s=60) == 3
            (pid,) = pool.pids()
            limit = psutil.Process(pid).rlimit(psutil.RLIMIT_AS)
            assert limit == (4 << 30, 4 << 30)
            with pytest.raises(ProblemError) as err:
                await pool.run(_raise_memory_hog, timeout_s=60)
            assert err.value.status == 422 and err.value.kind == "too-large"
            assert "MEMPLAN_PLAN_PROCESS_MAX_BYTES" in err.value.detail
            assert pool.pids() == [pid]  # a MemoryError leaves the process serving
            with pytest.raises(ProblemError) as err:
                await pool.run(os.abort, timeout_s=60)
            assert err.value.status == 500 and "SIGABRT" in err.value.detail
            assert process_gone(pid)
            assert await pool.run(functools.reduce, max, [3, 9, 4], timeout_s=60) == 9
            assert pool.pids() != [pid] and pool.started == 2
        finally:
            pool.close()

    asyncio.run(scenario())


def test_waiting_for_the_process_ends_when_the_client_leaves(pool_server):
    # two long plans on a pool of one: the second waits for the process; both clients leave
    child = _warm_child(pool_server)
    errors: list[type] = []

    def post() -> None:
        with httpx.Client(timeout=httpx.Timeout(30, read=1.0)) as c:
            try:
                c.post(pool_server.url + "/v1/plans", json=LONG)
            except httpx.HTTPError as err:
                errors.append(type(err))

    threads = [threading.Thread(target=post) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [httpx.ReadTimeout, httpx.ReadTimeout]
    wait_for(lambda: process_gone(child.pid), timeout_s=20, what="the planning process to end")
    # the pool is whole: one process, serving
    r = httpx.post(pool_server.url + "/v1/plans", json=SMALL[0][1], timeout=120)
    assert r.status_code == 200
    assert len(_children(pool_server)) == 1


def test_the_memory_limit_setting_leaves_room_to_start():
    from memplan.service.settings import Settings
    from pydantic import ValidationError

    assert Settings(plan_process_max_bytes=0).plan_process_max_bytes == 0  # no limit
    assert Settings(plan_process_max_bytes=1 << 30).plan_process_max_bytes == 1 << 30
    with pytest.raises(ValidationError, match="at least 1 GiB") as err:
        Settings(plan_process_max_bytes=(1 << 30) - 1)
    assert err.value.errors()[0]["loc"] == ("plan_process_max_bytes",)


def test_the_planning_processes_die_with_the_api(tmp_path):
    srv = Server(tmp_path / "svc", env=_env(MEMPLAN_PLAN_PROCESS_MIN_STEPS="0",
                                            MEMPLAN_PLAN_TIMEOUT_S="120")).start(ready=False)
    try:
        child = _warm_child(srv)
        out: dict = {}
        idle_cpu = child.cpu_times().user
        t = threading.Thread(target=lambda: out.update(r=_post_quietly(srv.url, LONG)))
        t.start()
        wait_for(lambda: child.cpu_times().user > idle_cpu + 0.3, timeout_s=60,
                 what="the plan to run")
        srv.kill9()  # the API dies in the middle of the plan: PR_SET_PDEATHSIG ends its child
        wait_for(lambda: process_gone(child.pid), timeout_s=20, what="the child to die")
        t.join(60)
        assert isinstance(out["r"], httpx.TransportError)
    finally:
        srv.stop()


def _post_quietly(url: str, body: dict) -> httpx.Response | Exception:
    try:
        return httpx.post(url + "/v1/plans", json=body, timeout=120)
    except httpx.TransportError as err:
        return err


def test_an_empty_variable_counts_as_unset(monkeypatch):
    """MEMPLAN_JOB_MAX_BYTES= (set, empty) is the default, not a validation error at start."""
    from memplan.service.settings import Settings

    monkeypatch.setenv("MEMPLAN_JOB_MAX_BYTES", "")
    monkeypatch.setenv("MEMPLAN_SHUTDOWN_GRACE_S", "")
    s = Settings()
    assert s.job_max_bytes == Settings.model_fields["job_max_bytes"].default
    assert s.shutdown_grace_s == 5.0
