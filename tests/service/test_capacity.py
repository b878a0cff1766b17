"""POST /v1/capacity: the library's answer through HTTP, and its errors as 422s naming the field."""

from __future__ import annotations

import json
from pathlib import Path

from memplan.planner.capacity import capacity

CONFIGS = Path(__file__).parents[1] / "profiler" / "hf_configs"
LLAMA7B = json.loads((CONFIGS / "llama-2-7b.json").read_text())


def test_capacity_is_the_librarys_answer(client):
    body = {"config": LLAMA7B, "memory_bytes": 80 * 10**9, "seq_len": 4096, "n_gpus": 8,
            "zero_stage": 3, "max_overhead": 0.3, "policies": False}
    r = client.post("/v1/capacity", json=body, timeout=120)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got == json.loads(capacity(body).model_dump_json())
    assert got["fits"] and got["max_micro_batch"] >= 2 and got["n_params"] == 6_738_415_616


def test_lean_loss_is_the_librarys_answer(client):
    body = {"config": LLAMA7B, "memory_bytes": 80 * 10**9, "seq_len": 4096, "n_gpus": 8,
            "zero_stage": 3, "policies": False, "lean_loss": True}
    r = client.post("/v1/capacity", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json() == json.loads(capacity(body).model_dump_json())
    assert r.json()["assumptions"]["loss"] == "lean"


def test_parallel_layout_is_the_librarys_answer(client):
    body = {"config": LLAMA7B, "memory_bytes": 80 * 10**9, "seq_len": 4096, "n_gpus": 8,
            "tp": 2, "sp": True, "pp": 2, "micro_batches": 8, "zero_stage": 1,
            "max_overhead": 0.3, "policies": False}
    r = client.post("/v1/capacity", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json() == json.loads(capacity(body).model_dump_json())
    assert r.json()["fits"] and r.json()["parallel"]["tp"] == 2


def test_not_fitting_is_an_answer(client):
    r = client.post("/v1/capacity", json={"config": LLAMA7B, "device": "a100-80gb", "policies": False},
                    timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["fits"] is False and r.json()["model_state_bytes"] == 16 * 6_738_415_616


def test_bad_input_is_a_422_naming_the_field(client):
    for body, field in (
        ({"config": LLAMA7B, "memory_bytes": 10**9, "seq_len": 0}, "seq_len"),
        ({"config": LLAMA7B, "device": "tpu"}, "device"),
        ({"config": {"model_type": "bert"}, "memory_bytes": 10**9}, "model_type"),
        ({"config": LLAMA7B, "memory_bytes": 10**9, "precision": "fp8"}, "precision"),
        ({"config": LLAMA7B, "memory_bytes": "80GB"}, "memory_bytes"),
        ({"config": {**LLAMA7B, "num_hidden_layers": 10**6}, "memory_bytes": 10**9}, "num_hidden_layers"),
        ({"config": LLAMA7B, "memory_bytes": 10**9, "n_gpus": 6, "tp": 4}, "n_gpus"),
        ({"config": LLAMA7B, "memory_bytes": 10**9, "tp": 3, "n_gpus": 3}, "tp"),
        ({"config": LLAMA7B, "memory_bytes": 10**9, "seq_len": 4095, "cp": 2, "n_gpus": 2}, "seq_len"),
        ({"config": LLAMA7B, "memory_bytes": 10**9, "tp": 2, "n_gpus": 2, "lean_loss": True}, "lean_loss"),
        ({"config": LLAMA7B, "memory_bytes": 10**9, "lean_loss": "yes"}, "lean_loss"),
        ({"config": LLAMA7B, "memory_bytes": 10**9, "reuse_logits": True}, "reuse_logits"),
    ):
        r = client.post("/v1/capacity", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert field in r.text


def test_openapi_documents_the_route(client):
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/v1/capacity"]["post"]
    assert op["security"] == [{"BearerKey": []}]
    from memplan.planner.capacity import CapacityRequest

    props = spec["components"]["schemas"]["CapacityRequest"]["properties"]
    assert props.keys() == CapacityRequest.model_json_schema()["properties"].keys()
