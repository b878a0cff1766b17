"""Offload in the REST run job: `offload_bandwidth` (bytes/s) and `host_memory_bytes` are checked
at submission (422 naming the field), reach the job's RunSpec and the planner, and on the CPU a
plan that moves activations fails the job with the runner's one line while a plan that moves none
runs (tests/executor/test_run_offload.py says why 25 GB/s moves one and 1 byte/s none)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from memplan.executor.offload import CPU_REFUSAL, has_transfers
from memplan.service.app import create_app
from memplan.service.jobs.runner import run_one
from memplan.service.jobs.store import JobState, JobStore
from memplan.service.routers.runs import RunRequest
from memplan.service.settings import Settings

TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16, "vocab_size": 64, "batch_size": 2,
        "dropout": 0.0, "repeats": 1}
REFUSAL = "--offload-bandwidth: " + CPU_REFUSAL.removeprefix("offload: ")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("run-offload"), start_worker=False)
    with TestClient(create_app(settings)) as c:
        yield c


def _fields(r) -> list[str]:
    assert r.status_code == 422, r.text
    return [e["field"] for e in r.json()["errors"]]


@pytest.mark.parametrize(("extra", "field"), [
    ({"offload_bandwidth": 0}, "body.offload_bandwidth"),
    ({"offload_bandwidth": -25e9}, "body.offload_bandwidth"),
    ({"offload_bandwidth": 2e15}, "body.offload_bandwidth"),
    ({"offload_bandwidth": "25GB/s"}, "body.offload_bandwidth"),
    ({"offload_bandwidth": True}, "body.offload_bandwidth"),
    ({"offload_bandwidth": 25e9, "host_memory_bytes": -1}, "body.host_memory_bytes"),
    ({"offload_bandwidth": 25e9, "host_memory_bytes": 1.5}, "body.host_memory_bytes"),
    ({"offload_bandwidth": 25e9, "host_memory_bytes": 2**61}, "body.host_memory_bytes"),
    ({"host_memory_bytes": 2**30}, "body.host_memory_bytes"),  # nothing is offloaded without a bandwidth
    ({"offload_bandwidth": 25e9, "strategy": "sqrt"}, "body.offload_bandwidth"),  # only optimal offloads
    ({"config": {**TINY, "offload_bandwidth": 25e9}}, "body.config.offload_bandwidth"),  # a body field
])
def test_bad_offload_options_are_refused_at_submission_naming_the_field(client, extra, field):
    r = client.post("/v1/runs", json={"config": TINY, "steps": 1, "device": "cpu", **extra})
    assert _fields(r) == [field]
    assert r.headers["content-type"].startswith("application/problem+json")


def test_a_host_bound_over_the_job_memory_limit_is_refused(tmp_path):
    settings = Settings(data_dir=tmp_path, start_worker=False, job_max_bytes=2**40)
    body = {"config": TINY, "steps": 1, "device": "cpu", "offload_bandwidth": 25e9}
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/runs", json={**body, "host_memory_bytes": 2**40 + 1})
        assert _fields(r) == ["body.host_memory_bytes"]
        assert "1,099,511,627,776" in r.json()["errors"][0]["message"]  # names the limit
        assert c.post("/v1/runs", json={**body, "host_memory_bytes": 2**40}).status_code == 202


@pytest.mark.parametrize("raw", [b"Infinity", b"NaN"])
def test_a_bandwidth_that_is_not_finite_is_refused(client, raw):
    r = client.post("/v1/runs", content=b'{"steps": 1, "offload_bandwidth": ' + raw + b"}",
                    headers={"content-type": "application/json"})
    assert _fields(r) == ["body.offload_bandwidth"]


def test_the_options_are_kept_in_the_job_as_given(client):
    body = {"config": TINY, "steps": 1, "device": "cpu", "offload_bandwidth": 25e9, "host_memory_bytes": 2**30}
    r = client.post("/v1/runs", json=body)
    assert r.status_code == 202, r.text
    request = r.json()["request"]
    assert request["offload_bandwidth"] == 25e9 and request["host_memory_bytes"] == 2**30
    plain = client.post("/v1/runs", json={"config": TINY, "steps": 1, "device": "cpu"}).json()["request"]
    assert plain["offload_bandwidth"] is None and plain["host_memory_bytes"] is None


def _run(tmp_path, **options):
    """A tiny GPT run job with `options`, run in this process through the worker's run_one."""
    store = JobStore(tmp_path / "jobs.sqlite")
    request = RunRequest(model="gpt", config=TINY, steps=1, device="cpu", **options).model_dump(mode="json")
    job, _ = store.submit("run", request)
    claimed = store.claim("w")
    settings = Settings(data_dir=tmp_path, run_job="memplan.service.jobs.kinds:run_job", device="cpu")
    assert run_one(store, job.id, settings, lease=claimed.lease) is store.get(job.id).state
    return store.get(job.id)


@pytest.mark.slow
def test_an_offload_plan_on_the_cpu_fails_the_job_with_one_line(tmp_path):
    job = _run(tmp_path, offload_bandwidth=25e9)
    assert job.state is JobState.failed and job.error.type == "invalid-input", job.error
    assert job.error.detail == REFUSAL and "\n" not in job.error.detail


@pytest.mark.slow
def test_a_plan_that_moves_nothing_runs_on_the_cpu(tmp_path):
    job = _run(tmp_path, offload_bandwidth=1.0, host_memory_bytes=2**30)
    assert job.state is JobState.succeeded, job.error
    plan = job.result["extras"]["plan"]
    assert plan["options"]["offload_bandwidth"] == 1.0 and plan["options"]["host_memory_bytes"] == 2**30
    assert not has_transfers(plan["schedule"]) and job.result["status"] == "ok", job.result["message"]
