"""GET /v1/sizing and POST /v1/sizing/fit: the library's answers through HTTP, and their errors."""

from __future__ import annotations

import csv
import json

import pytest

scaling = pytest.importorskip("memplan.planner.scaling")



def _same(r, result):
    assert r.status_code == 200, r.text
    assert r.json() == json.loads(result.model_dump_json())


def test_compute_optimal(client):
    r = client.get("/v1/sizing", params={"compute_flops": 5.76e23, "law": "epoch"})
    _same(r, scaling.compute_optimal(5.76e23, law="epoch"))
    body = r.json()
    assert body["params"] == pytest.approx(7.22e10, rel=0.01)
    assert body["tokens_per_param"] == pytest.approx(18.4, rel=0.01)
    _same(client.get("/v1/sizing", params={"compute_flops": 5.76e23}), scaling.compute_optimal(5.76e23))


def test_other_queries(client):
    _same(client.get("/v1/sizing", params={"params": 7e10, "law": "hoffmann"}),
          scaling.optimal_for_params(7e10, law="hoffmann"))
    _same(client.get("/v1/sizing", params={"target_loss": 2.0}), scaling.cheapest_for_loss(2.0))
    _same(client.get("/v1/sizing", params={"inference_tokens": 1e12, "compute_flops": 1e23}),
          scaling.inference_aware(1e12, flops=1e23))
    _same(client.get("/v1/sizing", params={"params": 6.34e9, "tokens": 242e9, "unique_tokens": 25e9}),
          scaling.data_constrained_loss(6.34e9, 242e9, 25e9))
    _same(client.get("/v1/sizing", params={"compute_flops": 1e23, "unique_tokens": 1e11}),
          scaling.data_constrained_optimal(1e23, 1e11))


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"compute_flops": -1}, "query.compute_flops"),
        ({"compute_flops": "nan"}, "query.compute_flops"),
        ({"compute_flops": "inf"}, "query.compute_flops"),
        ({"compute_flops": 1e23, "law": "moore"}, "query.law"),
        ({"compute_flops": 1e23, "params": 1e9}, "query.params"),
        ({}, "query.compute_flops"),
        ({"unique_tokens": 1e9}, "query.unique_tokens"),
        ({"inference_tokens": 1e9}, "query.inference_tokens"),
        ({"compute_flops": 1e23, "utilization": 2}, "query.utilization"),
    ],
)
def test_sizing_errors(client, params, field):
    r = client.get("/v1/sizing", params=params)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert field in [e["field"] for e in r.json()["errors"]]


def test_fit_equals_library(client):
    from memplan.data import dataset_path

    rows = list(csv.DictReader(dataset_path("epoch").open()))
    runs = [{"params": float(r["Model Size"]), "flops": float(r["Training FLOP"]), "loss": float(r["loss"])}
            for r in rows]
    r = client.post("/v1/sizing/fit", json={"runs": runs, "flops": [1e22]})
    assert r.status_code == 200, r.text
    expected = scaling.fit_law(runs, flops=[1e22])
    assert r.json() == json.loads(expected.model_dump_json())


def test_fit_errors(client):
    r = client.post("/v1/sizing/fit", json={"runs": [{"params": 1e9, "loss": 3.0}]})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.runs.0.tokens"
    r = client.post("/v1/sizing/fit", json={"runs": [{"params": 1e9, "tokens": 1e10, "loss": 3.0}]})
    assert r.status_code == 422  # fewer runs than coefficients: the library says so
    assert "runs" in r.json()["detail"]
    r = client.post("/v1/sizing/fit", json={"runs": [{"params": -1, "tokens": 1e10, "loss": 3.0}]})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.runs.0.params"
    r = client.post("/v1/sizing/fit", json={"runs": [], "bootstrap": 5})
    assert r.status_code == 422
