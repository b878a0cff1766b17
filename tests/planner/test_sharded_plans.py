"""Plans for N data-parallel GPUs: per-GPU fixed bytes at ZeRO 1-3 against the ZeRO paper's
Table 1, and `memplan.planner.plan(..., n_gpus=, zero_stage=)` on a stated model."""

from __future__ import annotations

import pytest
from memplan.planner.schema import PlanError
from memplan.planner.sharding import shard_profile, sharded_fixed_bytes
from memplan.profiler.analytic import gpt_analytic_profile

from memplan import planner

# Rajbhandari et al. 2020, Table 1: per-device memory (GB) of model states with mixed-precision
# Adam (K = 12) by DP degree, for P_os (stage 1), P_os+g (stage 2) and P_os+g+p (stage 3).
TABLE_1 = {
    7.5e9: {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5), 64: (31.4, 16.6, 1.88),
            256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)},
    128e9: {1: (2048, 2048, 2048), 4: (896, 704, 512), 16: (608, 368, 128), 64: (536, 284, 32),
            256: (518, 263, 8), 1024: (513, 257, 2)},
    1e12: {1: (16000, 16000, 16000), 4: (7000, 5500, 4000), 16: (4750, 2875, 1000),
           64: (4187, 2218, 250), 256: (4046, 2054, 62.5), 1024: (4011, 2013, 15.6)},
}


@pytest.mark.parametrize("psi", sorted(TABLE_1))
def test_zero_paper_table_1(psi):
    for n, row in TABLE_1[psi].items():
        for stage, gb in zip((1, 2, 3), row, strict=True):
            got = sharded_fixed_bytes(int(psi), n_gpus=n, zero_stage=stage, policy="zero-mixed")
            # the table rounds to 3 significant figures
            assert got.fixed_bytes / 1e9 == pytest.approx(gb, rel=6e-3, abs=0.006), (psi, n, stage)


GPT2_XL = dict(n_layer=48, n_embd=1600, n_head=25, block_size=1024, vocab_size=50257,
               batch_size=1, tie_weights=True, dtype="float16")


def test_gpt2_xl_on_8_gpus():
    """GPT-2 XL (1.56B parameters, the ZeRO paper's section 3.1 example: 16 bytes a parameter,
    'at least 24 GB' on one GPU) planned for 8 GPUs: fixed bytes per GPU follow the formulas."""
    prof = gpt_analytic_profile(GPT2_XL, device="cuda")
    n = prof.meta["fixed"]["n_params"]
    assert 1.55e9 < n < 1.56e9
    psi = n
    one = planner.plan(prof, strategy="store-all", precision="zero-mixed")
    other = shard_profile(prof, policy="zero-mixed").meta["sharding"]["other_fixed_bytes"]
    assert one.options["fixed_bytes_per_gpu"] == 16 * psi + other
    assert 16 * psi / 1e9 > 24
    largest = max(layer.param_bytes for layer in prof.layers) // 2  # fp16 weights
    expect = {
        0: 16 * psi,
        1: 4 * psi + -(-12 * psi // 8),
        2: 2 * psi + -(-2 * psi // 8) + -(-12 * psi // 8),
        3: 2 * -(-2 * psi // 8) + -(-12 * psi // 8) + 2 * largest,
    }
    # beside the states, FSDP's buffers (NOTE [ Communication buffers ] item 4): ZeRO-2 the largest
    # unit's unsharded fp16 gradients, ZeRO-3 those and a prefetched second unit of fp16 weights
    buffers = {0: 0, 1: 0, 2: 2 * largest, 3: 4 * largest}
    store_all = one.predicted.peak_bytes
    for stage, fixed in expect.items():
        plan = planner.plan(prof, strategy="store-all", n_gpus=8, zero_stage=stage,
                            precision="zero-mixed")
        assert plan.options["fixed_bytes_per_gpu"] == fixed + other + buffers[stage], stage
        # sharding changes what each GPU holds, never the activation chain
        assert plan.predicted.peak_bytes == store_all
        assert plan.predicted.total_peak_bytes == fixed + other + buffers[stage] + store_all


def test_memory_budget_per_gpu_buys_fewer_checkpoints():
    prof = gpt_analytic_profile(GPT2_XL, device="cuda")
    # 16 x 1.56e9 > 24 GB: infeasible (no schedule can fit), not bad input
    over = planner.plan(prof, memory_bytes=24 * 10**9, precision="zero-mixed")
    assert not over.feasible and over.schedule == []
    assert over.message.startswith(f"the model states alone need {over.options['fixed_bytes_per_gpu']} "
                                   "bytes per GPU (zero-mixed precision), more than the 24000000000")
    mem = 10 * 10**9
    overheads = []
    for stage in (1, 2, 3):
        plan = planner.plan(prof, memory_bytes=mem, n_gpus=8, zero_stage=stage,
                            precision="zero-mixed", strategy="uniform")
        assert plan.feasible and plan.predicted.total_peak_bytes <= mem
        overheads.append(plan.predicted.overhead)
    # more memory left beside the states: less recompute
    assert overheads[0] > overheads[2] and overheads[0] >= overheads[1] >= overheads[2]


def test_measured_bytes_per_parameter_kept():
    prof = gpt_analytic_profile(dict(n_layer=2, n_embd=32, n_head=2, block_size=8, vocab_size=64,
                                     batch_size=2), device="cpu")
    f = prof.meta["fixed"]
    assert shard_profile(prof).fixed_bytes == prof.fixed_bytes  # 1 GPU, stage 0: unchanged
    two = shard_profile(prof, n_gpus=2, zero_stage=1)
    steps = f["optimizer_bytes"] - 2 * f["param_bytes"]  # AdamW's per-tensor step counters
    assert two.fixed_bytes == prof.fixed_bytes - (2 * f["param_bytes"]) // 2
    assert two.meta["sharding"]["other_fixed_bytes"] == prof.fixed_bytes - 2 * f["param_bytes"] - 2 * f["param_bytes"]
    assert steps > 0
    with pytest.raises(PlanError, match="zero_stage"):
        planner.plan(prof, zero_stage=5)
    with pytest.raises(PlanError, match="n_params"):
        shard_profile(prof.model_copy(update={"meta": {}}), n_gpus=2)
