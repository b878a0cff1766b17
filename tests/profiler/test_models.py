"""The built-in families' features: decisions replayed, MoE aux losses through the chain, flash
fallback reported, early exit per sample."""

from __future__ import annotations

import logging

import pytest
import torch
from memplan.profiler import profile_chain
from memplan.profiler.models.decisions import (
    DecisionError,
    DecisionLog,
    decide,
    is_replaying,
    recording,
    replaying,
)
from memplan.profiler.models.gpt import GPTConfig, build_gpt, gpt_report


def _loss(stages, x):
    for s in stages:
        x = s(x)
    return x


def test_decide_modes():
    log = DecisionLog()
    calls = []

    def compute(v):
        def f():
            calls.append(v)
            return torch.tensor(v)
        return f

    assert decide("k", compute(1)).item() == 1 and len(log) == 0
    with recording(log):
        assert not is_replaying()
        decide("k", compute(2))
        decide("k", compute(3))
    assert log.count("k") == 2 and calls == [1, 2, 3]
    with replaying(log):
        assert is_replaying()
        assert [decide("k", compute(9)).item() for _ in range(3)] == [2, 3, 2]  # wraps around
    assert calls == [1, 2, 3] and not is_replaying()
    with replaying(log), pytest.raises(DecisionError, match="'other'"):
        decide("other", compute(0))


def test_moe_routing_replayed_and_counters_untouched(tiny_gpt):
    stages, idx = build_gpt(tiny_gpt(moe_experts=4, moe_top_k=2, moe_capacity_factor=0.75))
    moe = stages[1].mlp
    log = DecisionLog()
    x = stages[0](idx)
    with recording(log):
        y1, _ = moe(stages[1].ln_2(x))
    counts = moe.expert_counts.clone()
    assert int(counts.sum()) > 0 and int(moe.dropped_count) > 0
    # perturb the router: a fresh routing would differ, the replayed one must not
    with torch.no_grad():
        moe.router.weight.mul_(-1.0)
    with replaying(log):
        top = decide("block.0.moe.topk", lambda: None)
    assert torch.equal(top, log._store["block.0.moe.topk"][0])
    log.rewind()
    with replaying(log):
        moe(stages[1].ln_2(x))
    assert torch.equal(moe.expert_counts, counts)  # no double counting while replaying


def test_moe_aux_losses_reach_the_loss_and_follow_its_scale(tiny_gpt):
    cfg = tiny_gpt(moe_experts=4, moe_top_k=1)
    stages, idx = build_gpt(cfg)
    stages_noaux, _ = build_gpt(tiny_gpt(moe_experts=4, moe_top_k=1, moe_aux_loss_coef=0.0, moe_z_loss_coef=0.0))
    loss = _loss(stages, idx)
    aux = sum(v for v in stages[-1]._shared[0].aux_values.values())
    base = _loss(stages_noaux, idx)
    assert float(aux) > 0
    assert torch.allclose(loss, base + aux, rtol=0, atol=1e-6)
    router = stages[1].mlp.router.weight
    loss.backward()
    g1 = router.grad.clone()
    router.grad = None
    (3.0 * _loss(stages, idx)).backward()  # as a gradient scaler does
    assert torch.allclose(router.grad, 3.0 * g1, rtol=1e-5, atol=1e-9)
    # the aux gradient is really there: without aux the router gradient differs
    base.backward()
    assert not torch.allclose(stages_noaux[1].mlp.router.weight.grad, g1)


def test_flash_fallback_is_reported(tiny_gpt, caplog, monkeypatch):
    import memplan.profiler.models.gpt as gpt

    monkeypatch.setattr(gpt, "_FLASH_WARNED", set())  # logged once per process and reason
    stages, idx = build_gpt(tiny_gpt(dropout=0.1, attention="flash"))
    with caplog.at_level(logging.WARNING):
        prof = profile_chain(stages, idx, repeats=1, warmup=0)
    assert prof.meta["attention_backend"] == "math"
    assert prof.meta["attention_fallback"] and "dropout" in prof.meta["attention_fallback"][0]
    warned = [r for r in caplog.records if "flash attention unavailable" in r.message]
    assert len(warned) == 1  # once, not once per block


def test_flash_used_when_available(tiny_gpt):
    stages, idx = build_gpt(tiny_gpt(attention="flash"))
    _loss(stages, idx)
    rep = gpt_report(stages)
    assert {v["used"] for v in rep["attention"].values()} == {"flash"}


@pytest.mark.parametrize("threshold,expected", [(1.0, [4, 4]), (1e-6, [2, 2])])
def test_early_exit_per_sample_compute(tiny_gpt, threshold, expected):
    stages, idx = build_gpt(tiny_gpt(n_layer=4, exit_layers=(1,), exit_threshold=threshold))
    loss = _loss(stages, idx)
    loss.backward()
    rep = gpt_report(stages)["exit"]
    assert rep["per_sample_blocks"] == expected
    assert rep["per_sample_block_flops"][0] * 4 == rep["full_block_flops"] * expected[0]
    # the exit head is trained either way
    assert stages[3].exit.proj.weight.grad.abs().sum() > 0


def test_early_exit_decisions_replay(tiny_gpt):
    stages, idx = build_gpt(tiny_gpt(n_layer=3, batch_size=4, exit_layers=(0,), exit_threshold=1e-6))
    log = DecisionLog()
    with recording(log):
        _loss(stages, idx)
    exits = log._store["exit.0"][0].clone()
    assert exits.all()
    stages[2].exit.threshold = 2.0  # nothing would exit now
    with replaying(log):
        _loss(stages, idx)
    assert torch.equal(stages[1].shared.exit_decisions[0], exits)
    assert int(stages[2].exit.exit_count) == 4  # counted once, not again on replay


def test_config_errors():
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="exit_layers"):
        GPTConfig(n_layer=2, exit_layers=(1,))
    with pytest.raises(ValueError, match="attention"):
        GPTConfig(attention="sparse")
    with pytest.raises(ValueError, match="moe_top_k"):
        GPTConfig(moe_experts=2, moe_top_k=3)


def test_flash_probe_is_invisible_to_a_selective_checkpoint():
    # the first forward in a process probes flash attention; recorded under a save policy, the
    # probe's ops must not be cached (the recomputation finds the probe done and skips them)
    from memplan.profiler.models import gpt as G
    from memplan.profiler.policies import recorded

    G._FLASH_PROBE.clear()
    cfg = G.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, batch_size=2,
                      attention="flash")
    stages, x0 = G.build_gpt(cfg)
    h = stages[0](x0).detach().requires_grad_()
    out = recorded(stages[1], h, recompute=["aten.gelu", "aten.native_layer_norm"])
    (out if torch.is_tensor(out) else out[0]).sum().backward()
    plain = h.detach().clone().requires_grad_()
    ref = stages[1](plain)
    (ref if torch.is_tensor(ref) else ref[0]).sum().backward()
    assert torch.equal(h.grad, plain.grad)
