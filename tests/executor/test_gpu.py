"""The executor on CUDA: the recompute traps stay closed with the GPU's random stream, its peaks
are the allocator's, and mixed precision keeps its tolerance. Skipped without CUDA
(scripts/gpu_check.py measures the same on GPT-2 sizes; docs/executor.md has its numbers)."""

from __future__ import annotations

import pytest
import torch
from memplan.executor import run_plan
from memplan.executor.guards import GUARDS
from memplan.profiler.measure import profile_chain
from memplan.profiler.models.gpt import GPTConfig, build_gpt

from memplan import planner
from tests.executor.models import every_strategy, mlp_chain
from tests.executor.test_runner import _plan_from_ops

pytestmark = pytest.mark.gpu

# stage 1 runs three forwards (F, F, R): a second restore of its RNG snapshot must give the same
# dropout mask as the first (NOTE [ The traps of recomputation ] in executor/guards.py)
THREE_FORWARDS = [("F", 1), ("F", 2), ("drop", 1), ("F", 3), ("R", 4), ("loss",), ("B", 4),
                  ("drop", 3), ("R", 3), ("B", 3), ("drop", 2), ("F", 1), ("R", 2), ("B", 2),
                  ("drop", 1), ("R", 1), ("B", 1)]


def _cuda(stages, x):
    return [s.to("cuda") for s in stages], x.to("cuda")


def test_dropout_masks_repeat_on_every_recompute_on_cuda():
    stages, x = _cuda(*mlp_chain(3, width=256, batch=64, dropout=0.5, batchnorm=False))
    prof = profile_chain(stages, x, repeats=1, warmup=1)
    plan = _plan_from_ops(prof, THREE_FORWARDS)
    r = run_plan(stages, x, plan, profile=prof, steps=3)
    assert r.forward_counts[0] == 3
    assert r.status == "ok" and r.grad_max_rel_diff <= 1e-6, r.message
    assert abs(r.peak_error_pct) <= 2.0, r.peak_error_pct
    stages, x = _cuda(*mlp_chain(3, width=256, batch=64, dropout=0.5, batchnorm=False))
    bad = run_plan(stages, x, plan, profile=prof, steps=1, guards=[g for g in GUARDS if g != "rng"])
    assert bad.status == "mismatch" and bad.grad_max_rel_diff > 1e-3


@pytest.mark.parametrize("features", [
    dict(dtype="bfloat16", attention="flash", dropout=0.1),
    dict(attention="math", dropout=0.1, moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0,
         exit_layers=(1,), exit_threshold=0.05),
], ids=["bf16-flash-dropout", "fp32-moe-exit-dropout"])
def test_gpt_every_strategy_on_cuda(features):
    cfg = GPTConfig(n_layer=4, n_embd=128, n_head=4, block_size=128, vocab_size=256, batch_size=4,
                    **features)
    stages, idx = build_gpt(cfg, device="cuda")
    prof = profile_chain(stages, idx, repeats=2, warmup=1)
    if cfg.attention == "flash":
        assert prof.meta["attention_backend"] == "flash", prof.meta["attention_fallback"]
    for strategy, plan in every_strategy(prof, 0.6):
        r = run_plan(stages, idx, plan, profile=prof, steps=3)
        assert r.status == "ok", (strategy, r.message)
        assert r.grad_max_rel_diff <= r.tolerance, strategy
        assert abs(r.peak_error_pct) <= 2.0, (strategy, r.peak_error_pct)
        assert r.measured_fixed_bytes == r.predicted_fixed_bytes, strategy


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_on_cuda_within_dtype_tolerance(dtype):
    cfg = GPTConfig(n_layer=4, n_embd=128, n_head=4, block_size=128, vocab_size=256, batch_size=4,
                    dropout=0.1, attention="flash")
    stages, idx = build_gpt(cfg, device="cuda")
    prof = profile_chain(stages, idx, repeats=1, warmup=1, autocast_dtype=dtype)
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    plan = planner.plan(prof, strategy="optimal", budget_bytes=int(store * 0.5))
    r = run_plan(stages, idx, plan, profile=prof, steps=3, autocast_dtype=dtype)
    assert r.dtype == str(dtype).removeprefix("torch.")
    assert r.status == "ok", r.message
    assert abs(r.peak_error_pct) <= 2.0, r.peak_error_pct
