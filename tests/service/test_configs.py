"""Run and profile configs are typed and bounded, and a job whose estimated memory or time exceeds
the worker's limits is refused at submission (422 naming the field); out-of-memory is reported as
such; a job's own time limit holds."""

from __future__ import annotations

import httpx
import pytest
from memplan.service.jobs.admission import AdmissionError, admit, estimate
from memplan.service.jobs.configs import GPTRunConfig
from memplan.service.jobs.runner import run_one
from memplan.service.jobs.store import JobState, JobStore
from memplan.service.settings import Settings

from tests.service.server import Server, wait_finished

RUN = "memplan.service.jobs.kinds:run_job"
PROFILE = "memplan.service.jobs.kinds:profile_job"
SMALL = {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16, "vocab_size": 64, "batch_size": 2}
LIMIT = 1 << 30  # MEMPLAN_JOB_MAX_BYTES of the server below


@pytest.fixture(scope="module")
def admit_server(tmp_path_factory):
    """The built-in job functions, no worker (nothing runs: admission only), 1 GiB a job, 1 h."""
    srv = Server(tmp_path_factory.mktemp("svc-admit"), env={
        "MEMPLAN_RUN_JOB": RUN, "MEMPLAN_PROFILE_JOB": PROFILE, "MEMPLAN_START_WORKER": "false",
        "MEMPLAN_JOB_MAX_BYTES": str(LIMIT), "MEMPLAN_JOB_TIMEOUT_S": "3600", "MEMPLAN_DEVICE": "cpu",
        "MEMPLAN_MAX_QUEUE_DEPTH": "1000",
    }).start(ready=False)
    yield srv
    srv.stop()


@pytest.fixture
def ac(admit_server):
    with httpx.Client(base_url=admit_server.url, timeout=60) as c:
        yield c


def _fields(r: httpx.Response) -> list[str]:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    return [e["field"] for e in r.json()["errors"]]


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/runs", {"model": "llama"}, "body.model"),
    ("/v1/profiles", {"model": "llama"}, "body.model"),
    ("/v1/runs", {"config": {"colour": "red"}}, "body.config.colour"),
    ("/v1/runs", {"config": {"n_layer": 2000, "n_embd": 4096}}, "body.config.n_layer"),
    ("/v1/runs", {"config": {"n_layer": 0}}, "body.config.n_layer"),
    ("/v1/runs", {"config": {"n_layer": True}}, "body.config.n_layer"),  # no booleans as numbers
    ("/v1/runs", {"config": {"n_embd": 100, "n_head": 3}}, "body.config.n_head"),
    ("/v1/runs", {"config": {"repeats": 1_000_000_000}}, "body.config.repeats"),
    ("/v1/runs", {"model": "conv", "config": {"n_embd": 64}}, "body.config.n_embd"),
    ("/v1/runs", {"config": {"dropout": 1.5}}, "body.config.dropout"),
    ("/v1/runs", {"steps": 10_001}, "body.steps"),
    ("/v1/runs", {"timeout_s": 3601}, "body.timeout_s"),  # above the server's job_timeout_s
    ("/v1/profiles", {"repeats": 1_000_000_000}, "body.repeats"),
    ("/v1/profiles", {"config": {"n_layer": 10_001}, "analytic": True}, "body.config.n_layer"),
    ("/v1/profiles", {"config": {"n_layer": 1025, "n_embd": 64, "n_head": 4}}, "body.config.n_layer"),  # measured
    ("/v1/profiles", {"config": {"exit_layers": 3}}, "body.config.exit_layers"),
    ("/v1/profiles", {"config": {"moe_experts": 4, "moe_top_k": 8}}, "body.config.moe_top_k"),
    ("/v1/profiles", {"model": "conv", "config": {"image_size": 30}}, "body.config.image_size"),
])
def test_bad_configs_are_422_naming_the_field(ac, path, body, field):
    assert _fields(ac.post(path, json=body)) == [field]


