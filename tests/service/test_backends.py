"""Run backends: the local worker by default, a Ray cluster when MEMPLAN_RAY_ADDRESS names one.

One local Ray cluster for the module (2 CPUs, no GPU), started by the test itself; a memplan
server whose worker is the Ray backend. The queue's plumbing uses the fake job functions (fast);
the sweep runs the real executor and is compared with the same sweep run here, cell by cell.
"""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from memplan.service.backends import backend_name, job_resources, make_worker
from memplan.service.settings import Settings

from tests.service.server import ROOT, Server, process_gone, wait_finished, wait_for


def test_backend_is_chosen_by_the_settings(tmp_path):
    local = Settings(data_dir=tmp_path)
    assert backend_name(local) == "local"
    assert make_worker(local).name == "local"
    ray_settings = Settings(data_dir=tmp_path, ray_address="127.0.0.1:1")
    assert backend_name(ray_settings) == "ray"
    # a cuda run asks for one GPU; a CPU run for one CPU; no device: cuda when the cluster has one
    assert job_resources({"device": "cuda"}, local) == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert job_resources({"device": "cpu"}, local)["num_gpus"] == 0.0
    assert job_resources({}, local, cluster_gpus=4)["num_gpus"] == 1.0
    assert job_resources({}, local, cluster_gpus=0)["num_gpus"] == 0.0


ray = pytest.importorskip("ray", reason="Ray is the optional extra memplan[ray]: pip install 'memplan[ray]'")


@pytest.fixture(scope="module")
def ray_address():
    """A local Ray cluster of 2 CPUs and no GPU; its workers can import this checkout."""
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level="warning",
             log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_server(ray_address, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("svc-ray"), env={
        "MEMPLAN_RAY_ADDRESS": ray_address,
        "MEMPLAN_RAY_PENDING_TIMEOUT_S": "3",
        "MEMPLAN_RAY_MAX_RETRIES": "2",
    }).start(timeout_s=120)
    yield srv
    srv.stop()


@pytest.fixture
def rc(ray_server):
    with httpx.Client(base_url=ray_server.url, timeout=30) as c:
        yield c


def _finish(c: httpx.Client, path: str, timeout_s: float = 90.0) -> dict:
    return wait_finished(c, path, timeout_s=timeout_s, every_s=0.2)


def test_ready_reports_the_cluster(rc):
    dev = wait_for(lambda: rc.get("/v1/info").json().get("device"), timeout_s=30, what="device")
    assert dev["kind"] == "ray" and dev["cpus"] == 2.0 and dev["gpus"] == 0.0
    assert rc.get("/v1/readyz").status_code == 200


def test_killed_worker_is_retried_not_lost(rc, tmp_path):
    pid_file = tmp_path / "pid"
    job = rc.post("/v1/runs", json={"config": {"pid_file": str(pid_file), "sleep_s": 0.25},
                                    "steps": 12, "device": "cpu"}).json()
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout_s=60, what="start"))
    os.kill(pid, signal.SIGKILL)  # the Ray worker process running the task
    done = _finish(rc, f"/v1/runs/{job['id']}")
    assert done["state"] == "succeeded", done
    assert done["attempts"] == 2 and done["result"]["pid"] != pid
    events = rc.get(f"/v1/runs/{job['id']}/events", params={"after": 0},
                    headers={"Accept": "text/event-stream"}).text
    assert "retried by Ray (start 2)" in events


def test_cancel_ends_the_task(rc, tmp_path):
    pid_file = tmp_path / "pid"
    job = rc.post("/v1/runs", json={"config": {"pid_file": str(pid_file), "sleep_s": 1.0},
                                    "steps": 60, "device": "cpu"}).json()
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout_s=60, what="start"))
    assert rc.post(f"/v1/runs/{job['id']}/cancel").status_code == 202
    done = _finish(rc, f"/v1/runs/{job['id']}")
    assert done["state"] == "cancelled"

    # ray.cancel(force=True) ends the task's worker process
    wait_for(lambda: process_gone(pid), timeout_s=30, what="the task's process to end")


