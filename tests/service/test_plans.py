"""POST /v1/plans and /v1/plans/frontier against a live server: the library's answer, byte for
byte, and every way a request can be wrong."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from memplan import planner
from tests.service.conftest import make_profile

PROBLEM = "application/problem+json"


def _problem(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"]
    return body


@pytest.mark.parametrize("strategy", list(planner.STRATEGIES))
def test_plan_equals_library(client, gpt24, strategy):
    budget = 3 << 30
    r = client.post("/v1/plans", json={"profile": gpt24, "budget_bytes": budget, "strategy": strategy})
    assert r.status_code == 200, r.text
    expected = planner.plan(gpt24, budget_bytes=budget, strategy=strategy).model_dump(mode="json")
    assert _timeless(r.json()) == _timeless(expected)


def _timeless(plan: dict) -> dict:
    """The plan without the seconds the planner spent (optimal's message names them)."""
    return {**plan, "message": re.sub(r"[0-9.]+ s\b", "N s", plan["message"])}


def test_plan_default_strategy_and_options(client, profile):
    r = client.post("/v1/plans", json={"profile": profile})
    assert r.status_code == 200
    assert _timeless(r.json()) == _timeless(planner.plan(profile).model_dump(mode="json"))
    r = client.post("/v1/plans", json={"profile": profile, "strategy": "uniform", "options": {"k": 2}})
    assert r.status_code == 200
    assert r.json() == planner.plan(profile, strategy="uniform", k=2).model_dump(mode="json")
    # the same request again comes from the cache and is identical
    r2 = client.post("/v1/plans", json={"profile": profile, "strategy": "uniform", "options": {"k": 2}})
    assert r2.content == r.content


def test_infeasible_is_a_result_not_an_error(client, profile):
    r = client.post("/v1/plans", json={"profile": profile, "budget_bytes": 1, "strategy": "sqrt"})
    assert r.status_code == 200
    body = r.json()
    assert body["feasible"] is False and body["message"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["profile"]["layers"][2].__setitem__("saved_bytes", -5), "body.profile.layers.2.saved_bytes"),
        (lambda b: b["profile"]["layers"][0].__setitem__("forward_s", float("nan")), "body.profile.layers.0.forward_s"),
        (lambda b: b["profile"]["layers"][1].__setitem__("backward_s", float("inf")), "body.profile.layers.1.backward_s"),
        (lambda b: b.__setitem__("budget_bytes", -1), "body.budget_bytes"),
        (lambda b: b.__setitem__("budget_bytes", float("nan")), "body.budget_bytes"),
        (lambda b: b.__setitem__("colour", "red"), "body.colour"),
        (lambda b: b["profile"]["layers"][0].__setitem__("extra", 1), "body.profile.layers.0.extra"),
        (lambda b: b["profile"].__setitem__("layers", []), "body.profile.layers"),
        (lambda b: b.__setitem__("strategy", "fastest"), "body.strategy"),
        (lambda b: b.pop("profile"), "body.profile"),
    ],
)
def test_invalid_input_names_the_field(client, profile, mutate, field):
    body = {"profile": profile, "budget_bytes": 10_000}
    mutate(body)
    # json.dumps writes NaN/Infinity literals, as a careless client would
    r = client.post("/v1/plans", content=json.dumps(body), headers={"content-type": "application/json"})
    problem = _problem(r, 422)
    assert field in [e["field"] for e in problem["errors"]], problem
    assert field in problem["detail"]