def test_memory_estimate_refuses_exactly_past_the_limit(ac):
    """The estimate is replayed by the simulator from the analytic profile; the server refuses a
    config whose estimate is over MEMPLAN_JOB_MAX_BYTES and accepts one just under it."""
    settings = Settings(job_max_bytes=LIMIT, device="cpu")

    def need(batch: int) -> int:
        cfg = GPTRunConfig(**{**SMALL, "n_embd": 256, "n_head": 4, "block_size": 256, "batch_size": batch})
        return estimate("run", "gpt", cfg, {}, settings).memory_bytes

    # the largest batch under the limit (memory grows with the batch), found by bisection
    lo, hi = 1, 4096
    assert need(lo) <= LIMIT < need(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= LIMIT else (lo, mid)
    body = {"config": {**SMALL, "n_embd": 256, "n_head": 4, "block_size": 256}, "steps": 1}
    ok = ac.post("/v1/runs", json={**body, "config": {**body["config"], "batch_size": lo}})
    assert ok.status_code == 202, ok.text
    r = ac.post("/v1/runs", json={**body, "config": {**body["config"], "batch_size": hi}})
    assert _fields(r) == ["body.config"]
    assert f"{need(hi):,} bytes" in r.json()["detail"] and f"{LIMIT:,} bytes" in r.json()["detail"]
    # the reported n_layer 2000 x n_embd 4096 run, within the bounds' depth: refused by memory
    big = ac.post("/v1/runs", json={"config": {"n_layer": 1000, "n_embd": 4096, "n_head": 32}})
    assert _fields(big) == ["body.config"]


def test_time_estimate_refuses_past_the_jobs_own_limit(ac):
    """A run's steps past its own `timeout_s` at the estimated rate: 422 naming body.steps; the
    same run with a limit just above its estimate is accepted."""
    settings = Settings(job_max_bytes=LIMIT, device="cpu")
    req = {"config": {**SMALL, "n_embd": 512, "n_head": 8, "block_size": 512, "batch_size": 8}, "steps": 5000}
    est = estimate("run", "gpt", GPTRunConfig(**req["config"]), req, settings)
    assert est.time_parts["body.steps"] > est.time_parts["body.config.repeats"]
    assert ac.post("/v1/runs", json={**req, "timeout_s": est.time_s * 1.01}).status_code == 202
    r = ac.post("/v1/runs", json={**req, "timeout_s": est.time_s * 0.99})
    assert _fields(r) == ["body.steps"]
    # profiles: their repeats
    preq = {"config": {"n_layer": 48, "n_embd": 1600, "n_head": 25, "batch_size": 1}, "repeats": 1000}
    r = ac.post("/v1/profiles", json={**preq, "timeout_s": 1})
    assert _fields(r) in (["body.repeats"], ["body.config"])  # whichever limit it meets first
    with pytest.raises(AdmissionError) as err:
        admit("profile", {**preq, "timeout_s": 1}, Settings(device="cpu", job_max_bytes=1 << 50), job_path=PROFILE)
    assert err.value.field == "body.repeats"
    # an analytic profile executes nothing: a model far larger than the machine is admitted
    big = {"config": {"n_layer": 96, "n_embd": 12288, "n_head": 96}, "analytic": True}
    assert ac.post("/v1/profiles", json=big).status_code == 202
    deep = {"config": {"n_layer": 10_000, "n_embd": 64, "n_head": 4}, "analytic": True}
    assert ac.post("/v1/profiles", json=deep).status_code == 202


def test_other_job_functions_judge_their_own_config():
    """A server's own job functions (the tests' fakes) get their config unchecked here."""
    assert admit("run", {"config": {"sleep_s": 1}}, Settings(), job_path="tests.service.fake_jobs:run") is None
    with pytest.raises(AdmissionError) as err:  # but the job's time limit is the server's at most
        admit("run", {"timeout_s": 10.0}, Settings(job_timeout_s=5), job_path="tests.service.fake_jobs:run")
    assert err.value.field == "body.timeout_s"


def oom_job(request: dict, ctx) -> dict:
    """Runs out of memory the way the request says."""
    if request["how"] == "python":
        raise MemoryError()
    import torch

    torch.empty(1 << 55, dtype=torch.uint8)  # the CPU allocator refuses: a RuntimeError
    return {}


@pytest.mark.parametrize("how", ["python", "torch"])
def test_out_of_memory_is_reported_as_such(tmp_path, how):
    if how == "torch":
        pytest.importorskip("torch")
    store = JobStore(tmp_path / "jobs.sqlite")
    job, _ = store.submit("run", {"how": how})
    claimed = store.claim("w")
    state = run_one(store, job.id, Settings(run_job="tests.service.test_configs:oom_job"), lease=claimed.lease)
    done = store.get(job.id)
    assert state is JobState.failed and done.error.type == "out-of-memory", done.error


def test_worker_stops_a_job_over_its_memory_limit_and_a_job_past_its_own_time_limit(tmp_path):
    srv = Server(tmp_path / "svc", env={"MEMPLAN_JOB_MAX_BYTES": str(96 << 20)}).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            hog = c.post("/v1/runs", json={"steps": 400, "config": {"sleep_s": 0.05, "hold_mib": 256}})
            slow = c.post("/v1/runs", json={"steps": 400, "timeout_s": 1.5, "config": {"sleep_s": 0.05}})
            h = wait_finished(c, hog.headers["location"], timeout_s=120)
            assert h["state"] == "failed" and h["error"]["type"] == "out-of-memory", h
            assert f"{96 << 20:,}" in h["error"]["detail"]
            s = wait_finished(c, slow.headers["location"], timeout_s=120)
            assert s["state"] == "failed" and s["error"]["type"] == "timeout", s
            assert "timeout_s=1.5 s" in s["error"]["detail"] and s["progress"] < 1
    finally:
        srv.stop()
