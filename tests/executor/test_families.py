"""The built-in families under every strategy: gradients equal to the unplanned step, buffers and
counters equal after 3 steps, and the predicted peak within 2% of the measured one (CPU, exact
allocation accounting). Mixed precision within its dtype's tolerance."""

from __future__ import annotations

import pytest
import torch

from memplan import planner

gpt = pytest.importorskip("memplan.profiler.models.gpt")
measure = pytest.importorskip("memplan.profiler.measure")

from memplan.executor import run_plan  # noqa: E402
from memplan.executor.compare import TOLERANCE  # noqa: E402

from tests.executor.models import every_strategy  # noqa: E402

TINY = dict(n_layer=3, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4)
FEATURES = {
    "dense": dict(),
    "math": dict(attention="math", dropout=0.1),
    "moe": dict(moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0),
    "exit": dict(exit_layers=(0, 1), exit_threshold=0.05),
    "all": dict(moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0, exit_layers=(1,),
                exit_threshold=0.05, dropout=0.1),
}


def _plans(prof):
    return every_strategy(prof, 0.75)


def test_gpt_all_features_together_every_strategy():
    _check_gpt("all")


@pytest.mark.slow
@pytest.mark.parametrize("feature", sorted(set(FEATURES) - {"all"}))
def test_gpt_each_feature_alone_every_strategy(feature):
    _check_gpt(feature)


def _check_gpt(feature):
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, **FEATURES[feature]))
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    for strategy, plan in _plans(prof):
        r = run_plan(stages, idx, plan, profile=prof, steps=3)
        assert r.status == "ok", (strategy, r.message)
        assert r.grad_max_rel_diff <= 1e-6 and r.buffer_max_abs_diff == 0.0, strategy
        assert abs(r.peak_error_pct) <= 2.0, (strategy, r.peak_error_pct)


def test_conv_chain_batchnorm_every_strategy():
    conv = pytest.importorskip("memplan.profiler.models.conv")
    stages, x = conv.build_conv(conv.ConvConfig(channels=(4, 8), blocks=(1, 1), image_size=8,
                                                batch_size=4))
    prof = measure.profile_chain(stages, x, repeats=1, warmup=0)
    for strategy, plan in _plans(prof):
        r = run_plan(stages, x, plan, profile=prof, steps=3)
        assert r.status == "ok" and r.buffer_max_abs_diff == 0.0, (strategy, r.message)
        assert abs(r.peak_error_pct) <= 2.0, (strategy, r.peak_error_pct)


def test_a_model_built_in_bfloat16_is_judged_at_its_tolerance():
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, dtype="bfloat16"))
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    r = run_plan(stages, idx, planner.plan(prof, strategy="sqrt"), profile=prof, steps=2)
    assert r.dtype == "bfloat16" and r.tolerance == TOLERANCE["bfloat16"]
    assert r.status == "ok", r.message
    assert r.measured_fixed_bytes == prof.fixed_bytes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_within_dtype_tolerance(dtype):
    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, dropout=0.1))
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0, autocast_dtype=dtype)
    plan = planner.plan(prof, strategy="sqrt")
    r = run_plan(stages, idx, plan, profile=prof, steps=3, autocast_dtype=dtype)
    assert r.dtype == str(dtype).removeprefix("torch.")
    assert r.status == "ok", r.message
    assert r.grad_max_rel_diff <= r.tolerance
    assert abs(r.loss - r.reference_loss) <= r.tolerance * abs(r.reference_loss)


def test_every_op_of_a_gpt_plan_is_replayed_to_the_byte():
    # each op's peak in a real step against the replay's, op by op: recomputing (`F`) forwards
    # included, whose no-grad working set the profile measures (NOTE [ no-grad forward bytes ])
    import contextlib

    from memplan.executor.runner import ScheduleRunner
    from memplan.planner.simulate import simulate
    from memplan.profiler.memory import measure_memory
    from memplan.profiler.tensors import unique_params

    stages, idx = gpt.build_gpt(gpt.GPTConfig(**TINY, dropout=0.1, attention="math"))
    prof = measure.profile_chain(stages, idx, repeats=1, warmup=0)
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    plan = planner.plan(prof, strategy="optimal", budget_bytes=int(store * 0.45))
    assert plan.feasible and any(op[0] == "F" for op in plan.ops())
    for p in unique_params(stages):
        p.grad = torch.zeros_like(p)
    runner = ScheduleRunner(stages, plan.ops(), device=torch.device("cpu"))
    for step in range(2):
        runner.prepare()
        if step == 0:
            runner.step(idx)
            continue
        with measure_memory("cpu") as meter:
            def mark(k, op):
                meter.mark(str(k))
                return contextlib.nullcontext()
            runner.step(idx, op_context=mark)
    timeline = simulate(prof, plan.schedule).timeline
    measured = [meter.phases[str(k)].peak_bytes + prof.input_bytes for k in range(len(timeline))]
    for k, op in enumerate(plan.ops()):
        # 4 bytes: the loss value's buffer; the embedding's backward allocates 512 bytes less
        # than its profile (its index bookkeeping depends on the tokens' order)
        assert -512 <= measured[k] - timeline[k] <= 4, (k, op, measured[k], timeline[k])