def test_options_are_typed_per_strategy(client, profile):
    # sqrt takes no options; uniform's k is bounded by the schema and by the chain
    r = client.post("/v1/plans", json={"profile": profile, "strategy": "sqrt", "options": {"k": 3}})
    problem = _problem(r, 422)
    assert problem["errors"][0]["field"] == "body.options.k"
    assert "strategy 'sqrt' takes no such option; it takes none" in problem["detail"]
    r = client.post("/v1/plans", json={"profile": profile, "strategy": "uniform", "options": {"k": 7}})
    problem = _problem(r, 422)
    assert problem["errors"][0]["field"] == "body.options.k" and "1..6" in problem["detail"]
    r = client.post("/v1/plans", json={"profile": profile, "options": {"slots": 10**6}})
    assert _problem(r, 422)["errors"][0]["field"] == "body.options.slots"
    # the library's own checks that need the profile's contents name their field too
    r = client.post("/v1/plans", json={"profile": profile, "precision": "fp8"})
    problem = _problem(r, 422)
    assert problem["errors"][0]["field"] == "body.precision", problem


def test_the_body_schema_is_the_planners_request(client):
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    from memplan.planner.request import PlanRequest

    assert schema["PlanRequest"]["properties"].keys() == PlanRequest.model_json_schema()["properties"].keys()
    assert schema["OptimalOptions"]["properties"]["groups"]["maximum"] == 2000


def test_malformed_json(client):
    r = client.post("/v1/plans", content=b'{"profile": ', headers={"content-type": "application/json"})
    problem = _problem(r, 422)
    assert "JSON" in problem["detail"]


def test_stage_limit_and_body_limit(strict_server):
    headers = {"X-API-Key": "s3cret"}
    with httpx.Client(base_url=strict_server.url, headers=headers, timeout=30) as c:
        ok = c.post("/v1/plans", json={"profile": make_profile(40)})
        assert ok.status_code == 200
        r = c.post("/v1/plans", json={"profile": make_profile(41)})
        problem = _problem(r, 422)
        assert problem["errors"][0]["field"] == "body.profile.layers"
        big = {"profile": make_profile(30), "pad": "x" * (70 << 10)}
        problem = _problem(c.post("/v1/plans", json=big), 413)
        assert "65536" in problem["detail"]

        def chunks():  # no Content-Length: the limit counts the bytes as they arrive
            data = json.dumps(big).encode()
            for i in range(0, len(data), 8192):
                yield data[i : i + 8192]

        r = c.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
        _problem(r, 413)
        # the server is fine afterwards
        assert c.get("/v1/healthz").status_code == 200


def test_api_key(strict_server, profile):
    url = strict_server.url
    r = httpx.post(url + "/v1/plans", json={"profile": profile})
    problem = _problem(r, 401)
    assert "API key" in problem["detail"] and r.headers["www-authenticate"].startswith("Bearer")
    _problem(httpx.post(url + "/v1/plans", json={"profile": profile}, headers={"X-API-Key": "nope"}), 401)
    _problem(httpx.get(url + "/v1/runs", headers={"Authorization": "Bearer nope"}), 401)
    _problem(httpx.get(url + "/v1/info"), 401)
    assert httpx.post(
        url + "/v1/plans", json={"profile": profile}, headers={"Authorization": "Bearer s3cret"}
    ).status_code == 200
    # probes stay open for the orchestrator
    assert httpx.get(url + "/v1/healthz").status_code == 200
    assert httpx.get(url + "/v1/readyz").status_code == 200


def test_frontier(client, profile):
    r = client.post("/v1/plans/frontier", json={"profile": profile})
    if not hasattr(planner, "frontier"):
        problem = _problem(r, 501)
        assert "memplan.planner.frontier" in problem["detail"]
        return
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == json.loads(planner.frontier(profile).model_dump_json())
    png = client.post("/v1/plans/frontier", json={"profile": profile}, headers={"Accept": "image/png"})
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n"


def test_frontier_not_acceptable(client, profile):
    r = client.post("/v1/plans/frontier", json={"profile": profile}, headers={"Accept": "text/csv"})
    problem = _problem(r, 406)
    assert "image/png" in problem["detail"]


