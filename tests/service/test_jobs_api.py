"""Runs and profiles against a live server with fake job functions: the queue's HTTP contract."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from tests.service.server import process_gone, wait_finished, wait_for

PROBLEM = "application/problem+json"


def _finished(client: httpx.Client, location: str, timeout_s: float = 30.0) -> dict:
    return wait_finished(client, location, timeout_s=timeout_s)


def test_health_ready_info(client):
    assert client.get("/v1/healthz").json() == {"status": "ok"}
    ready = client.get("/v1/readyz").json()
    assert ready["status"] == "ready" and ready["store_writable"] and ready["worker_alive"]
    info = client.get("/v1/info").json()
    assert info["versions"]["memplan"] and info["versions"]["python"]
    assert info["limits"]["max_body_bytes"] == 16 << 20
    assert info["auth_required"] is False
    assert "uniform" in info["strategies"]
    # the worker's device probe lands within a few seconds (it imports torch in a subprocess)
    dev = wait_for(lambda: client.get("/v1/info").json()["device"], timeout_s=60, what="device probe")
    assert dev["kind"] in ("cpu", "cuda")


def test_run_lifecycle(client):
    r = client.post("/v1/runs", json={"steps": 4, "config": {"sleep_s": 0.02, "echo": "hi"}})
    assert r.status_code == 202
    loc = r.headers["location"]
    assert loc == f"/v1/runs/{r.json()['id']}"
    assert r.json()["state"] in ("queued", "running")
    job = _finished(client, loc)
    assert job["state"] == "succeeded" and job["progress"] == 1.0
    assert job["result"]["steps"] == 4 and job["result"]["echo"] == "hi"
    assert job["attempts"] == 1 and job["started_at"] <= job["finished_at"]
    listed = client.get("/v1/runs", params={"state": "succeeded", "limit": 500}).json()["items"]
    assert job["id"] in [j["id"] for j in listed]
    # the run is not a profile
    assert client.get(loc.replace("/runs/", "/profiles/")).status_code == 404


def test_events_stream_and_resume(client):
    r = client.post("/v1/runs", json={"steps": 3, "config": {"sleep_s": 0.15}})
    loc = r.headers["location"]
    with client.stream("GET", loc + "/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        text = stream.read().decode()
    blocks = [b for b in text.split("\n\n") if b.startswith("id:") or b.startswith("event:")]
    events = [dict(line.split(": ", 1) for line in b.splitlines()) for b in blocks]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "state" and kinds[-1] == "end"
    assert kinds.count("progress") == 3
    assert '"succeeded"' in events[-1]["data"]
    ids = [int(e["id"]) for e in events if "id" in e]
    assert ids == sorted(ids)
    # resume after the second event: the rest, and only the rest
    with client.stream("GET", loc + "/events", headers={"Last-Event-ID": str(ids[1])}) as stream:
        rest = stream.read().decode()
    rest_ids = [int(line[4:]) for line in rest.splitlines() if line.startswith("id: ")]
    assert rest_ids == ids[2:]
    bad = client.get(loc + "/events", headers={"Last-Event-ID": "abc"})
    assert bad.status_code == 422 and bad.headers["content-type"].startswith(PROBLEM)
    # beyond SQLite's integers: refused up front, not a stream broken mid-flight (schemathesis found it)
    huge = client.get(loc + "/events", params={"after": str(2**80)})
    assert huge.status_code == 422 and "query.after" in huge.text


def test_idempotency_key(client):
    body = {"steps": 1, "config": {"sleep_s": 0.0, "echo": "idem"}}
    key = f"k-{time.time_ns()}"
    a = client.post("/v1/runs", json=body, headers={"Idempotency-Key": key})
    b = client.post("/v1/runs", json=body, headers={"Idempotency-Key": key})
    assert a.status_code == 202 and b.status_code in (200, 202)
    assert a.json()["id"] == b.json()["id"] and a.headers["location"] == b.headers["location"]
    other = client.post("/v1/runs", json={**body, "steps": 2}, headers={"Idempotency-Key": key})
    assert other.status_code == 422 and "Idempotency-Key" in other.json()["detail"]
    fresh = client.post("/v1/runs", json=body)
    assert fresh.json()["id"] != a.json()["id"]
    _finished(client, a.headers["location"])
    again = client.post("/v1/runs", json=body, headers={"Idempotency-Key": key})
    assert again.status_code == 200 and again.json()["state"] == "succeeded"


def test_prefer_wait(client):
    r = client.post("/v1/runs", json={"steps": 1, "config": {"sleep_s": 0.0}}, headers={"Prefer": "wait=30"})
    assert r.status_code == 200 and r.headers["preference-applied"] == "wait"
    assert r.json()["state"] == "succeeded"


@pytest.mark.parametrize(
    ("config", "etype", "needle"),
    [
        ({"fail": True}, "invalid-input", "config.fail"),
        ({"bug": True}, "internal", "RuntimeError"),
        ({"crash": "segv"}, "crashed", "SIGSEGV"),
        ({"crash": "kill"}, "crashed", "out-of-memory"),
        ({"crash": "exit"}, "crashed", "code 3"),
    ],
)
def test_failures_are_results_and_the_api_survives(client, config, etype, needle):
    r = client.post("/v1/runs", json={"steps": 1, "config": config})
    job = _finished(client, r.headers["location"])
    assert job["state"] == "failed", job
    assert job["error"]["type"] == etype and needle in job["error"]["detail"], job["error"]
    assert client.get("/v1/readyz").status_code == 200


def test_cancel_queued_running_and_finished(client, tmp_path):
    pid_file = tmp_path / "pid"
    long = client.post(
        "/v1/runs", json={"steps": 400, "config": {"sleep_s": 0.05, "hold_mib": 64, "pid_file": str(pid_file)}}
    )
    queued = client.post("/v1/runs", json={"steps": 1, "config": {}})
    loc = long.headers["location"]
    wait_for(lambda: client.get(loc).json()["progress"] > 0, what="the long run to make progress")
    pid = int(pid_file.read_text())
    os.kill(pid, 0)  # alive, holding its memory
    c = client.post(queued.headers["location"] + "/cancel")
    assert c.status_code == 200 and c.json()["state"] == "cancelled"
    c = client.post(loc + "/cancel")
    assert c.status_code == 202 and c.json()["cancel_requested"] is True
    job = _finished(client, loc)
    assert job["state"] == "cancelled" and job["progress"] < 1.0

    # the runner process has ended: its memory (host or device) is back with the system
    wait_for(lambda: process_gone(pid), timeout_s=10, what="the cancelled runner to exit")
    again = client.post(loc + "/cancel")
    assert again.status_code == 200 and again.json()["state"] == "cancelled"
    done = client.post("/v1/runs", json={"steps": 1}, headers={"Prefer": "wait=30"})
    assert done.json()["state"] == "succeeded"
    r = client.post(done.headers["location"] + "/cancel")
    assert r.status_code == 409 and r.headers["content-type"].startswith(PROBLEM)


def test_not_found_and_validation(client):
    for path in ("/v1/runs/nope", "/v1/profiles/nope"):
        r = client.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith(PROBLEM)
    assert client.post("/v1/runs/nope/cancel").status_code == 404
    assert client.get("/v1/runs/nope/events").status_code == 404
    r = client.post("/v1/runs", json={"steps": 0})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.steps"
    r = client.post("/v1/runs", json={"features": ["warp"]})
    assert r.status_code == 422 and r.json()["errors"][0]["field"].startswith("body.features")
    r = client.post("/v1/runs", json={"gpu_count": 2})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.gpu_count"
    r = client.get("/v1/runs", params={"limit": 0})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.limit"
    r = client.post("/v1/runs", json={"steps": 1}, headers={"Idempotency-Key": ""})
    assert r.status_code == 422


def test_pagination(client):
    ids = [client.post("/v1/runs", json={"steps": 1}).json()["id"] for _ in range(3)]
    page1 = client.get("/v1/runs", params={"limit": 2}).json()
    assert len(page1["items"]) == 2 and page1["next_before"] is not None
    page2 = client.get("/v1/runs", params={"limit": 2, "before": page1["next_before"]}).json()
    seen = [j["id"] for j in page1["items"] + page2["items"]]
    assert seen[:3] == ids[::-1] and len(set(seen)) == len(seen)


def test_queue_full_429(strict_server):
    headers = {"X-API-Key": "s3cret"}
    with httpx.Client(base_url=strict_server.url, headers=headers, timeout=30) as c:
        long = {"steps": 200, "config": {"sleep_s": 0.05}}
        first = [c.post("/v1/runs", json=long) for _ in range(2)]
        assert all(r.status_code == 202 for r in first)
        r = c.post("/v1/runs", json=long)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert "MEMPLAN_MAX_QUEUE_DEPTH" in r.json()["detail"]
        for f in first:
            c.post(f.headers["location"] + "/cancel")
        for f in first:
            _finished(c, f.headers["location"])
        assert c.post("/v1/runs", json={"steps": 1}).status_code == 202


def test_profile_job(client):
    r = client.post("/v1/profiles", json={"model": "gpt", "config": {"n_layer": 3}}, headers={"Prefer": "wait=30"})
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["kind"] == "profile" and job["state"] == "succeeded"
    assert len(job["result"]["layers"]) == 3
    assert client.get(r.headers["location"]).json()["id"] == job["id"]
    assert job["id"] in [j["id"] for j in client.get("/v1/profiles").json()["items"]]
    assert client.post(r.headers["location"] + "/cancel").status_code == 409
    bad = client.post("/v1/profiles", json={"model": "gpt", "repeats": 0})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "body.repeats"


def test_openapi_and_docs(client):
    spec = client.get("/openapi.json").json()
    for path in ("/v1/plans", "/v1/plans/frontier", "/v1/runs", "/v1/runs/{run_id}/events", "/v1/profiles",
                 "/v1/healthz", "/v1/readyz", "/v1/info"):
        assert path in spec["paths"]
    assert "Problem" in spec["components"]["schemas"]
    assert client.get("/docs").status_code == 200
