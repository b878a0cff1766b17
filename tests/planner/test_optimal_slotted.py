"""The optimal planner's slotted mode: valid within budget under the exact replay, its lower bound
never above the exact optimum, exact with byte-sized slots, the certified gap, the dispatch."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.planner._optimal_dp import costs_of, least_peak, solve
from memplan.planner._optimal_slotted import gap_of
from memplan.planner.schema import PlanError
from memplan.planner.simulate import simulate

from memplan import planner
from tests.planner.chains import chain, random_chains, worked_example


def _exact_best(prof, budget):
    peaks, times = solve(costs_of(prof), cap=budget).top()
    return times[-1] if peaks else math.inf


def _check(prof, plan, budget):
    sim = simulate(prof, plan.schedule)
    assert sim.valid, sim.error
    assert (sim.time_s, sim.peak_bytes) == (plan.predicted.time_s, plan.predicted.peak_bytes)
    assert sim.peak_bytes <= budget
    return sim


def test_worked_example_is_exact_with_byte_slots():
    prof = worked_example()
    for budget, time in ((30, 39), (26, 43), (20, 47), (18, 54)):
        plan = planner.plan(prof, budget_bytes=budget, mode="slotted", slots=max(budget, 8) * 4)
        assert plan.feasible and plan.options["mode"] == "slotted"
        _check(prof, plan, budget)
        assert plan.predicted.time_s == time
        assert plan.options["lower_bound_s"] == time and plan.options["optimality_gap"] == 0
        assert "within 0.000% of the exact optimum" in plan.message


def test_refinement_closes_the_gap():
    prof = worked_example()
    coarse = planner.plan(prof, budget_bytes=30, mode="slotted", slots=8, max_gap=10.0)
    assert coarse.options["optimality_gap"] > 0.1 and coarse.predicted.time_s == 43
    fine = planner.plan(prof, budget_bytes=30, mode="slotted", slots=8, max_gap=0.0)
    assert fine.options["slots"] > coarse.options["slots"] and fine.options["optimality_gap"] == 0
    assert fine.predicted.time_s == 39


def test_infeasible_is_certified_and_names_the_least_budget():
    plan = planner.plan(worked_example(), budget_bytes=17, mode="slotted", slots=100)
    assert not plan.feasible and plan.options["mode"] == "slotted"
    assert "the least budget it fits is 18 bytes" in plan.message


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_chains(max_stages=7), st.floats(0.0, 1.0), st.integers(8, 64))
def test_slotted_is_valid_and_bracketed_by_the_exact_optimum(prof, frac, slots):
    least = least_peak(costs_of(prof))
    top = planner.plan(prof).predicted.peak_bytes
    budget = int(least + frac * (top - least))
    exact = _exact_best(prof, budget)
    # max_gap=10: no refinement (its doubling runs to the time cap when the gap stays open)
    plan = planner.plan(prof, budget_bytes=budget, mode="slotted", slots=slots, max_gap=10.0)
    assert plan.options["mode"] in ("slotted", "exact")  # exact: the fallback next to the least peak
    assert plan.feasible  # the budget is at least the least peak: something fits
    _check(prof, plan, budget)
    assert plan.predicted.time_s >= exact  # never better than the exact optimum (same recurrence)
    if plan.options["mode"] == "slotted":
        lower = plan.options["lower_bound_s"]
        assert lower <= exact  # the DOWN run is a relaxation
        assert plan.options["optimality_gap"] == gap_of(plan.predicted.time_s, lower)
        assert plan.predicted.time_s <= lower * (1 + plan.options["optimality_gap"]) + 1e-9


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_chains(max_stages=6), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_byte_slots_equal_exact_and_bounds_are_monotonic(prof, f1, f2):
    least = least_peak(costs_of(prof))
    top = planner.plan(prof).predicted.peak_bytes
    b1, b2 = sorted(int(least + fr * (top - least)) for fr in (f1, f2))
    p1 = planner.plan(prof, budget_bytes=b1, mode="slotted", slots=max(8, b1), max_gap=10.0)
    p2 = planner.plan(prof, budget_bytes=b2, mode="slotted", slots=max(8, b2), max_gap=10.0)
    for p, b in ((p1, b1), (p2, b2)):
        _check(prof, p, b)
        if b >= 8:  # slots of one byte (or less): nothing is rounded, the result is exact
            assert p.predicted.time_s == _exact_best(prof, b) == p.options["lower_bound_s"]
    # lower(b2) <= opt(b2) <= opt(b1) <= time(b1): more budget never raises the bound past a plan
    assert p2.predicted.time_s <= p1.predicted.time_s or b1 < 8 or b2 < 8
    if p2.options["mode"] == "slotted":
        assert p2.options["lower_bound_s"] <= p1.predicted.time_s


def _hetero(L: int, seed: int):
    import random

    r = random.Random(seed)
    return chain([r.randint(10, 90) for _ in range(L + 1)], [r.randint(1, 9) for _ in range(L)],
                 [r.randint(1, 9) for _ in range(L)], [r.randint(0, 90) for _ in range(L)],
                 [r.randint(0, 30) for _ in range(L)], [r.randint(0, 30) for _ in range(L)])


@pytest.mark.parametrize("seed", [1, 2])
def test_slotted_when_asked_certifies_against_exact(seed, monkeypatch):
    from memplan.planner import optimal

    # refinement stops at a wall-clock cap too; without it the gap alone decides (a loaded
    # machine reached the cap at 500 slots, 1.4% from the optimum)
    monkeypatch.setattr(optimal, "TIME_CAP_S", math.inf)
    L = 34
    prof = _hetero(L, seed)
    least = least_peak(costs_of(prof))
    budget = least + (planner.plan(prof, mode="exact").predicted.peak_bytes - least) // 5
    plan = planner.plan(prof, budget_bytes=budget, mode="slotted")
    assert plan.options["mode"] == "slotted" and plan.options["slots"] >= 500
    _check(prof, plan, budget)
    exact = _exact_best(prof, budget)
    assert plan.options["lower_bound_s"] <= exact <= plan.predicted.time_s
    # the default tolerance is 1%
    assert plan.options["optimality_gap"] <= 0.01
    # auto solves exactly at this length (NOTE [ when slotted mode runs ])
    auto = planner.plan(prof, budget_bytes=budget)
    assert auto.options["mode"] == "exact" and auto.predicted.time_s == pytest.approx(exact, rel=1e-12)


def test_mode_options_are_validated():
    prof = worked_example()
    with pytest.raises(PlanError, match="mode: expected one of"):
        planner.plan(prof, budget_bytes=30, mode="fast")
    with pytest.raises(PlanError, match="slots: expected an integer"):
        planner.plan(prof, budget_bytes=30, mode="slotted", slots=2)
    with pytest.raises(PlanError, match="max_gap: expected a finite fraction"):
        planner.plan(prof, budget_bytes=30, max_gap=float("nan"))
    with pytest.raises(PlanError, match="mode: 'slotted' needs budget_bytes"):
        planner.plan(prof, mode="slotted")
