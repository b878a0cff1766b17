"""The schedule runner follows the chain model to the byte, for every strategy and hand-written
multi-level schedules, and its gradients equal the unplanned step's."""

from __future__ import annotations

import pytest
import torch
from memplan.executor import ExecutorError, run_plan
from memplan.planner.schema import Plan
from memplan.planner.simulate import simulate

from memplan import planner
from tests.executor.models import mlp_chain
from tests.executor.synth import synth_chain, worked_chain

K = 1024


def _plan_from_ops(prof, ops, strategy="hand") -> Plan:
    sim = simulate(prof, ops)
    assert sim.valid, sim.error
    from memplan.planner._build import predicted

    return Plan(strategy=strategy, feasible=True, schedule=[list(o) for o in ops],
                predicted=predicted(sim), n_stages=prof.n_stages,
                profile_fingerprint=prof.fingerprint())


BUDGETS = [None, 30 * K, 26 * K, 22 * K, 20 * K]


def expected_peak(prof, plan) -> int:
    """The replay's peak, plus x_i during an `R i` that runs while a_i is live and pinned by record
    i+1 (an unpinned one the runner frees first): PyTorch writes the
    recomputed output to new memory before the runner frees it, which the chain model's
    "x_i (if new)" does not count (reported to the simulator's owners; see docs/executor.md)."""
    sim = simulate(prof, plan.schedule)
    x = [prof.input_bytes] + [la.output_bytes for la in prof.layers]
    live = [True] + [False] * prof.n_stages
    rec = [False] * (prof.n_stages + 2)
    peak = 0
    for k, op in enumerate(plan.ops()):
        extra = 0
        if op[0] in ("F", "R"):
            extra = x[op[1]] if live[op[1]] and rec[op[1] + 1] else 0
            live[op[1]] = True
            rec[op[1]] = rec[op[1]] or op[0] == "R"
        elif op[0] == "drop":
            live[op[1]] = False
        elif op[0] == "B":
            rec[op[1]] = False
        peak = max(peak, sim.timeline[k] + extra)
    return peak


@pytest.mark.parametrize("strategy", sorted(planner.STRATEGIES))
def test_measured_peak_equals_replay_to_the_byte(strategy):
    stages, a0, prof = worked_chain()
    ran = 0
    for budget in BUDGETS:
        plan = planner.plan(prof, strategy=strategy, budget_bytes=budget)
        if not plan.schedule:
            continue
        r = run_plan(stages, a0, plan, profile=prof, steps=2)
        assert r.measured_peak_bytes == expected_peak(prof, plan), (budget, r.forward_counts)
        assert r.status == "ok" and r.grad_max_abs_diff == 0.0
        ran += 1
    assert ran >= 1


def test_non_persistent_multi_level_schedule_runs_as_replayed():
    # drop the checkpoint a_1 after the forward, and recompute it from a_0 twice
    x = [2 * K, 3 * K, 5 * K, 4]
    stages, a0, prof = synth_chain(x, [4 * K, 2 * K, 8], [K, 0, 0], [8, 2 * K, 8])
    ops = [("F", 1), ("F", 2), ("drop", 1), ("R", 3), ("loss",), ("drop", 3), ("B", 3),
           ("drop", 2), ("F", 1), ("R", 2), ("B", 2), ("drop", 1), ("R", 1), ("drop", 1), ("B", 1)]
    plan = _plan_from_ops(prof, ops)
    r = run_plan(stages, a0, plan, profile=prof, steps=2)
    assert r.forward_counts == [3, 2, 1]
    assert r.measured_peak_bytes == plan.predicted.peak_bytes
    assert r.status == "ok" and r.grad_max_abs_diff == 0.0


def test_random_chains_match_replay_for_every_strategy():
    g = torch.Generator().manual_seed(7)

    def sizes(n, lo, hi):
        return [int(v) * 512 for v in torch.randint(lo, hi, (n,), generator=g)]

    for _ in range(4):
        L = int(torch.randint(3, 7, (1,), generator=g))
        x = sizes(L, 1, 9) + [4]
        stages, a0, prof = synth_chain(x, sizes(L, 0, 9), sizes(L, 0, 4),
                                       [max(v, 8) for v in sizes(L, 0, 4)])
        store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
        for strategy in planner.STRATEGIES:
            plan = planner.plan(prof, strategy=strategy, budget_bytes=int(store * 0.8))
            if not plan.schedule:
                continue
            r = run_plan(stages, a0, plan, profile=prof, steps=1)
            assert r.measured_peak_bytes == expected_peak(prof, plan), (strategy, plan.schedule)


@pytest.mark.parametrize("strategy", sorted(planner.STRATEGIES))
def test_gradients_bitwise_equal_on_an_mlp_with_dropout_and_batchnorm(strategy):
    stages, x = mlp_chain(6, width=32, batch=16)
    from tests.executor.models import measured_profile

    prof = measured_profile(stages, x, repeats=1)
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    plan = planner.plan(prof, strategy=strategy, budget_bytes=int(store * 0.7))
    if not plan.schedule:
        plan = planner.plan(prof, strategy=strategy)
    r = run_plan(stages, x, plan, profile=prof, steps=3)
    assert r.status == "ok", r.message
    assert r.grad_max_abs_diff == 0.0 and r.buffer_max_abs_diff == 0.0
    assert r.param_max_abs_diff == 0.0
    assert r.loss == r.reference_loss


