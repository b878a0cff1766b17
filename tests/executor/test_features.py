"""QAT and pruning under a recomputing plan; `memplan run` end to end and its bad input."""

from __future__ import annotations

import json

import pytest

from memplan import planner

gpt = pytest.importorskip("memplan.profiler.models.gpt")
measure = pytest.importorskip("memplan.profiler.measure")

from memplan.executor import run_plan  # noqa: E402
from memplan.executor.features import apply_features  # noqa: E402

TINY = dict(n_layer=2, n_embd=32, n_head=2, block_size=8, vocab_size=32, batch_size=2, dropout=0.1,
            attention="math")


def _run(stages, idx):
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    plan = planner.plan(prof, strategy="uniform", k=1)  # every block but the last recomputed
    return run_plan(stages, idx, plan, profile=prof, steps=3)


@pytest.mark.parametrize("backend", ["torchao", "torch.ao"])
def test_qat_gradients_and_observers_equal_the_unplanned_run(backend):
    if backend == "torchao":
        pytest.importorskip("torchao")
    from memplan.executor.features.qat import apply_qat

    stages, idx = gpt.build_gpt(gpt.GPTConfig(**{**TINY, "block_size": 16, "batch_size": 4}))
    note = apply_qat(stages, backend=backend)
    assert backend.split(".")[0] in note
    r = _run(stages, idx)
    assert r.status == "ok" and r.grad_max_abs_diff == 0.0 and r.buffer_max_abs_diff == 0.0
    assert abs(r.peak_error_pct) <= 2.0


def test_prune_shrinks_the_model_and_the_optimizer_holds_the_new_parameters():
    pytest.importorskip("torch_pruning")
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY))
    before = sum(p.numel() for s in stages for p in s.parameters())
    notes, extras = apply_features(stages, ["prune"])
    after = sum(p.numel() for s in stages for p in s.parameters())
    assert after < before and extras["prune"]["params_after"] == after
    assert stages[1].mlp.c_fc.weight.shape[0] == 3 * 32  # 25% of 4 * 32 removed
    r = _run(stages, idx)
    assert r.status == "ok" and r.param_max_abs_diff == 0.0
    # the optimizer stepped the pruned parameters: they moved from their initial values
    assert r.measured_fixed_bytes > 3 * 4 * after  # params, grads and AdamW's two moments


def test_memplan_run_json_and_bad_input():
    from typer.testing import CliRunner

    from memplan.cli import app

    cli = CliRunner()
    res = cli.invoke(app, ["run", "--n-layer", "2", "--d-model", "32", "--n-head", "2", "--seq", "8",
                           "--vocab", "32", "--batch", "2", "--strategy", "sqrt", "--steps", "2",
                           "--features", "moe,exit", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout[res.stdout.index("{"):])
    assert data["status"] == "ok" and data["grad_max_rel_diff"] == 0.0
    assert data["features"] == ["moe", "exit"]
    bad = cli.invoke(app, ["run", "--features", "warp"])
    assert bad.exit_code == 2 and "--features" in bad.output
    bad = cli.invoke(app, ["run", "--budget", "lots"])
    assert bad.exit_code == 2 and "--budget" in bad.output


def test_the_conv_model_takes_no_feature():
    """qat on the conv model quantized 0 Linear layers and reported an ok QAT run: refused."""
    from memplan.executor.features import check_features

    assert check_features(["qat"], "gpt") == ["qat"]
    for features in (["qat"], ["flash"]):
        with pytest.raises(ValueError, match=f"^--features: {features[0]} apply to the GPT model only"):
            check_features(features, "conv")
    assert check_features([], "conv") == []
