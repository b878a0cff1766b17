"""A job's artifacts (NOTE [ Job artifacts ] in service/jobs/artifacts.py): the store keeps them
under the start's lease, bounded in size, and a new start clears them; a real run job on the CPU
keeps its measured timeline, whose numbers are the run's reported measured peak, and lists the
allocator snapshot as absent with the reason; the route serves them with their media type and
refuses unknown and path-like names."""

from __future__ import annotations

import json

import httpx
import pytest
from memplan.service.jobs import store as store_mod
from memplan.service.jobs.artifacts import check_name
from memplan.service.jobs.store import JobState, JobStore

from tests.service.server import Server, wait_finished

TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16, "vocab_size": 64, "batch_size": 2,
        "dropout": 0.0}


@pytest.fixture
def running(tmp_path):
    """A store with one job claimed (running under a lease): (store, job)."""
    s = JobStore(tmp_path / "jobs.sqlite")
    s.submit("run", {"steps": 1})
    job = s.claim("w1")
    assert job is not None and job.lease
    return s, job


def test_kept_artifacts_are_listed_and_served_from_the_store(running):
    s, job = running
    data = bytes(range(256)) * 3
    info = s.keep_artifact(job.id, "snapshot.pickle", data, lease=job.lease)
    assert info.size_bytes == 768 and info.href == f"/v1/jobs/{job.id}/artifacts/snapshot.pickle"
    assert info.media_type == "application/octet-stream"
    s.artifact_absent(job.id, "timeline.json", "no reason at all", lease=job.lease)
    assert s.finish(job.id, JobState.succeeded, result={}, lease=job.lease)
    got = s.get(job.id)
    assert [(a.name, a.size_bytes, a.reason) for a in got.artifacts] == [
        ("snapshot.pickle", 768, None), ("timeline.json", None, "no reason at all")]
    assert got.artifacts[1].href is None
    assert s.artifact(job.id, "snapshot.pickle") == ("application/octet-stream", data)
    assert s.artifact(job.id, "timeline.json") is None
    # kept again under the same name: replaced, listed once
    s2 = JobStore(s.path)
    assert s2.list()[0].artifacts == got.artifacts


def test_artifact_writes_are_fenced_by_the_lease_and_a_new_start_clears_them(running):
    s, job = running
    assert s.keep_artifact(job.id, "timeline.json", b"{}", lease="not-this-start") is None
    assert s.get(job.id).artifacts == []
    assert s.keep_artifact(job.id, "timeline.json", b"{}", lease=job.lease) is not None
    assert s.keep_artifact(job.id, "timeline.json", b"[1]", lease=job.lease).size_bytes == 3
    assert [a.name for a in s.get(job.id).artifacts] == ["timeline.json"]
    assert s.requeue(job.id, message="worker stopping", lease=job.lease)
    again = s.claim("w2")
    assert again.id == job.id and again.artifacts == [] and s.artifact(job.id, "timeline.json") is None
    # the old start's write changes nothing now
    assert s.keep_artifact(job.id, "timeline.json", b"{}", lease=job.lease) is None
    s.finish(job.id, JobState.succeeded, result={}, lease=again.lease)
    assert s.keep_artifact(job.id, "late.json", b"{}") is None  # finished: no more files


def test_an_artifact_over_the_limit_is_listed_absent_with_its_size(running, monkeypatch):
    s, job = running
    monkeypatch.setattr(store_mod, "MAX_ARTIFACT_BYTES", 100)
    monkeypatch.setattr(store_mod, "MAX_JOB_ARTIFACT_BYTES", 150)
    assert s.keep_artifact(job.id, "a.json", b"x" * 100, lease=job.lease).size_bytes == 100
    big = s.keep_artifact(job.id, "b.json", b"x" * 101, lease=job.lease)
    assert big.href is None and big.reason.startswith("101 bytes, over the store's limit of 100 bytes")
    over = s.keep_artifact(job.id, "c.json", b"x" * 60, lease=job.lease)  # 100 + 60 > 150 a job
    assert over.href is None and "100 held already" in over.reason
    assert s.artifact(job.id, "b.json") is None and s.artifact(job.id, "c.json") is None


@pytest.mark.parametrize("name", ["..", "../jobs.sqlite", "a/b", ".hidden", "x" * 65, "a..b", "", "a b",
                                  "a\\b", "%2e%2e"])
def test_path_like_names_are_refused(name):
    with pytest.raises(ValueError, match="not an artifact name"):
        check_name(name)


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("svc-artifacts"), env={
        "MEMPLAN_RUN_JOB": "memplan.service.jobs.kinds:run_job",
        "MEMPLAN_PROFILE_JOB": "memplan.service.jobs.kinds:profile_job", "MEMPLAN_DEVICE": "cpu",
    }).start()
    yield srv
    srv.stop()