def test_integer_token_input_gets_embedding_gradients():
    stages, idx = mlp_chain(4, width=32, batch=16, tokens=True, batchnorm=False)
    prof = _profile_like(stages, idx)
    plan = planner.plan(prof, strategy="uniform", k=2)
    r = run_plan(stages, idx, plan, profile=prof, steps=2)
    assert r.forward_counts[0] == 2  # the embedding is recomputed
    assert r.status == "ok" and r.grad_max_abs_diff == 0.0
    assert float(stages[0].emb.weight.grad.abs().sum()) > 0


def _profile_like(stages, x):
    from tests.executor.models import measured_profile

    return measured_profile(stages, x, repeats=1)


def test_plan_for_another_model_is_refused_before_anything_runs():
    stages, x = mlp_chain(4, width=32, batch=16)
    prof = _profile_like(stages, x)
    other_stages, other_x = mlp_chain(5, width=32, batch=16)
    other = _profile_like(other_stages, other_x)
    calls = []
    for s in stages:
        s.register_forward_hook(lambda module, *a: calls.append(module))
    before = [t.detach().clone() for s in stages for t in [*s.parameters(), *s.buffers()]]

    plan5 = planner.plan(other, strategy="sqrt")
    with pytest.raises(ExecutorError, match="n_stages"):
        run_plan(stages, x, plan5, profile=prof)
    # same stage count, another model: the fingerprint differs
    wide_stages, wide_x = mlp_chain(4, width=48, batch=16)
    wide = _profile_like(wide_stages, wide_x)
    with pytest.raises(ExecutorError, match="profile_fingerprint"):
        run_plan(stages, x, planner.plan(wide, strategy="sqrt"), profile=prof)
    # the right plan, but the profile of another model
    with pytest.raises(ExecutorError, match="output_bytes"):
        run_plan(stages, x, planner.plan(wide, strategy="sqrt"), profile=wide)
    assert not any(any(m is s for s in stages) for m in calls)  # the model itself never ran
    after = [t.detach() for s in stages for t in [*s.parameters(), *s.buffers()]]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_invalid_schedule_and_options_are_refused():
    stages, a0, prof = worked_chain()
    plan = planner.plan(prof, strategy="store-all")
    bad = plan.model_copy(update={"schedule": [["F", 1], ["loss"]]})
    with pytest.raises(ExecutorError, match="plan.schedule"):
        run_plan(stages, a0, bad, profile=prof)
    with pytest.raises(ExecutorError, match="steps"):
        run_plan(stages, a0, plan, profile=prof, steps=0)
    with pytest.raises(ExecutorError, match="optimizer"):
        run_plan(stages, a0, plan, profile=prof, optimizer="lion")
    with pytest.raises(ExecutorError, match="autocast_dtype"):
        run_plan(stages, a0, plan, profile=prof, autocast_dtype=torch.int8)


class _JitterFn(torch.autograd.Function):
    """Identity whose backward scales the gradient by 1 + 2^-23 (one float32 ulp) on every other
    call: the reference and the planned run (one backward each per step) get gradients apart in
    the last bits, as a GPU's atomic adds summing in another order give."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _JitterFn.calls += 1
        return g * (1 + 2.0**-23) if _JitterFn.calls % 2 else g


class _Jitter(torch.nn.Module):
    def forward(self, x):
        return _JitterFn.apply(x)


def _store_all_run(stages, x, **kw):
    prof = _profile_like(stages, x)
    return run_plan(stages, x, planner.plan(prof, strategy="store-all"), profile=prof, **kw)


def test_every_step_starts_from_the_planned_state():
    # the planned model is moved after each step (as a last-bit gradient difference and AdamW
    # would move it); the reference follows, so every step's gradients stay bitwise equal
    stages, x = mlp_chain(3, width=32, batch=16, batchnorm=False, dropout=0.0)

    def nudge(step, steps):
        with torch.no_grad():
            stages[0].fc.weight.add_(1e-3)

    r = _store_all_run(stages, x, steps=3, on_step=nudge)
    assert [s.grad_max_abs_diff for s in r.step_records] == [0.0, 0.0, 0.0]
    # after the last step nothing follows: the parameters are judged, and differ
    assert r.status == "mismatch" and r.message.startswith("parameters differ after 3 steps")


def _two_learning_rates():
    made = []

    def factory(params):  # the planned model's optimizer first, then the reference's
        made.append(torch.optim.SGD(params, lr=1e-2 * (1 + 0.01 * len(made))))
        return made[-1]
    return factory


@pytest.mark.parametrize("jitter", [False, True])
def test_parameters_judged_only_after_bitwise_gradients(jitter):
    stages, x = mlp_chain(3, width=32, batch=16, batchnorm=False, dropout=0.0)
    if jitter:
        stages.insert(2, _Jitter())
    r = _store_all_run(stages, x, steps=2, optimizer=_two_learning_rates())
    assert r.param_max_abs_diff > 0  # the optimizers differ on purpose
    if jitter:  # gradients within tolerance but not bitwise: the update is not judged
        assert 0 < r.grad_max_rel_diff <= r.tolerance
        assert r.status == "ok" and "parameters not judged" in r.message, r.message
    else:
        assert r.grad_max_abs_diff == 0.0
        assert r.status == "mismatch" and r.message.startswith("parameters differ"), r.message
