"""Analytic profiles from shapes: the published per-layer formula and large models."""

from __future__ import annotations

import pytest
from memplan.profiler import ProfileError
from memplan.profiler.analytic import (
    gpt_analytic_profile,
    gpt_block_saved_bytes,
    korthikanti_block_bytes,
    moe_capacity,
)


def test_korthikanti_gpt3_layer():
    # Korthikanti et al. 2022, table 2's GPT-3 175B: s=2048, h=12288, a=96, b=1:
    # sbh(34 + 5as/h) = 2048*12288*(34 + 80) bytes = 2.87 GB per layer
    cfg = dict(block_size=2048, n_embd=12288, n_head=96, batch_size=1)
    assert korthikanti_block_bytes(cfg) == 2048 * 12288 * 114


def test_ours_is_below_korthikanti_for_bf16_flash():
    cfg = dict(block_size=1024, n_embd=768, n_head=12, batch_size=8, dtype="bfloat16")
    ours, theirs = gpt_block_saved_bytes(cfg, device="cuda"), korthikanti_block_bytes(cfg)
    # 15 e BTC + 16 BT + 4 BHT + 24 (the flash kernel's RNG state, on a GPU) against 34 BTC + 5 a T^2 B
    B, T, C, H = 8, 1024, 768, 12
    assert ours == 30 * B * T * C + 16 * B * T + 4 * B * H * T + 24
    assert ours < theirs


def test_math_path_counts_the_attention_matrix():
    cfg = dict(block_size=64, n_embd=32, n_head=4, batch_size=2)
    flash = gpt_block_saved_bytes(cfg)
    math_ = gpt_block_saved_bytes({**cfg, "attention": "math"})
    assert math_ - flash == 4 * 2 * 4 * 64 * 64 - 4 * 2 * 4 * 64  # probs in, logsumexp out


def test_gpt2_xl_profile_is_instant_and_sized():
    prof = gpt_analytic_profile(dict(n_layer=48, n_embd=1600, n_head=25, batch_size=8), device="cuda",
                                flops_per_s=300e12)
    assert prof.n_stages == 50
    n = prof.meta["fixed"]["n_params"]
    assert 1.55e9 < n < 1.65e9  # GPT-2 XL, untied embeddings
    assert prof.layers[1].forward_s > 0


def test_capacity():
    assert moe_capacity(32, 2, 4, 1.25) == 20
    assert moe_capacity(10, 1, 4, 1.0) == 3


def test_errors():
    with pytest.raises(ProfileError, match="dropout"):
        gpt_analytic_profile(dict(dropout=0.1))
    with pytest.raises(ProfileError, match="unknown field"):
        gpt_analytic_profile(dict(layers=3))
    with pytest.raises(ProfileError, match="device"):
        gpt_analytic_profile({}, device="tpu")
