"""`/v1/sweeps` on the local worker, and `memplan sweep`: the grid, its report and plot, its errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.service.server import wait_for

TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16, "vocab_size": 64,
        "batch_size": 2, "dropout": 0.0, "repeats": 1}


def test_sweep_measured_on_the_local_worker(client):
    body = {"models": [{"label": "tiny", "config": TINY}], "budgets_bytes": [None, 1],
            "strategies": ["store-all"], "precisions": ["fp32"], "steps": 2, "device": "cpu"}
    r = client.post("/v1/sweeps", json=body)
    assert r.status_code == 202 and r.headers["location"] == f"/v1/sweeps/{r.json()['id']}"
    sweep = r.json()
    assert sweep["n_cells"] == 2 and sweep["state"] in ("queued", "running")
    assert client.get(f"/v1/sweeps/{sweep['id']}/plot.png").status_code in (409, 200)
    # the cells are jobs of their own kind: not listed among the runs
    assert all(j["id"] not in sweep["jobs"] for j in client.get("/v1/runs").json()["items"])
    done = wait_for(lambda: (s := client.get(f"/v1/sweeps/{sweep['id']}").json())["report"] and s,
                    timeout_s=120, every_s=0.3, what="the sweep")
    assert done["state"] == "succeeded" and done["progress"] == 1.0
    rep = done["report"]
    ok, tight = rep["cells"]
    # measured profile, store-all: the run allocates exactly the replay's peak
    assert ok["ran"] and ok["run_status"] == "ok" and ok["grad_max_rel_diff"] == 0.0
    assert ok["measured_peak_bytes"] == ok["predicted_peak_bytes"]
    assert ok["measured_fixed_bytes"] == ok["fixed_bytes_per_gpu"]
    # a 1-byte budget: infeasible is a result, not a failure; it is not run
    assert tight["state"] == "succeeded" and tight["feasible"] is False and not tight["ran"]
    assert "least" in tight["message"] or "budget" in tight["message"]
    assert rep["pareto"] == {"tiny / fp32": [0]}
    png = client.get(done["plot_url"])
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"


@pytest.mark.parametrize(("patch", "field"), [
    ({"strategies": ["fastest"]}, "strategies.0: unknown 'fastest'"),
    ({"precisions": ["bf16"]}, "precisions.0: 'bf16' can be planned but not run"),
    ({"models": [{"config": {"n_layers": 3}}]}, "models.0.config.n_layers: not a model setting"),
    ({"budgets_bytes": [None] * 64, "strategies": ["optimal", "uniform", "sqrt", "store-all", "heuristic"]},
     "cells, more than 256"),
])
def test_bad_sweeps_are_422_naming_the_field(client, patch, field):
    body = {"models": [{"config": TINY}], **patch}
    r = client.post("/v1/sweeps", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]


def test_unknown_field_and_missing_sweep(client):
    r = client.post("/v1/sweeps", json={"models": [{}], "budget": 3})
    assert r.status_code == 422 and "budget" in r.text
    assert client.get("/v1/sweeps/nope").status_code == 404


def test_cancel_a_sweep(client):
    body = {"models": [{"config": {**TINY, "n_layer": 4}}], "budgets_bytes": [None, None, None],
            "strategies": ["store-all"], "device": "cpu", "profile": "measured", "steps": 5}
    sweep = client.post("/v1/sweeps", json=body).json()
    out = client.post(f"/v1/sweeps/{sweep['id']}/cancel").json()
    done = wait_for(lambda: (s := client.get(f"/v1/sweeps/{sweep['id']}").json())["report"] and s,
                    timeout_s=60, every_s=0.2, what="the cancelled sweep")
    assert out["id"] == sweep["id"]
    assert done["state"] == "cancelled" and done["report"]["cancelled"] >= 1


def test_cli_sweep_plan_only(tmp_path):
    from memplan.cli import app

    spec = tmp_path / "sweep.json"
    spec.write_text(json.dumps({
        "models": [{"label": "t", "config": TINY}], "budgets_bytes": [None, 110_000],
        "strategies": ["optimal"], "precisions": ["fp32", "zero-mixed"], "n_gpus": 4,
        "zero_stage": 1, "profile": "analytic", "run": False,
    }))
    png = tmp_path / "s.png"
    res = CliRunner().invoke(app, ["sweep", str(spec), "--json", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["n_cells"] == 4 and rep["ran"] == 0 and png.read_bytes()[:4] == b"\x89PNG"
    fp32, zero = rep["cells"][0], rep["cells"][2]
    # zero-mixed computes in 16 bits: its activations are the pure bf16 model's (they were fp32's)
    import torch
    from memplan.planner import plan
    from memplan.profiler.analytic import gpt_analytic_profile

    cfg = {k: v for k, v in TINY.items() if k != "repeats"}
    bf16 = gpt_analytic_profile({**cfg, "attention": "math"}, precision="bf16",
                                cpu_threads=torch.get_num_threads())
    assert zero["predicted_peak_bytes"] == plan(bf16, strategy="optimal").predicted.peak_bytes
    assert zero["predicted_peak_bytes"] < fp32["predicted_peak_bytes"]
    assert zero["fixed_bytes_per_gpu"] < fp32["fixed_bytes_per_gpu"]  # 2 + 2 + 12/4 < 4 + 4 + 8/4
    bad = CliRunner().invoke(app, ["sweep", str(spec), "--plot", "x.jpg"])
    assert bad.exit_code == 2 and "--plot" in bad.output


@pytest.mark.parametrize(("model", "field"), [
    ({"config": {**TINY, "n_layer": 5000}}, "body.models.1.config.n_layer"),
    ({"config": {**TINY, "n_embd": 33}}, "body.models.1.config.n_head"),
    ({"config": {"n_layer": 1000, "n_embd": 8192, "n_head": 64, "block_size": 4096, "batch_size": 64}},
     "body.models.1.config"),  # its estimated memory is over the worker's limit
])
def test_a_sweep_models_config_is_checked_like_a_runs(client, model, field):
    body = {"models": [{"config": TINY}, model], "run": False}
    r = client.post("/v1/sweeps", json=body)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == [field]


SIX = {"models": [{"config": TINY}], "budgets_bytes": [None, 1, 2, 3, 4, 5], "run": False,
       "profile": "analytic"}


def test_concurrent_sweeps_never_take_the_queue_past_its_limit(tmp_path):
    """Six 6-cell sweeps at once against a queue of 10 (no worker, so nothing drains it): one is
    accepted, five get 429, and the store holds exactly its 6 jobs."""
    import sqlite3
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from tests.service.server import Server

    body = {**SIX, "models": [{"config": {**TINY, "dropout": 0.0}}]}
    srv = Server(tmp_path / "svc", env={"MEMPLAN_MAX_QUEUE_DEPTH": "10", "MEMPLAN_START_WORKER": "false"})
    srv.start(ready=False)
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:  # warm the sweep route's imports
            assert c.post("/v1/sweeps", json={**body, "strategies": ["nope"]}).status_code == 422
        gate = threading.Barrier(6)

        def post() -> int:
            with httpx.Client(base_url=srv.url, timeout=120) as c:
                gate.wait()
                return c.post("/v1/sweeps", json=body).status_code

        with ThreadPoolExecutor(6) as pool:
            codes = sorted(pool.map(lambda _: post(), range(6)))
    finally:
        srv.stop()
    assert codes == [202, 429, 429, 429, 429, 429]
    with sqlite3.connect(tmp_path / "svc" / "jobs.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 6
        assert conn.execute("SELECT COUNT(*) FROM sweeps").fetchone()[0] == 1


def test_submit_many_checks_room_and_inserts_in_one_transaction(tmp_path):
    """The store alone, six threads with their own connections: never more than the limit."""
    import threading

    from memplan.service.jobs.store import JobStore, QueueFull

    path = tmp_path / "jobs.sqlite"
    JobStore(path)
    gate = threading.Barrier(6)
    out: list[str] = []

    def one() -> None:
        store = JobStore(path)
        gate.wait()
        try:
            store.submit_many("sweep-cell", [{"i": i} for i in range(6)], max_depth=10)
            out.append("ok")
        except QueueFull:
            out.append("full")

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out) == ["full"] * 5 + ["ok"]
    assert JobStore(path).depth() == 6
