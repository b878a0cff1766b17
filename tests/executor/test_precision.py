"""Precision policies and checkpoint storage, measured on the CPU (exact allocation accounting):
predicted fixed and activation bytes per policy, the bf16 residual-stream fact, storage realised
byte for byte, and the planner's tolerance kept."""

from __future__ import annotations

import pytest
import torch
from memplan.executor import run_plan
from memplan.executor.precision_run import (
    grad_error,
    measure_sensitivity,
    plan_grads,
    policy_autocast,
    reference_grads,
    train_curve,
    with_sensitivity,
)
from memplan.planner.checkpoint_dtype import KAPPA, STORAGE_DTYPES, apply_storage
from memplan.planner.precision import get_policy
from memplan.profiler.measure import profile_chain
from memplan.profiler.models.gpt import GPTConfig, build_gpt

from memplan import planner

torch.set_num_threads(1)

TINY = dict(n_layer=8, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4)
POLICIES = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
# the step's fp32 scalars (the loss value's buffer, the seed gradient, the loss scale) sit at one
# op in the replay and at a neighbour in the run: the peaks agree to within these few bytes
SCALARS_BYTES = 16


def _build(policy: str, **kw):
    pdtype, ac = policy_autocast(policy)
    stages, idx = build_gpt(GPTConfig(**{**TINY, **kw}, dtype=str(pdtype).removeprefix("torch.")))
    return stages, idx, ac


def _every_stage_plan(L: int):
    from memplan.planner._build import one_level_ops
    from memplan.planner.schema import Plan

    ops = one_level_ops([(i, i, True) for i in range(1, L)] + [(L, L, False)], L)
    return Plan(strategy="every", feasible=True, schedule=[list(o) for o in ops], n_stages=L)


@pytest.mark.parametrize("policy", POLICIES)
def test_predicted_fixed_and_activation_bytes_equal_measured(policy):
    stages, idx, ac = _build(policy, n_layer=3)
    prof = profile_chain(stages, idx, repeats=1, warmup=0, autocast_dtype=ac)
    meta = prof.meta["fixed"]
    # fixed: the policy's bytes per parameter, plus AdamW's 4-byte step counter per tensor on the
    # CPU and the head's targets buffer (8 B per token)
    n_tensors = len({id(p) for s in stages for p in s.parameters()})
    expect = meta["n_params"] * get_policy(policy).bytes_per_param + 4 * n_tensors + 8 * 4 * 16
    assert prof.fixed_bytes == expect
    store = planner.plan(prof, strategy="store-all", budget_bytes=None)
    tight = planner.plan(prof, strategy="optimal",
                         budget_bytes=int(store.predicted.peak_bytes * 0.6))
    for plan in (store, tight):
        r = run_plan(stages, idx, plan, profile=prof, steps=2, autocast_dtype=ac)
        assert r.measured_fixed_bytes == expect
        assert abs(r.measured_peak_bytes - r.predicted_peak_bytes) <= SCALARS_BYTES, (policy, plan.strategy)
    # the blocks' outputs: the residual stream stays fp32 under autocast, bf16 when pure
    want = "bfloat16" if policy == "bf16" else "float32"
    assert [la.output_dtype for la in prof.layers[:-1]] == [want] * (len(prof.layers) - 1)


def test_bf16_storage_of_the_fp32_residual_stream_changes_gradients_fp32_storage_does_not():
    stages, idx, ac = _build("bf16-mixed")
    L = len(stages)
    plan = _every_stage_plan(L)
    ops = plan.ops()
    _, ref = plan_grads(stages, idx, ops, autocast_dtype=ac)
    every = {i: "float32" for i in range(1, L)}
    _, same = plan_grads(stages, idx, ops, autocast_dtype=ac, storage=every)
    assert grad_error(same, ref).bitwise  # fp32 storage of an fp32 stream: lossless
    _, low = plan_grads(stages, idx, ops, autocast_dtype=ac, storage={i: "bfloat16" for i in range(1, L)})
    err = grad_error(low, ref)
    assert not err.bitwise
    # 8 blocks, every checkpoint in bf16: a relative error of a few bf16 roundoffs (~8e-3)
    assert 1e-3 < err.max_rel < 3e-2, err


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_stored_plans_run_byte_exact_against_the_replay(dtype):
    stages, idx, ac = _build("bf16-mixed")
    prof = profile_chain(stages, idx, repeats=1, warmup=0, autocast_dtype=ac)
    sa = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    stored = 0
    for strategy, frac in (("sqrt", None), ("uniform", None), ("optimal", 0.35), ("optimal", 0.22)):
        budget = int(sa * frac) if frac else None
        base = planner.plan(prof, strategy=strategy, budget_bytes=budget)
        plan = apply_storage(base, prof, checkpoint_dtype=dtype, tolerance=1.0)
        if not plan.checkpoint_dtypes:
            continue  # storing would not lower this schedule's peak: left as computed
        stored += 1
        r = run_plan(stages, idx, plan, profile=prof, steps=2, autocast_dtype=ac)
        assert abs(r.measured_peak_bytes - r.predicted_peak_bytes) <= SCALARS_BYTES, (strategy, frac)
        assert r.predicted_peak_bytes < base.predicted.peak_bytes
    assert stored >= 2


def test_the_planner_keeps_its_tolerance_when_measured():
    stages, idx, ac = _build("bf16-mixed")
    sens = measure_sensitivity(stages, idx, autocast_dtype=ac)
    # the fallback (KAPPA unit roundoffs) bounds every measured sensitivity
    for d, values in sens.items():
        u = STORAGE_DTYPES[d].unit_roundoff
        assert all(v is None or v <= KAPPA * u for v in values), (d, values)
    prof = with_sensitivity(profile_chain(stages, idx, repeats=1, warmup=0, autocast_dtype=ac), sens)
    sa = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    for tol in (0.0, 0.012, 0.03, 0.1):
        plan = planner.plan(prof, strategy="optimal", budget_bytes=int(sa * 0.25),
                            checkpoint_dtype="auto", tolerance=tol)
        if not plan.feasible:
            continue
        _, ref = plan_grads(stages, idx, plan.ops(), autocast_dtype=ac)
        _, got = plan_grads(stages, idx, plan.ops(), autocast_dtype=ac, storage=plan.checkpoint_dtypes)
        assert plan.options["predicted_grad_error"] <= tol
        assert grad_error(got, ref).max_rel <= tol, (tol, plan.checkpoint_dtypes)


def test_gradient_error_against_fp32_and_loss_curves():
    stages, idx, _ = _build("fp32", n_layer=2)
    _, ref = reference_grads(stages, idx)
    plan = _every_stage_plan(len(stages))
    _, got = plan_grads(stages, idx, plan.ops())
    assert grad_error(got, ref).bitwise

    def build(dt):
        return build_gpt(GPTConfig(**{**TINY, "n_layer": 2}, dtype=str(dt).removeprefix("torch.")))

    fp32 = train_curve(build, plan, policy="fp32", steps=4)
    assert fp32.divergence == [0.0] * 4  # the same run, bitwise
    mixed = train_curve(build, plan, policy="bf16-mixed", steps=4, reference=fp32.reference)
    assert 0 < max(mixed.divergence) < 2e-2
