"""POST /v1/plans prices the model states by `precision` (issue 19, item 1): the analytic 7B GPT
under bf16-mixed is infeasible at 80 GB (a result), and a profile made under another policy is a
4xx problem naming `precision`."""

from __future__ import annotations

from memplan.profiler.analytic import gpt_analytic_profile

GPT_7B = dict(n_layer=32, n_embd=4096, n_head=32, block_size=4096, batch_size=1)


def test_plan_route_prices_the_policy(client):
    mixed = gpt_analytic_profile(GPT_7B, precision="bf16-mixed").model_dump(mode="json")
    r = client.post("/v1/plans", json={"profile": mixed, "memory_bytes": 80 * 10**9,
                                       "precision": "bf16-mixed"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["feasible"] is False and "model states alone need" in body["message"]
    assert body["options"]["fixed_bytes_per_gpu"] > 80 * 10**9
    pure = gpt_analytic_profile({**GPT_7B, "dtype": "bfloat16"}).model_dump(mode="json")
    r = client.post("/v1/plans", json={"profile": pure, "memory_bytes": 80 * 10**9,
                                       "precision": "bf16-mixed"})
    assert 400 <= r.status_code < 500, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "precision" in r.text and "made under bf16" in r.text
