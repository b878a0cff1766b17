"""A plan for 2 GPUs at ZeRO 1, checked on 2 gloo processes on the CPU: per-rank activation peak,
model-state bytes and total against the prediction; gradients against one process."""

from __future__ import annotations

import pytest
from memplan.executor.distributed import DistributedSpec, run_distributed, run_ranks
from memplan.executor.report import ExecutorError

from memplan import planner


def test_zero1_plan_on_two_gloo_ranks():
    spec = DistributedSpec(n_layer=3, zero_stage=1, budget_bytes=120_000, strategy="optimal")
    rep = run_distributed(spec)
    assert rep.status == "ok", rep.message
    plan = planner.Plan.model_validate(rep.plan)
    # the budget forces checkpoints: the plan is not store-all
    assert plan.predicted.peak_bytes <= 120_000 and plan.predicted.recompute_s > 0
    # every rank's planned step allocates exactly what the replay predicts
    assert all(r.measured_peak_bytes == rep.predicted_peak_bytes for r in rep.ranks)
    # the optimizer state is split across the ranks, nothing duplicated (status checks the sum)
    assert sum(r.optimizer_bytes for r in rep.ranks) == rep.optimizer_bytes_unsharded
    assert all(r.optimizer_bytes < 0.51 * rep.optimizer_bytes_unsharded for r in rep.ranks)
    assert sum(r.params for r in rep.ranks) == rep.n_params
    # weights and gradients are whole on each rank (stage 1): 4 + 4 bytes per parameter
    assert all(r.weight_bytes == r.grad_bytes == 4 * rep.n_params for r in rep.ranks)
    # per-rank fixed bytes: the formula's even split, off only by AdamW's 4-byte step counters
    # and ZeroRedundancyOptimizer's whole-tensor partition
    assert abs(rep.measured_fixed_bytes - rep.predicted_fixed_bytes) <= 64
    assert rep.total_error_pct is not None and abs(rep.total_error_pct) < 0.05
    assert rep.grad_max_rel_diff < 1e-5 and rep.param_max_rel_diff < 1e-6


@pytest.mark.parametrize("stage", [2, 3])
def test_stages_not_run_here_are_refused(stage):
    with pytest.raises(ExecutorError, match="zero_stage: this gloo runner executes stages"):
        run_distributed(DistributedSpec(zero_stage=stage))


def test_bad_world_size():
    with pytest.raises(ExecutorError, match="world_size"):
        run_distributed(DistributedSpec(world_size=0))


def _rank_with_atexit(rank: int, out: str) -> None:
    """Writes a file now and registers an exit handler that would write a second one."""
    import atexit
    from pathlib import Path

    Path(out, f"ran{rank}").write_text("ok")
    atexit.register(Path(out, f"finalized{rank}").write_text, "finalized")


def _rank_that_fails(rank: int, out: str) -> None:
    if rank == 1:
        raise ValueError("rank 1's bad input")


def test_a_rank_that_returns_leaves_without_finalization(tmp_path):
    """NOTE [ A rank leaves nothing running ]: what a rank wrote stays, and the process ends
    before interpreter finalization, where threads torch.distributed left running would be torn
    down (its exit handlers do not run)."""
    run_ranks(_rank_with_atexit, (str(tmp_path),), nprocs=2, timeout_s=120)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ran0", "ran1"]


def test_a_rank_that_raises_is_reported_in_one_line(tmp_path):
    with pytest.raises(ExecutorError, match=r"^ranks: a rank failed: ValueError: rank 1's bad input$"):
        run_ranks(_rank_that_fails, (str(tmp_path),), nprocs=2, timeout_s=120)
