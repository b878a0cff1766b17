"""Memory-aware sizing: the largest compute-optimal GPT whose planned training step fits.

The search is tested against brute force with a shapes-only chain defined here (Korthikanti et al.
2022-style bytes per block), so that it does not depend on the profiler; the real analytic profile
is exercised when `memplan.profiler.analytic` is present.
"""

from __future__ import annotations

import pytest
from memplan.planner.scaling import ScalingError, optimal_for_params
from memplan.planner.scaling.memory_aware import MAX_OVERHEAD, memory_aware_size
from memplan.planner.scaling.shapes import gpt_shape, shape_for_layers
from memplan.profiler.schema import Profile

from memplan import planner

GB = 10**9


def toy_profile(shape, micro_batch, dtype):
    """A bf16 GPT chain from shapes: embed, blocks, head. Bytes: block output 2 s b h, saved
    32 s b h (Korthikanti et al. 2022 Eq. 2 with flash attention, less the output), head saved
    logits 4 s b V; times proportional to FLOPs (backward twice the forward)."""
    s, b, h, V = shape.seq_len, micro_batch, shape.d_model, shape.vocab_size
    x = 2 * s * b * h
    block_flops = 24 * b * s * h * h + 4 * b * s * s * h
    head_flops = 2 * b * s * h * V
    layers = [dict(name="embed", forward_s=1e-6, backward_s=2e-6, output_bytes=x, saved_bytes=0)]
    layers += [dict(name=f"block.{i}", forward_s=block_flops * 1e-15, backward_s=2 * block_flops * 1e-15,
                    output_bytes=x, saved_bytes=16 * x, forward_temp_bytes=x, backward_temp_bytes=2 * x)
               for i in range(shape.n_layer)]
    layers.append(dict(name="head", forward_s=head_flops * 1e-15, backward_s=2 * head_flops * 1e-15,
                       output_bytes=4, saved_bytes=4 * s * b * V))
    return Profile(name="toy-gpt", dtype=dtype, input_bytes=8 * s * b, layers=layers)


def _fits(n_layer, mem, n_devices, strategy, cap=MAX_OVERHEAD, **kw):
    shape = shape_for_layers(n_layer, seq_len=kw.get("seq_len", 2048))
    d = shape.d_model
    # by hand: 16 bytes per parameter (bf16-mixed AdamW) over the devices (ZeRO-3), plus the
    # gathered bf16-mixed (fp32) weights of the largest unit when sharded
    unit = max(12 * d * d + 13 * d, shape.vocab_size * d)
    fixed = -(-4 * shape.params // n_devices) * 2 + -(-8 * shape.params // n_devices)
    fixed += 4 * unit if n_devices > 1 else 0
    if fixed >= mem:
        return False
    prof = toy_profile(shape, kw.get("micro_batch", 1), "bfloat16")
    plan = planner.plan(prof, budget_bytes=mem - fixed, strategy=strategy)
    # overheads carry rounding (store-all: 1e-15 above 0); the search allows 1e-12
    return plan.feasible and (cap is None or plan.predicted.overhead <= cap + 1e-12)


def test_shape_rule():
    s = gpt_shape(175e9)
    assert s.d_model / s.n_layer == pytest.approx(128, rel=0.05)
    assert s.params == pytest.approx(175e9, rel=0.05)
    assert s.n_head * 128 == s.d_model
    gpt3 = shape_for_layers(96)
    assert gpt3.d_model == 12288 and gpt3.n_head == 96  # GPT-3 175B's shape


@pytest.mark.parametrize("cap", [MAX_OVERHEAD, 0.1, None])
@pytest.mark.parametrize("mem_gb, n_devices", [(24, 1), (80, 8)])
def test_largest_fit_matches_brute_force(mem_gb, n_devices, cap):
    r = memory_aware_size(mem_gb * GB, n_devices=n_devices, strategy="uniform",
                          profile_fn=toy_profile, law="epoch", max_overhead=cap)
    assert _fits(r.n_layer, mem_gb * GB, n_devices, "uniform", cap)
    assert not _fits(r.n_layer + 1, mem_gb * GB, n_devices, "uniform", cap)
    assert r.max_overhead == cap and (cap is None or r.recompute_overhead <= cap + 1e-12)
    # the trade-off rows are the same search under each cap
    for p in r.tradeoff:
        if p.n_layer:
            assert _fits(p.n_layer, mem_gb * GB, n_devices, "uniform", p.max_overhead)
        assert not _fits(p.n_layer + 1, mem_gb * GB, n_devices, "uniform", p.max_overhead)
    assert r.total_peak_bytes <= mem_gb * GB
    assert r.peak_bytes <= r.activation_budget_bytes
    # compute-optimal tokens for that size under the law
    ref = optimal_for_params(r.params, law="epoch")
    assert r.tokens == pytest.approx(ref.tokens, rel=1e-9)
    assert r.flops == pytest.approx(6 * r.params * r.tokens, rel=1e-12)
    # checkpointing lets a larger model fit than storing everything
    assert r.store_all_n_layer is None or r.store_all_n_layer <= r.n_layer
    if r.store_all_n_layer:
        assert _fits(r.store_all_n_layer, mem_gb * GB, n_devices, "store-all")
        assert not _fits(r.store_all_n_layer + 1, mem_gb * GB, n_devices, "store-all")


def test_more_memory_or_devices_never_shrinks_the_model():
    sizes = [memory_aware_size(m * GB, n_devices=n, strategy="uniform", profile_fn=toy_profile).params
             for m, n in ((16, 1), (40, 1), (40, 4), (141, 8))]
    assert sizes == sorted(sizes)


def test_training_time_formula():
    r = memory_aware_size(141 * GB, n_devices=8, strategy="uniform", profile_fn=toy_profile,
                          device="H200", utilization=0.4)
    assert r.peak_flops == 989e12
    expect = 6 * r.params * r.tokens * (1 + r.recompute_overhead) / (8 * 989e12 * 0.4)
    assert r.training_time_s == pytest.approx(expect, rel=1e-12)
    assert r.training_days == pytest.approx(expect / 86400)
    none = memory_aware_size(141 * GB, n_devices=8, strategy="uniform", profile_fn=toy_profile)
    assert none.training_time_s is None


def test_optimal_falls_back_with_a_note_when_absent():
    r = memory_aware_size(24 * GB, profile_fn=toy_profile)
    if "optimal" in planner.STRATEGIES:
        assert r.strategy == "optimal" and not r.notes
    else:
        assert r.strategy == "uniform" and "stand-in" in r.notes[0]


def test_bad_input():
    with pytest.raises(ScalingError, match="cannot train even a 1-layer model"):
        memory_aware_size(10**6, profile_fn=toy_profile, strategy="uniform")
    with pytest.raises(ScalingError, match="device: unknown 'TPU'"):
        memory_aware_size(80 * GB, device="TPU", profile_fn=toy_profile)
    with pytest.raises(ScalingError, match="utilization"):
        memory_aware_size(80 * GB, utilization=1.5, profile_fn=toy_profile)
    with pytest.raises(ScalingError, match="n_devices"):
        memory_aware_size(80 * GB, n_devices=0, profile_fn=toy_profile)
    with pytest.raises(ScalingError, match="device_memory_bytes"):
        memory_aware_size(float("nan"), profile_fn=toy_profile)


def test_with_the_real_analytic_profile():
    pytest.importorskip("memplan.profiler.analytic", reason="memplan.profiler.analytic is not built yet")
    r = memory_aware_size(141 * GB, n_devices=8, device="H200")
    assert r.total_peak_bytes <= 141 * GB and r.n_layer >= 1