@pytest.mark.slow
def test_a_cpu_run_keeps_its_measured_timeline(real_server):
    from memplan.planner.timeline import PlanTimeline

    with httpx.Client(base_url=real_server.url, timeout=30) as c:
        r = c.post("/v1/runs", json={"model": "gpt", "config": TINY, "steps": 2, "strategy": "sqrt",
                                     "device": "cpu"})
        assert r.status_code == 202, r.text
        job = wait_finished(c, r.headers["location"], timeout_s=240, every_s=0.5)
        assert job["state"] == "succeeded", job
        report = job["result"]
        arts = {a["name"]: a for a in job["artifacts"]}
        assert set(arts) == {"timeline.json", "snapshot.pickle"}
        snap = arts["snapshot.pickle"]
        assert snap["href"] is None and snap["size_bytes"] is None and "cpu" in snap["reason"]
        tl_info = arts["timeline.json"]
        assert tl_info["href"] == f"/v1/jobs/{job['id']}/artifacts/timeline.json"
        got = c.get(tl_info["href"])
        assert got.status_code == 200 and got.headers["content-type"] == "application/json"
        assert got.headers["content-disposition"] == 'attachment; filename="timeline.json"'
        assert len(got.content) == tl_info["size_bytes"]
        tl = PlanTimeline.model_validate_json(got.content)
        # the same plan measured op by op: its largest op is the run's measured peak, its
        # prediction the run's predicted peak, its schedule the plan's
        assert max(tl.measured_bytes) == report["measured_peak_bytes"]
        assert tl.peak_bytes == report["predicted_peak_bytes"] == max(tl.predicted_bytes)
        assert len(tl.ops) == len(report["extras"]["plan"]["schedule"]) and tl.measured_device == "cpu"
        assert tl.strategy == "sqrt" and tl.snapshot is None
        # the run list carries the same listing
        listed = c.get("/v1/runs", params={"limit": 1}).json()["items"][0]
        assert listed["id"] == job["id"] and listed["artifacts"] == job["artifacts"]

        # an absent artifact: 404 saying why; an unknown one: 404 naming those there are
        absent = c.get(f"/v1/jobs/{job['id']}/artifacts/snapshot.pickle")
        assert absent.status_code == 404 and absent.headers["content-type"].startswith("application/problem+json")
        assert "did not keep 'snapshot.pickle'" in absent.json()["detail"] and "cpu" in absent.json()["detail"]
        unknown = c.get(f"/v1/jobs/{job['id']}/artifacts/nothing.json")
        assert unknown.status_code == 404 and unknown.headers["content-type"].startswith("application/problem+json")
        assert "timeline.json" in unknown.json()["detail"]
        assert c.get("/v1/jobs/0123456789abcdef/artifacts/timeline.json").status_code == 404
        # names that try to leave the job's rows: refused, never a file
        for raw in ("..%2F..%2Fjobs.sqlite", "%2E%2E", ".hidden", "a..b", "%2e%2e%5cx", "jobs.sqlite%00"):
            bad = c.get(f"/v1/jobs/{job['id']}/artifacts/{raw}")
            assert bad.status_code in (404, 422), (raw, bad.status_code)
            assert bad.headers["content-type"].startswith("application/problem+json"), raw
            if bad.status_code == 422:
                assert [e["field"] for e in bad.json()["errors"]] == ["path.name"]
        assert c.get(f"/v1/jobs/{job['id']}/artifacts/.hidden").status_code == 422


def test_artifacts_need_the_api_key(strict_server):
    with httpx.Client(base_url=strict_server.url, timeout=30) as c:
        r = c.get("/v1/jobs/0123456789abcdef/artifacts/timeline.json")
        assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json")
        r = c.get("/v1/jobs/0123456789abcdef/artifacts/timeline.json", headers={"X-API-Key": "s3cret"})
        assert r.status_code == 404


def test_the_fake_run_keeps_a_timeline_through_the_api(client):
    """The queue's plumbing end to end (fake job function): kept by the runner, listed, served."""
    r = client.post("/v1/runs", json={"steps": 1, "config": {"timeline": 5}})
    job = wait_finished(client, r.headers["location"], timeout_s=60)
    assert job["state"] == "succeeded", job
    href = next(a["href"] for a in job["artifacts"] if a["name"] == "timeline.json")
    tl = json.loads(client.get(href).content)
    assert tl["format"] == "memplan-timeline/1" and len(tl["measured_bytes"]) == len(tl["ops"])


@pytest.mark.gpu
def test_a_cuda_run_keeps_its_allocator_snapshot(tmp_path):
    """On CUDA the run keeps the measured step's allocator history for PyTorch's memory viewer,
    beside the timeline; the snapshot downloads as bytes and unpickles to a memory_viz snapshot."""
    import pickle

    from memplan.planner.timeline import PlanTimeline

    srv = Server(tmp_path / "svc", env={"MEMPLAN_RUN_JOB": "memplan.service.jobs.kinds:run_job",
                                        "MEMPLAN_DEVICE": "cuda"}).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            r = c.post("/v1/runs", json={"model": "gpt", "config": {**TINY, "n_embd": 64},
                                         "steps": 2, "strategy": "sqrt", "device": "cuda"})
            assert r.status_code == 202, r.text
            job = wait_finished(c, r.headers["location"], timeout_s=300, every_s=0.5)
            assert job["state"] == "succeeded", job["error"]
            arts = {a["name"]: a for a in job["artifacts"]}
            snap = c.get(arts["snapshot.pickle"]["href"])
            assert snap.status_code == 200 and snap.headers["content-type"] == "application/octet-stream"
            data = pickle.loads(snap.content)
            assert {"segments", "device_traces"} <= set(data) and any(data["device_traces"])
            tl = PlanTimeline.model_validate_json(c.get(arts["timeline.json"]["href"]).content)
            assert tl.measured_device.startswith("cuda") and tl.snapshot == "snapshot.pickle"
            assert max(tl.measured_bytes) == pytest.approx(job["result"]["measured_peak_bytes"], rel=0.01)
    finally:
        srv.stop()
