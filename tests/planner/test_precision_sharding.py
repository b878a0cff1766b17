"""Fixed bytes per parameter for each precision policy, and ZeRO's per-GPU model states."""

from __future__ import annotations

import pytest
from memplan.planner.precision import POLICIES, fixed_bytes, get_policy
from memplan.planner.schema import PlanError
from memplan.planner.sharding import sharded_fixed_bytes


def test_bytes_per_param():
    assert {name: p.bytes_per_param for name, p in POLICIES.items()} == {
        "fp32": 16, "bf16-mixed": 16, "fp16-mixed": 16, "bf16": 8, "zero-mixed": 16,
    }
    assert fixed_bytes(1000, "bf16") == 8000
    with pytest.raises(PlanError, match="precision: unknown policy 'fp8'"):
        get_policy("fp8")
    with pytest.raises(PlanError, match="n_params"):
        fixed_bytes(-1)


@pytest.mark.parametrize(
    ("stage", "gb"),
    # ZeRO paper, Figure 1: Psi = 7.5B, N_d = 64, K = 12
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_paper_figure_1(stage, gb):
    mem = sharded_fixed_bytes(7_500_000_000, n_gpus=64, zero_stage=stage, policy="zero-mixed")
    assert mem.fixed_bytes / 1e9 == pytest.approx(gb, abs=0.05)


def test_exact_shards_and_gathered_unit():
    mem = sharded_fixed_bytes(1000, n_gpus=3, zero_stage=3, policy="zero-mixed", gathered_params=10)
    assert (mem.weight_bytes, mem.grad_bytes, mem.optimizer_bytes) == (667, 667, 4000)
    assert mem.gathered_bytes == 20 and mem.fixed_bytes == 667 + 667 + 4000 + 20
    one = sharded_fixed_bytes(1000, n_gpus=1, zero_stage=3, gathered_params=10)
    assert one.fixed_bytes == 16000  # one GPU: nothing to shard or gather
    with pytest.raises(PlanError, match="zero_stage"):
        sharded_fixed_bytes(10, zero_stage=4)
    with pytest.raises(PlanError, match="n_gpus"):
        sharded_fixed_bytes(10, n_gpus=0)
