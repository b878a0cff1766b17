"""The real job functions through the server: a tiny GPT validation run and a profile, on the
server's device (CPU here), and a cancel that frees GPU memory where there is a GPU."""

from __future__ import annotations

import httpx
import pytest

from tests.service.server import Server, wait_finished, wait_for

TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16, "vocab_size": 64, "batch_size": 2}


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    srv = Server(
        tmp_path_factory.mktemp("svc-real"),
        env={"MEMPLAN_RUN_JOB": "memplan.service.jobs.kinds:run_job", "MEMPLAN_PROFILE_JOB": "memplan.service.jobs.kinds:profile_job"},
    ).start()
    yield srv
    srv.stop()


def _finish(c: httpx.Client, loc: str) -> dict:
    return wait_finished(c, loc, timeout_s=240, every_s=0.5)


@pytest.mark.slow
def test_real_run_and_profile(real_server):
    pytest.importorskip("memplan.executor.pipeline")
    with httpx.Client(base_url=real_server.url, timeout=30) as c:
        run = c.post("/v1/runs", json={"model": "gpt", "config": TINY, "steps": 2, "strategy": "sqrt", "device": "cpu"})
        prof = c.post("/v1/profiles", json={"model": "gpt", "config": TINY, "repeats": 1, "warmup": 0, "timing": "stage",
                                          "device": "cpu"})
        # a config the run's model does not have is refused at submission, not a failed job later
        bad = c.post("/v1/runs", json={"config": {"colour": "red"}, "steps": 1, "device": "cpu"})
        assert bad.status_code == 422, bad.text
        assert [e["field"] for e in bad.json()["errors"]] == ["body.config.colour"]
        job = _finish(c, run.headers["location"])
        assert job["state"] == "succeeded", job
        report = job["result"]
        assert report["strategy"] == "sqrt" and report["n_stages"] == 4
        assert report["measured_peak_bytes"] > 0 and report["extras"]["plan"]["strategy"] == "sqrt"
        p = _finish(c, prof.headers["location"])
        assert p["state"] == "succeeded" and len(p["result"]["layers"]) == 4
        assert p["result"]["meta"]["timing"] == "stage"
        # a profile from the server plans like any other
        plan = c.post("/v1/plans", json={"profile": p["result"], "strategy": "store-all"})
        assert plan.status_code == 200 and plan.json()["feasible"]


@pytest.mark.gpu
def test_cancel_frees_gpu_memory(tmp_path):
    import torch

    srv = Server(tmp_path / "svc").start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            free0, _ = torch.cuda.mem_get_info()
            r = c.post("/v1/runs", json={"steps": 2000, "config": {"sleep_s": 0.05, "cuda_mib": 4096}})
            loc = r.headers["location"]
            wait_for(lambda: c.get(loc).json()["progress"] > 0, timeout_s=120, what="the run to hold memory")
            held = free0 - torch.cuda.mem_get_info()[0]
            assert held >= 4096 << 20
            assert c.post(loc + "/cancel").status_code == 202
            assert _finish(c, loc)["state"] == "cancelled"
            wait_for(lambda: free0 - torch.cuda.mem_get_info()[0] < 256 << 20, timeout_s=30,
                     what="the device memory to come back")
    finally:
        srv.stop()
