"""Structured pruning of attention heads (and feed-forward channels) for real: the model shrinks by
exactly the removed heads' weights, computes what the unpruned model computes with those heads
masked, re-profiles to smaller saved bytes that equal the analytic profile of its new config, and
trains under every strategy with gradients bitwise equal to its own unplanned step."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("torch_pruning")
gpt = pytest.importorskip("memplan.profiler.models.gpt")
measure = pytest.importorskip("memplan.profiler.measure")

from memplan.executor import run_plan  # noqa: E402
from memplan.executor.features import apply_features  # noqa: E402
from memplan.executor.features.prune import head_scores, prune_heads, prune_model  # noqa: E402
from memplan.profiler.analytic import gpt_analytic_profile  # noqa: E402

from tests.executor.models import every_strategy  # noqa: E402

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine

TINY = dict(n_layer=2, n_embd=32, n_head=4, block_size=16, vocab_size=64, batch_size=2)
HD = 8  # 32 // 4


def _n_params(stages) -> int:
    return sum(p.numel() for s in stages for p in s.parameters())


def _config_of(stages) -> dict:
    return {k: v for k, v in stages[0].memplan_config.items() if k != "family"}


def test_parameters_and_shapes_shrink_by_the_removed_heads_and_channels():
    stages, _ = gpt.build_gpt(gpt.GPTConfig(**TINY))
    before = _n_params(stages)
    note, m = prune_model(stages, head_ratio=0.5, ffn_ratio=0.25)
    C, L = 32, TINY["n_layer"]
    d_inner, d_ffn = 2 * HD, 32  # 2 of 4 heads, 32 of 128 channels per block
    per_block = (3 * d_inner * C + 3 * d_inner) + C * d_inner + (d_ffn * C + d_ffn) + C * d_ffn
    assert m["params_before"] == before
    assert m["params_after"] == _n_params(stages) == before - L * per_block
    assert (m["heads_before"], m["heads_after"], m["heads_removed"]) == (4, 2, 2 * L)
    assert (m["ffn_hidden_before"], m["ffn_hidden_after"], m["channels_removed"]) == (128, 96, 32 * L)
    assert "4 heads" in note and "64 feed-forward channels" in note and str(m["params_after"]) in note
    for block in stages[1:-1]:
        assert block.attn.n_head == 2 and block.attn.head_dim == HD
        assert block.attn.c_attn.weight.shape == (3 * d_inner, C) and block.attn.c_attn.bias.shape == (48,)
        assert block.attn.c_proj.weight.shape == (C, d_inner)
        assert block.mlp.c_fc.weight.shape == (96, C) and block.mlp.c_proj.weight.shape == (C, 96)
    # the updated config builds a model of exactly these shapes
    cfg = _config_of(stages)
    assert (cfg["n_head"], cfg["head_dim"], cfg["ffn_hidden"]) == (2, HD, 96)
    fresh, _ = gpt.build_gpt(gpt.GPTConfig(**cfg))
    for a, b in zip(stages, fresh, strict=True):
        assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}


def test_removed_heads_are_the_weakest_and_the_forward_equals_the_masked_model():
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, attention="math"))
    for s in stages:
        s.double()  # float64: a masked head and a removed one agree to ~1e-15, a wrong one does not
    weak = {1: 2, 2: 0}  # stage -> head made weakest (its weights scaled down)
    with torch.no_grad():
        for i, h in weak.items():
            a = stages[i].attn
            for third in range(3):
                a.c_attn.weight[third * 32 + h * HD: third * 32 + (h + 1) * HD] *= 0.3
            a.c_proj.weight[:, h * HD:(h + 1) * HD] *= 0.3
    for i, h in weak.items():
        assert int(head_scores(stages[i].attn).argmin()) == h
    pruned = copy.deepcopy(stages)
    m = prune_heads(pruned, ratio=0.25)
    assert m["removed"] == {"block.0.attn": [2], "block.1.attn": [0]}

    def hidden(chain, masked=None):
        hooks = []
        for i, h in (masked or {}).items():
            def zero(mod, args, h=h):
                x = args[0].clone()
                x[..., h * HD:(h + 1) * HD] = 0
                return (x,)
            hooks.append(chain[i].attn.c_proj.register_forward_pre_hook(zero))
        x = idx
        with torch.no_grad():
            for s in chain[:-1]:  # the head's loss is fp32: compare the float64 hidden state
                x = s(x)
        for hk in hooks:
            hk.remove()
        return x

    got = hidden(pruned)
    ref = hidden(stages, masked=weak)
    assert (got - ref).abs().max().item() < 1e-12
    wrong = hidden(stages, masked={1: 1, 2: 0})  # another head of block 0 masked instead
    assert (got - wrong).abs().max().item() > 1e-6
    assert (got - hidden(stages)).abs().max().item() > 1e-6  # removing a head changes the model


@pytest.mark.parametrize("dtype,attention", [("float32", "flash"), ("float32", "math"), ("bfloat16", "math")])
def test_reprofile_shrinks_and_equals_the_analytic_profile(dtype, attention):
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, dtype=dtype, attention=attention))
    before = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    _, m = prune_model(stages)  # defaults: 25% of heads (1 of 4) and of FFN channels
    assert m["heads_removed"] == TINY["n_layer"] and m["channels_removed"] == 32 * TINY["n_layer"]
    after = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    assert after.meta["config"]["n_head"] == 3 and after.meta["config"]["ffn_hidden"] == 96
    e = 4 if dtype == "float32" else 2
    mm = 4 if attention == "math" else e  # the math path keeps q, k, v in fp32 on the CPU
    B, T, N = TINY["batch_size"], TINY["block_size"], TINY["batch_size"] * TINY["block_size"]
    if attention == "flash":  # qkv + output per removed inner channel, logsumexp per head
        attn_delta = 4 * e * N * HD + 4 * B * T
    else:  # q, k^T, v copies, c_proj input, probabilities per head
        attn_delta = 3 * mm * N * HD + e * N * HD + mm * B * T * T
    for b, a in zip(before.layers[1:-1], after.layers[1:-1], strict=True):
        assert b.saved_bytes - a.saved_bytes == attn_delta + 2 * e * N * 32  # + GELU in/out
        assert a.output_bytes == b.output_bytes  # the residual stream keeps its width
        assert a.param_bytes < b.param_bytes and a.flops < b.flops
    analytic = gpt_analytic_profile(_config_of(stages), device="cpu")
    assert (after.input_bytes, after.fixed_bytes) == (analytic.input_bytes, analytic.fixed_bytes)
    for x, y in zip(after.layers, analytic.layers, strict=True):
        assert (x.name, x.output_bytes, x.saved_bytes, x.param_bytes, x.flops) == (
            y.name, y.output_bytes, y.saved_bytes, y.param_bytes, y.flops)


def test_inner_width_apart_from_the_residual_width_equals_analytic():
    # heads wider than n_embd / n_head (inner 48 > C 32) and a narrow FFN, built directly
    cfg = gpt.GPTConfig(**{**TINY, "n_head": 2}, head_dim=24, ffn_hidden=40, attention="math")
    stages, idx = gpt.build_gpt(cfg)
    assert stages[1].attn.c_attn.weight.shape == (144, 32) and stages[1].attn.c_proj.weight.shape == (32, 48)
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    analytic = gpt_analytic_profile(cfg)
    assert prof.fixed_bytes == analytic.fixed_bytes
    assert [(x.saved_bytes, x.param_bytes, x.flops) for x in prof.layers] == [
        (y.saved_bytes, y.param_bytes, y.flops) for y in analytic.layers]


def test_pruned_model_every_strategy_gradients_bitwise_and_optimizer_holds_the_new_parameters():
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**{**TINY, "n_layer": 3}, dropout=0.1, attention="math"))
    prune_model(stages, head_ratio=0.5)
    new_params = {id(p) for s in stages for p in s.parameters()}
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    for strategy, plan in every_strategy(prof, 0.75):
        r = run_plan(stages, idx, plan, profile=prof, steps=2)
        assert r.status == "ok", (strategy, r.message)
        assert r.grad_max_abs_diff == 0.0 and r.param_max_abs_diff == 0.0, strategy
        assert abs(r.peak_error_pct) <= 2.0, (strategy, r.peak_error_pct)
        # params, grads and AdamW's moments of the pruned shapes, nothing of the old ones
        assert r.measured_fixed_bytes == prof.fixed_bytes, strategy
    assert {id(p) for s in stages for p in s.parameters()} == new_params
    assert all(p.grad is not None and p.grad.shape == p.shape for s in stages for p in s.parameters())


def test_ratios_and_heads_kept():
    stages, _ = gpt.build_gpt(gpt.GPTConfig(**TINY))
    with pytest.raises(ValueError, match="prune head ratio"):
        prune_heads(stages, ratio=1.0)
    with pytest.raises(ValueError, match="both 0"):
        prune_model(stages, head_ratio=0, ffn_ratio=0)
    m = prune_heads(stages, ratio=0.99)  # floor(3.96) = 3: one head kept
    assert m["heads_after"] == 1 and stages[1].attn.n_head == 1
    m = prune_heads(stages, ratio=0.99)
    assert m["heads_removed"] == 0  # the last head is never removed


def test_apply_features_prunes_heads_and_channels():
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY))
    notes, extras = apply_features(stages, ["prune"])
    assert extras["prune"]["heads_removed"] == 2 and extras["prune"]["channels_removed"] == 64
    assert extras["prune"]["params_after"] == _n_params(stages) < extras["prune"]["params_before"]
    assert "heads" in notes[0]
