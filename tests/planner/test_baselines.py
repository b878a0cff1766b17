"""Baseline strategies: valid schedules, predictions equal to a replay, budgets respected."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memplan.planner._build import insert_drops, one_level_ops
from memplan.planner.heuristic import heuristic_plans, plan_heuristic
from memplan.planner.schema import PlanError
from memplan.planner.simulate import simulate
from memplan.planner.sqrt import sqrt_segments
from memplan.planner.uniform import uniform_segments

from memplan import planner
from tests.planner.chains import chain, random_chains, worked_example

BASELINES = ("store-all", "uniform", "sqrt", "heuristic")


def largest_single_op(prof) -> int:
    """A lower bound on any valid schedule's peak: every schedule runs R i, B i and loss, and each
    needs at least its own operands live (a_0 is always live)."""
    x = [prof.input_bytes] + [layer.output_bytes for layer in prof.layers]
    bound = x[0] + 2 * x[-1]  # loss: a_0, a_L, d_L
    for i, layer in enumerate(prof.layers, start=1):
        inp = x[i - 1] if i > 1 else 0  # a_{i-1} beside a_0
        bound = max(
            bound,
            x[0] + inp + x[i] + layer.saved_bytes + layer.forward_temp_bytes,  # R i
            x[0] + inp + x[i] + layer.saved_bytes + x[i - 1] + layer.backward_temp_bytes,  # B i
        )
    return bound


def test_worked_example_store_all_and_16_bytes():
    prof = worked_example()
    plan = planner.plan(prof, strategy="store-all")
    assert plan.feasible and plan.predicted.time_s == 36 and plan.predicted.peak_bytes == 31
    for name in BASELINES:
        p16 = planner.plan(prof, budget_bytes=16, strategy=name)
        assert not p16.feasible, name
        assert "16 bytes" in p16.message


def test_infeasible_plan_says_the_least_budget():
    plan = planner.plan(worked_example(), budget_bytes=16, strategy="uniform")
    assert not plan.feasible and plan.schedule == [] and plan.predicted is None
    assert "least budget it fits is 21 bytes" in plan.message
    assert planner.plan(worked_example(), budget_bytes=21, strategy="uniform").feasible


def test_uniform_given_k_and_chosen_k():
    prof = worked_example()
    assert uniform_segments(4, 2) == [(1, 2, True), (3, 4, False)]
    assert uniform_segments(5, 2) == [(1, 2, True), (3, 4, True), (5, 5, False)]
    plan = planner.plan(prof, budget_bytes=30, strategy="uniform", k=4)
    assert plan.options == {"k": 4} and plan.predicted.peak_bytes == 31 and not plan.feasible
    chosen = planner.plan(prof, budget_bytes=30, strategy="uniform")
    assert chosen.feasible and chosen.predicted.peak_bytes <= 30
    with pytest.raises(PlanError, match="k: the segment length"):
        planner.plan(prof, strategy="uniform", k=0)


def test_sqrt_balances_forward_time_not_count():
    # 9 stages: one slow stage first; 3 segments by time put it alone
    prof = chain([1] * 10, [12, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 9, [1] * 9)
    segs = sqrt_segments(prof)
    assert len(segs) == 3
    assert segs[0] == (1, 1, True)
    even = chain([1] * 10, [1] * 9, [1] * 9, [1] * 9)
    assert [(p, q) for p, q, _ in sqrt_segments(even)] == [(1, 3), (4, 6), (7, 9)]


def test_heuristic_recomputes_memory_intensive_stages_first():
    # stages 2 and 3 save as much; stage 2 is cheaper to rerun, so it goes first
    prof = chain([1] * 5, [5, 1, 2, 5], [1] * 4, [1, 20, 20, 1])
    assert planner.plan(prof, strategy="heuristic").predicted.peak_bytes == 48
    plan = planner.plan(prof, budget_bytes=40, strategy="heuristic")
    assert plan.feasible and plan.recomputed == [2] and plan.predicted.peak_bytes == 28


@pytest.mark.parametrize("n_stages", [12, 300])  # the linear scan, and the bisection above 256
def test_heuristic_plans_share_tries_and_equal_one_plan_each(n_stages):
    r = random.Random(n_stages)
    prof = chain([r.randint(1, 6) for _ in range(n_stages + 1)], [r.uniform(1, 6) for _ in range(n_stages)],
                 [r.uniform(1, 6) for _ in range(n_stages)], [r.randint(0, 6) for _ in range(n_stages)])
    top = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    budgets = [None, 0, *(top * k // 10 for k in range(1, 11))]  # 0: infeasible
    together = heuristic_plans(prof, budgets)
    for budget, plan in zip(budgets, together, strict=True):
        alone = plan_heuristic(prof, budget)
        assert plan.model_dump() == alone.model_dump(), budget
    assert not together[1].feasible and together[-1].feasible


def test_bad_options_and_budgets():
    prof = worked_example()
    with pytest.raises(PlanError, match="strategy: unknown 'fastest'"):
        planner.plan(prof, strategy="fastest")
    with pytest.raises(PlanError, match="k: strategy 'sqrt' takes no such option"):
        planner.plan(prof, strategy="sqrt", k=2)
    for bad, needle in [(-1, "at least 0"), (float("nan"), "finite"), ("10", "number of bytes")]:
        with pytest.raises(PlanError, match=f"budget_bytes: .*{needle}"):
            planner.plan(prof, budget_bytes=bad)


def test_insert_drops_frees_as_early_as_allowed():
    ops = insert_drops([("F", 1), ("F", 2), ("R", 3), ("loss",), ("B", 3)], 3)
    assert ops == [("F", 1), ("F", 2), ("drop", 1), ("R", 3), ("loss",), ("drop", 3), ("B", 3),
                   ("drop", 2)]


@settings(max_examples=150, deadline=None)
@given(prof=random_chains(max_stages=9), budget=st.integers(0, 80))
def test_baselines_are_valid_and_never_beat_store_all(prof, budget):
    fastest = planner.plan(prof, strategy="store-all").predicted.time_s
    for name in BASELINES:
        plan = planner.plan(prof, budget_bytes=budget, strategy=name)
        if plan.schedule:
            sim = simulate(prof, plan.schedule)
            assert sim.valid, (name, sim.error)
            p = plan.predicted
            assert (p.time_s, p.peak_bytes, p.total_peak_bytes) == (
                sim.time_s, sim.peak_bytes, sim.total_peak_bytes)
            assert math.isclose(p.recompute_s, sim.recompute_s)
            assert p.time_s >= fastest
            # no valid schedule's peak is below its largest single op (the peak is a max over ops)
            assert sim.peak_bytes == max(sim.timeline)
            assert sim.peak_bytes >= largest_single_op(prof)
        if plan.feasible:
            assert plan.predicted.peak_bytes <= budget, name
        else:
            assert plan.message


@settings(max_examples=100, deadline=None)
@given(prof=random_chains(max_stages=9), data=st.data())
def test_any_one_level_plan_is_valid(prof, data):
    L = prof.n_stages
    cuts = sorted(data.draw(st.sets(st.integers(1, L - 1), max_size=L - 1)) if L > 1 else [])
    bounds, p = [], 1
    for q in cuts + [L]:
        bounds.append((p, q))
        p = q + 1
    flags = data.draw(st.lists(st.booleans(), min_size=len(bounds), max_size=len(bounds)))
    segs = [(p, q, r) for (p, q), r in zip(bounds, flags, strict=True)]
    sim = simulate(prof, one_level_ops(segs, L))
    assert sim.valid, sim.error
    expected_extra = sum(prof.layers[i - 1].forward_s for p, q, r in segs if r for i in range(p, q + 1))
    assert math.isclose(sim.recompute_s, expected_extra)


@settings(max_examples=60, deadline=None)
@given(prof=random_chains(max_stages=9))
def test_uniform_keeps_everything_when_nothing_needs_saving(prof):
    # no budget, or a budget store-all meets: k = L, store-all's schedule and prediction exactly
    store_all = planner.plan(prof, strategy="store-all")
    peak = store_all.predicted.peak_bytes
    for budget in (None, peak, peak + 1):
        plan = planner.plan(prof, budget_bytes=budget, strategy="uniform")
        assert plan.feasible and plan.options == {"k": prof.n_stages}, budget
        assert plan.schedule == store_all.schedule and plan.recomputed == []
        assert plan.predicted == store_all.predicted
    # a budget below store-all's peak makes it recompute (or say it cannot fit)
    tighter = planner.plan(prof, budget_bytes=peak - 1, strategy="uniform")
    if tighter.feasible:
        assert tighter.options["k"] < prof.n_stages and tighter.predicted.peak_bytes < peak


def test_uniform_recomputes_without_a_budget_only_when_k_is_given():
    prof = chain([1] * 7, [1] * 6, [2] * 6, [3] * 6)
    assert planner.plan(prof, strategy="uniform").recomputed == []
    given_k = planner.plan(prof, strategy="uniform", k=2)
    assert given_k.feasible and given_k.recomputed == [1, 2, 3, 4]
    assert given_k.predicted.overhead > 0
