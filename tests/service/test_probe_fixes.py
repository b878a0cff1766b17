"""Regressions of a tester's probes of the service: HEAD on the event stream, a sweep's state, inputs
refused at submission (sweeps, runs), list-valued profile configs, the fields 422s name, quiet 413s
of chunked bodies and the plan cache's 415."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from memplan.service.jobs.admission import AdmissionError, admit
from memplan.service.jobs.store import JobState
from memplan.service.routers.sweeps import _finished_state
from memplan.service.settings import Settings

from tests.service.conftest import make_profile
from tests.service.server import wait_for

TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16, "vocab_size": 64,
        "batch_size": 2, "dropout": 0.0, "repeats": 1}
RUN_JOB = "memplan.service.jobs.kinds:run_job"
PROFILE_JOB = "memplan.service.jobs.kinds:profile_job"


def _fields(r: httpx.Response) -> list[str]:
    return [e["field"] for e in r.json().get("errors") or []]


# -- 1. HEAD on the event stream ---------------------------------------------------------------


def test_head_on_the_events_of_an_unfinished_run_ends_at_the_headers(client):
    run = client.post("/v1/runs", json={"steps": 40, "config": {"sleep_s": 0.25}}).json()
    try:
        t0 = time.monotonic()
        head = client.head(f"/v1/runs/{run['id']}/events")
        took = time.monotonic() - t0
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-type"].startswith("text/event-stream")
        # the run takes 10 s; the HEAD used to last as long, holding the keep-alive connection
        assert took < 3.0, took
        assert client.get("/v1/healthz").status_code == 200  # the same connection, free again
        assert client.get(f"/v1/runs/{run['id']}").json()["state"] in ("queued", "running")
    finally:
        client.post(f"/v1/runs/{run['id']}/cancel")


# -- 2. a sweep's state once its cells have finished ----------------------------------------------


@pytest.mark.parametrize(("counts", "state"), [
    ({"failed": 3}, JobState.failed),
    ({"failed": 2, "succeeded": 1}, JobState.succeeded),
    ({"succeeded": 3}, JobState.succeeded),
    ({"failed": 2, "cancelled": 1}, JobState.cancelled),
])
def test_a_finished_sweeps_state_follows_its_cells(counts, state):
    assert _finished_state(counts, sum(counts.values())) is state


# -- 3. sweep inputs refused at submission, fields named as elsewhere -----------------------------


@pytest.mark.parametrize(("patch", "field"), [
    ({"budgets_bytes": [None, 2**70]}, "body.budgets_bytes.1"),
    ({"device": "tpu"}, "body.device"),
    ({"models": [{"config": TINY}, {"model": "conv", "config": {"n_layer": 1, "batch_size": 1, "repeats": 1,
                                                                "features": "flash"}}]},
     "body.models.1.config.features"),
    ({"models": [{"config": TINY}, {"config": {**TINY, "n_layers": 3}}]}, "body.models.1.config.n_layers"),
    ({"strategies": ["optimal", "fastest"]}, "body.strategies.1"),
])
def test_sweep_inputs_are_refused_at_submission_naming_the_field(client, patch, field):
    r = client.post("/v1/sweeps", json={"models": [{"config": TINY}], **patch})
    assert r.status_code == 422, r.text
    assert _fields(r) == [field]
    assert "[" not in r.json()["detail"]  # models.1, not models[1]


# -- 4. run submission: device and features --------------------------------------------------------


@pytest.mark.parametrize("device", ["tpu", "cpu:0", "meta", "cuda:x"])
def test_a_run_on_an_unknown_device_is_a_422_on_body_device(client, device):
    r = client.post("/v1/runs", json={"config": TINY, "steps": 1, "device": device})
    assert r.status_code == 422 and _fields(r) == ["body.device"], r.text


def test_a_cuda_run_on_a_server_without_cuda_is_a_422(client):
    dev = wait_for(lambda: client.get("/v1/info").json()["device"], timeout_s=60, what="device probe")
    if dev["kind"] != "cpu":
        pytest.skip("this server has CUDA")
    r = client.post("/v1/runs", json={"config": TINY, "steps": 1, "device": "cuda"})
    assert r.status_code == 422 and _fields(r) == ["body.device"], r.text
    assert "no CUDA" in r.json()["detail"]


def test_a_run_budget_over_2_60_is_refused_as_a_plans(client):
    r = client.post("/v1/runs", json={"config": TINY, "steps": 1, "budget_bytes": 2**70})
    assert r.status_code == 422 and _fields(r) == ["body.budget_bytes"], r.text
    assert "2^60" in r.json()["detail"]


@pytest.mark.parametrize(("model", "config", "features"), [
    ("conv", {"n_layer": 1, "batch_size": 1, "repeats": 1}, ["flash"]),
    ("conv", {"n_layer": 1, "batch_size": 1, "repeats": 1}, ["qat"]),  # it quantized nothing
    ("gpt", TINY, ["prune", "moe"]),
])
def test_run_features_the_model_does_not_take_are_refused(tmp_path, model, config, features):
    request = {"model": model, "config": config, "features": features, "steps": 1}
    with pytest.raises(AdmissionError) as err:
        admit("run", request, Settings(data_dir=tmp_path), job_path=RUN_JOB)
    assert err.value.field == "body.features"
    admit("run", {**request, "features": []}, Settings(data_dir=tmp_path), job_path=RUN_JOB)


# -- 5. list-valued profile configs ----------------------------------------------------------------


def test_profile_configs_take_their_list_fields(client):
    conv = {"model": "conv", "config": {"channels": [4, 8], "blocks": [1, 1], "image_size": 8, "batch_size": 1},
            "analytic": True}
    gpt = {"model": "gpt", "config": {**{k: TINY[k] for k in ("n_layer", "n_embd", "n_head", "block_size",
                                                                "vocab_size", "batch_size")},
                                      "n_layer": 3, "exit_layers": [0]}, "analytic": True}
    for body in (conv, gpt):
        r = client.post("/v1/profiles", json=body)
        assert r.status_code == 202, r.text
        assert r.json()["request"]["config"] == body["config"]


def test_a_bad_list_in_a_profile_config_names_its_element(tmp_path):
    request = {"model": "conv", "config": {"channels": [4, "8"], "blocks": [1, 1], "image_size": 8},
               "analytic": True}
    with pytest.raises(AdmissionError) as err:
        admit("profile", request, Settings(data_dir=tmp_path), job_path=PROFILE_JOB)
    assert err.value.field == "body.config.channels.1"


def test_the_profile_job_builds_a_config_with_lists():
    from memplan.service.jobs.kinds import profile_job

    class Ctx:
        device = "cpu"

        def progress(self, fraction, message):
            pass

    prof = profile_job({"model": "conv", "config": {"channels": [4, 8], "blocks": [1, 2], "image_size": 8,
                                                    "batch_size": 1}, "analytic": True}, Ctx())
    assert len(prof.layers) > 3  # a stem, three blocks, a head


# -- 6. the fields sizing 422s name ----------------------------------------------------------------


@pytest.mark.parametrize(("query", "field"), [
    ("target_loss=1e300", "query.target_loss"),
    ("compute_flops=1e21&inference_tokens=1e300", "query.inference_tokens"),
    ("compute_flops=1e-300", "query.compute_flops"),  # as params=1e-300
    ("params=1e-300", "query.params"),
    ("target_loss=1e5", "query.target_loss"),  # a model of 1.5e-6 parameters
])
def test_sizing_422s_name_a_query_parameter(client, query, field):
    r = client.get(f"/v1/sizing?{query}")
    assert r.status_code == 422, r.text
    assert _fields(r) == [field]


def test_sizing_in_range_still_answers(client):
    r = client.get("/v1/sizing?compute_flops=1e21")
    assert r.status_code == 200 and r.json()["params"] > 1e9


def test_a_fit_prediction_out_of_range_names_its_flops(client):
    runs = [{"params": n, "tokens": d, "loss": 1.8 + 400 / n**0.34 + 410 / d**0.28}
            for n in (1e7, 3e7, 1e8, 3e8) for d in (1e9, 3e9, 1e10)]
    r = client.post("/v1/sizing/fit", json={"runs": runs, "flops": [1e20, 1e-300]})
    assert r.status_code == 422, r.text
    assert _fields(r) == ["body.flops.1"]


# -- 7. a chunked body over the limit: a quiet 413 -------------------------------------------------


def test_an_oversized_chunked_body_is_a_quiet_413(strict_server):
    def chunks():
        for _ in range(3):
            yield b" " * (64 << 10)

    before = strict_server.log.read_text()
    for path in ("/v1/plans", "/v1/runs", "/v1/plans/frontier"):
        r = httpx.post(strict_server.url + path, content=chunks(), timeout=30,
                       headers={"content-type": "application/json", "X-API-Key": "s3cret"})
        assert r.status_code == 413, r.text
    assert httpx.get(strict_server.url + "/v1/healthz").status_code == 200
    added = strict_server.log.read_text()[len(before):]
    assert "Traceback" not in added and "unhandled error" not in added, added


# -- 8. the plan cache after the Content-Type check ------------------------------------------------


def test_the_plan_cache_answers_only_json(client):
    raw = json.dumps({"profile": make_profile(4, seed=11), "budget_bytes": 20_000}).encode()
    assert client.post("/v1/plans", content=raw, headers={"content-type": "application/json"}).status_code == 200
    r = client.post("/v1/plans", content=raw, headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["type"].endswith("unsupported-media-type")



# -- minor: Prefer: wait with an exponent ---------------------------------------------------------


@pytest.mark.parametrize(("prefer", "wait_s"), [("wait=1e400", 60.0), ("wait=1e1", 10.0), ("wait=2.5", 2.5)])
def test_prefer_wait_reads_the_whole_number(prefer, wait_s):
    from memplan.service.routers._jobs import _wait_s

    assert _wait_s(prefer) == wait_s


def test_a_time_limit_below_the_estimate_says_how_long_the_job_needs(tmp_path):
    """The estimate in the refusal has significant figures, never '0 s', however short the limit."""
    request = {"model": "gpt", "config": TINY, "steps": 1, "timeout_s": 1e-9}
    with pytest.raises(AdmissionError) as err:
        admit("run", request, Settings(data_dir=tmp_path), job_path=RUN_JOB)
    needs = err.value.message.split("needs at least ")[1].split(" s at ")[0]
    assert err.value.kind == "too-long" and float(needs.replace(",", "")) > 0, err.value.message


def test_capacity_names_the_config_when_the_model_alone_is_too_large(client):
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 10**12, "vocab_size": 128,
             "num_attention_heads": 4, "intermediate_size": 10**12}
    r = client.post("/v1/capacity", json={"config": llama, "memory_bytes": 10**9, "seq_len": 64})
    assert r.status_code == 422 and _fields(r) == ["body.config"], r.text