def test_plan_with_offload(client, gpt24):
    # docs/chain-model.md section 10.9: GPT-2 medium's blocks (examples/gpt24.json) forward in
    # 0.8 ms and record 240 MiB, so a record hides behind a forward from about 315 GB/s; at
    # 25 GB/s offload moves block inputs only (16 MiB) and is no faster than recompute alone
    from memplan.planner.simulate import replay
    from memplan.profiler.schema import load_profile

    budget = 4_251_821_673  # 40% of the store-all peak
    recompute = planner.plan(gpt24, budget_bytes=budget).predicted
    for bw, faster in ((25e9, False), (400e9, True)):
        body = {"profile": gpt24, "budget_bytes": budget, "options": {"offload_bandwidth": bw}}
        r = client.post("/v1/plans", json=body)
        assert r.status_code == 200, r.text
        plan = r.json()
        assert _timeless(plan) == _timeless(planner.plan(
            gpt24, budget_bytes=budget, offload_bandwidth=bw).model_dump(mode="json"))
        p = plan["predicted"]
        assert plan["feasible"] and p["peak_bytes"] <= budget
        assert plan["options"]["offload_bandwidth"] == bw
        assert plan["options"]["host_memory_bytes"] is None
        assert any(op[0] == "offload_record" for op in plan["schedule"]) == faster
        assert (p["time_s"] < recompute.time_s * (1 - 1e-6)) == faster
        assert p["time_s"] <= recompute.time_s * (1 + 1e-12)
        sim = replay(load_profile(gpt24), plan["schedule"], offload_bandwidth=bw)
        assert (sim.peak_bytes, sim.host_peak_bytes) == (p["peak_bytes"], p["host_peak_bytes"])
        assert sim.time_s == p["time_s"] and sim.transfer_wait_s == p["transfer_wait_s"]
    # the timeline of the page: the same plan, its transfer ops named like the others
    r = client.post("/v1/plans/timeline", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["plan"]["schedule"] == plan["schedule"]
    assert got["timeline"]["ops"] == [" ".join(map(str, op)) for op in plan["schedule"]]
    assert "offload_record 2" in got["timeline"]["ops"]


def test_offload_with_a_host_budget_on_a_long_chain(client, gpt24):
    # the planner solves without the host budget first and keeps that plan when it fits it
    # (gpt24 at 25 GB/s moves 64 MiB of block inputs): a host budget costs nothing more then
    r = client.post("/v1/plans", json={"profile": gpt24, "budget_bytes": 4 << 30, "options": {
        "offload_bandwidth": 25e9, "host_memory_bytes": 1 << 30}})
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["feasible"] and 0 < plan["predicted"]["host_peak_bytes"] <= 1 << 30
    assert plan["options"]["host_memory_bytes"] == 1 << 30


@pytest.mark.parametrize(("patch", "field"), [
    ({"options": {"offload_bandwidth": -1}}, "body.options.offload_bandwidth"),
    ({"options": {"offload_bandwidth": "25GB/s"}}, "body.options.offload_bandwidth"),
    ({"options": {"host_memory_bytes": 10**9}}, "body.options.host_memory_bytes"),
    ({"options": {"offload_bandwidth": 1e9, "host_memory_bytes": -5}}, "body.options.host_memory_bytes"),
    ({"strategy": "heuristic", "options": {"offload_bandwidth": 1e9}}, "body.options.offload_bandwidth"),
    ({"options": {"offload_bandwidth": 1e9, "mode": "banded"}}, "body.options.mode"),
    ({"checkpoint_dtype": "bf16", "options": {"offload_bandwidth": 1e9}}, "body.checkpoint_dtype"),
    # the planner's own check (the chain's length), named where the request has it
    ({"profile": make_profile(65), "options": {"offload_bandwidth": 1e9}},
     "body.options.offload_bandwidth"),
])
def test_offload_errors_name_the_field(client, profile, patch, field):
    for path in ("/v1/plans", "/v1/plans/timeline"):
        r = client.post(path, json={"profile": profile, "budget_bytes": 10**5, **patch})
        problem = _problem(r, 422)
        assert problem["errors"][0]["field"] == field, problem