def test_gpu_run_on_a_cluster_without_gpus_fails_clearly(rc):
    job = rc.post("/v1/runs", json={"device": "cuda", "steps": 1}).json()
    done = _finish(rc, f"/v1/runs/{job['id']}", timeout_s=60)
    assert done["state"] == "failed"
    err = done["error"]
    assert err["type"] == "unavailable"
    assert "1 CPU and 1 GPU" in err["detail"] and "has 0 GPU in total" in err["detail"]
    assert "MEMPLAN_RAY_PENDING_TIMEOUT_S" in err["detail"]


SWEEP = {
    "models": [
        {"label": "gpt2x32", "config": {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16,
                                        "vocab_size": 64, "batch_size": 2, "dropout": 0.0}},
        {"label": "gpt3x32", "config": {"n_layer": 3, "n_embd": 32, "n_head": 2, "block_size": 16,
                                        "vocab_size": 64, "batch_size": 2, "dropout": 0.0}},
    ],
    "budgets_bytes": [None, 116_000],  # above gpt3x32 uniform's least peak (115,588 on the math path the cell runs)
    "strategies": ["optimal", "uniform"],
    "precisions": ["fp32"],
    "profile": "analytic",
    "run": True,
    "steps": 2,
    "device": "cpu",
}
DETERMINISTIC = ("feasible", "n_stages", "fixed_bytes_per_gpu", "predicted_peak_bytes",
                 "predicted_total_bytes", "checkpoints", "ran", "run_status",
                 "measured_fixed_bytes", "grad_max_abs_diff", "grad_max_rel_diff")
def test_sweep_on_ray_equals_the_local_backend(rc):
    from memplan.executor.sweep import run_sweep

    sweep = rc.post("/v1/sweeps", json=SWEEP).json()
    assert sweep["n_cells"] == 8
    local = run_sweep(SWEEP)  # the same cells, one after another in this process
    done = wait_for(lambda: (s := rc.get(f"/v1/sweeps/{sweep['id']}").json())["report"] and s,
                    timeout_s=180, every_s=0.5, what="the sweep")
    remote = done["report"]
    # the same cells ran (112,000 B is infeasible for some: a result, not a failure), and passed
    assert remote["succeeded"] == 8 and remote["ran"] == local.ran >= 4, remote["cells"]
    assert remote["runs_ok"] == local.runs_ok == local.ran
    for got, want in zip(remote["cells"], local.model_dump(mode="json")["cells"], strict=True):
        for key in DETERMINISTIC:
            assert got[key] == want[key], (got["index"], key)
        if not got["ran"]:
            continue
        assert got["measured_peak_bytes"] == want["measured_peak_bytes"]  # in another process
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert remote["pareto"] == local.model_dump()["pareto"]
    png = rc.get(done["plot_url"])
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"


def test_map_cells_without_a_server(ray_address):
    from functools import partial

    from memplan.executor.sweep import run_sweep
    from memplan.service.backends.ray_backend import map_cells

    spec = {**SWEEP, "run": False, "precisions": ["fp32", "bf16"], "n_gpus": 8, "zero_stage": 3,
            "models": SWEEP["models"][:1], "budgets_bytes": [None]}
    on_ray = run_sweep(spec, map_cells=partial(map_cells, address=ray_address))
    here = run_sweep(spec)
    assert on_ray.failed == 0, [c.error for c in on_ray.cells]

    def same(report) -> dict:  # a plan's message ends with its solve time: the rest must agree
        out = report.model_dump()
        for c in out["cells"]:
            c["message"] = c["message"].split("; mode")[0]
        return out

    assert same(on_ray) == same(here)
    assert on_ray.n_cells == 4 and on_ray.ran == 0
    fp32, bf16 = on_ray.cells[0], on_ray.cells[2]
    assert bf16.fixed_bytes_per_gpu < fp32.fixed_bytes_per_gpu  # 8 bytes a parameter, not 16
