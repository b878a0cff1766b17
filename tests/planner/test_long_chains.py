"""Long chains (planner/_optimal_long.py): memoisation by content equals the exact DP, the banded
DP's bound is a certificate (lower bound <= exact optimum <= plan time), every plan replays to its
claimed time, and "auto" picks memo or banded above exact_max_stages."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.planner import _optimal_long
from memplan.planner._optimal_dp import costs_of
from memplan.planner._optimal_kernel import least_peak_compiled, solve_compiled
from memplan.planner._optimal_long import content_classes, memo_worthwhile, solve_long
from memplan.planner.optimal import lower_bound_banded, plan_optimal
from memplan.planner.schema import PlanError
from memplan.planner.simulate import simulate

from tests.planner.chains import chain, random_chains

_SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _blocks(n_blocks: int, seed: int, *, kinds: int = 1) -> object:
    """An embedding, n_blocks blocks drawn from `kinds` block types (1: identical blocks), a head;
    integer sizes and times so that comparisons are exact."""
    r = random.Random(seed)
    types = [(r.randint(1, 4), r.randint(1, 5), r.randint(1, 9), r.randint(0, 8), r.randint(0, 3),
              r.randint(0, 3)) for _ in range(kinds)]
    seq = [types[r.randrange(kinds)] if kinds > 1 else types[0] for _ in range(n_blocks)]
    # (x, f, b, s, tf, tb) per stage: embed, blocks, head
    stages = [(r.randint(1, 4), 1, 2, 1, 0, 0)] + seq + [(1, 3, 6, r.randint(4, 12), 2, 2)]
    x = [r.randint(1, 3)] + [s[0] for s in stages]
    return chain(x, [s[1] for s in stages], [s[2] for s in stages], [s[3] for s in stages],
                 [s[4] for s in stages], [s[5] for s in stages], name=f"blocks{n_blocks}")


def _random_chain(seed: int, L: int, *, transients: bool = True) -> object:
    """A chain of `L` stages with seeded random integer sizes and times, and forward and backward
    transients unless `transients` is False (then 0)."""
    r = random.Random(seed)
    x, f, b, s = ([r.randint(1, 6) for _ in range(L + 1)], [r.randint(1, 6) for _ in range(L)],
                  [r.randint(1, 6) for _ in range(L)], [r.randint(0, 6) for _ in range(L)])
    if not transients:
        return chain(x, f, b, s)
    return chain(x, f, b, s, [r.randint(0, 3) for _ in range(L)], [r.randint(0, 3) for _ in range(L)])


def _exact_point(c, cap):
    peaks, times = solve_compiled(c, cap=cap, windowed=True).top()
    return (peaks[-1], times[-1]) if peaks else None


def _budgets(c, n: int = 4):
    least = least_peak_compiled(c)
    top = solve_compiled(c).top()[0][-1]
    return sorted({least - 1, *(least + (top - least) * k // n for k in range(n + 1))})


def _replays(prof, plan):
    sim = simulate(prof, plan.schedule)
    assert sim.valid, sim.error
    assert (sim.time_s, sim.peak_bytes) == (plan.predicted.time_s, plan.predicted.peak_bytes)
    assert plan.predicted.peak_bytes <= plan.budget_bytes
    return sim


@pytest.mark.parametrize(("n_blocks", "seed", "kinds"), [(30, 0, 1), (45, 1, 1), (40, 2, 2)])
def test_memoised_by_content_equals_the_exact_dp(n_blocks, seed, kinds):
    prof = _blocks(n_blocks, seed, kinds=kinds)
    c = costs_of(prof)
    if kinds == 1:
        assert memo_worthwhile(content_classes(c))
    for cap in _budgets(c):
        memo = solve_long(c, cap=cap, memo=True).top()
        want = _exact_point(c, cap)
        assert ((memo[0][-1], memo[1][-1]) if memo[0] else None) == want
        if want is not None:
            plan = plan_optimal(prof, cap, mode="memo")
            assert plan.options["mode"] == "memo" and plan.options["optimality_gap"] == 0
            sim = _replays(prof, plan)
            assert sim.time_s == want[1]
    # the whole frontier (no budget, no windows) point for point
    full = solve_long(c, cap=None, memo=True).top()
    assert full == solve_compiled(c).top()


@pytest.mark.parametrize(("n_blocks", "seed", "workers", "width", "parallel_work"),
                         [(150, 7, 2, 256, 0), (120, 8, 3, 2, 0), (150, 7, 2, 256, None)])
def test_memo_in_parts_equals_the_exact_dp_on_long_chains(n_blocks, seed, workers, width,
                                                          parallel_work):
    # 3 sub-problems a length: each one is built in as many memory ranges as workers, its splits
    # tried first in the order the sub-problem one stage shorter chose them, and the ranges merged
    # (NOTE [ split order and parts ]); width 2 re-stages nearly every row (`_restage`);
    # parallel_work 0 runs every length on the workers, None (the default) runs these short
    # lengths in the calling thread, in one part (NOTE [ a launch's cost ])
    prof = _blocks(n_blocks, seed)
    c = costs_of(prof)
    opts = {} if parallel_work is None else {"_parallel_work": parallel_work}
    for cap in _budgets(c, 3)[1:]:
        memo = solve_long(c, cap=cap, memo=True, _workers=workers, _width=width, **opts).top()
        assert (memo[0][-1], memo[1][-1]) == _exact_point(c, cap)
    full = solve_long(c, cap=None, memo=True, _workers=workers, _width=width, **opts).top()
    assert full == solve_compiled(c).top()


def test_content_classes_of_identical_blocks():
    prof = _blocks(20, 3)
    rep = content_classes(costs_of(prof))
    L = prof.n_stages
    c = costs_of(prof)
    # stages 2..L-1 are identical blocks: every P(s, s+d) whose input is a block's output (s >= 3;
    # s = 2 too when the embedding's output has a block's size) and that ends before the head is
    # one class
    first = 2 if c.x[1] == c.x[2] else 3
    for d in range(0, L - 4):
        assert [int(rep[0, s, s + d]) for s in range(first, L - d)] == [first] * (L - d - first)
        assert rep[0, L - d, L] == L - d  # the one that ends at the head is its own
    assert all(rep[0, 1, t] == 1 for t in range(1, L + 1))  # the embedding's are their own


@_SLOW
@given(random_chains(min_stages=3, max_stages=14), st.integers(1, 6), st.floats(0.0, 1.0))
def test_banded_bound_certifies_the_exact_optimum(prof, width, frac):
    c = costs_of(prof)
    least = least_peak_compiled(c)
    top = solve_compiled(c).top()[0][-1]
    cap = int(least + frac * (top - least))
    exact = _exact_point(c, cap)
    lower = lower_bound_banded(c, cap, width)
    upper = solve_long(c, cap=cap, width=width).top()
    assert exact is not None
    assert lower <= exact[1] * (1 + 1e-12)
    if upper[0]:
        assert upper[1][-1] >= exact[1] * (1 - 1e-12) and upper[0][-1] <= cap
    if width >= prof.n_stages:
        assert upper[1][-1] == exact[1] and lower == exact[1]


@_SLOW
@given(random_chains(min_stages=3, max_stages=14), st.integers(1, 6))
def test_folded_lower_run_is_a_lower_bound_below_the_unfolded_one(prof, width):
    # NOTE [ folded lower run ]: each suffix's long optimistic splits folded into one staircase;
    # a further relaxation, so at every budget: folded <= unfolded <= the exact optimum
    c = costs_of(prof)
    exact = solve_compiled(c).top()
    runs = [solve_long(c, cap=None, width=width, optimistic=True, windowed=False, fold=fold).top()
            for fold in (True, False)]

    def within(run, peak):
        k = max((i for i, p in enumerate(run[0]) if p <= peak), default=None)
        return float("inf") if k is None else run[1][k]

    for peak, time_s in zip(*exact, strict=True):
        folded, unfolded = within(runs[0], peak), within(runs[1], peak)
        assert folded <= unfolded * (1 + 1e-12) and unfolded <= time_s * (1 + 1e-12)
    if width >= prof.n_stages:  # no long left parts: both exact
        assert runs[0] == runs[1] == exact


def test_folded_lower_run_on_a_long_chain():
    # 60 stages, band 4: most suffix splits are long; the folded bound stays under the exact
    # frontier at every point and is the unfolded one at the store-all end
    prof = _random_chain(21, 60)
    c = costs_of(prof)
    exact = solve_compiled(c).top()
    folded = solve_long(c, cap=None, width=4, optimistic=True, windowed=False, fold=True).top()
    unfolded = solve_long(c, cap=None, width=4, optimistic=True, windowed=False).top()
    assert folded[0][0] <= unfolded[0][0] <= exact[0][0]
    for peak, time_s in zip(*exact, strict=True):
        k = max(i for i, p in enumerate(folded[0]) if p <= peak)
        assert folded[1][k] <= time_s * (1 + 1e-12)
    assert folded[1][-1] == pytest.approx(unfolded[1][-1], rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_banded_plans_on_medium_chains(seed):
    L = 60
    prof = _random_chain(seed, L)
    c = costs_of(prof)
    store_all = solve_compiled(c).top()[0][-1]
    for frac in (0.1, 0.2, 0.4):
        cap = max(least_peak_compiled(c), int(frac * store_all))
        exact = _exact_point(c, cap)
        for max_gap in (0.0, 0.01, 10.0):
            plan = plan_optimal(prof, cap, mode="banded", max_gap=max_gap)
            assert plan.feasible and plan.options["mode"] == "banded"
            _replays(prof, plan)
            lb, gap = plan.options["lower_bound_s"], plan.options["optimality_gap"]
            assert lb <= exact[1] * (1 + 1e-12) <= plan.predicted.time_s * (1 + 2e-12)
            assert gap == pytest.approx((plan.predicted.time_s - lb) / lb, abs=1e-12)
            assert gap <= max_gap or plan.options["band"] >= L
            assert f"within {gap:.3%}" in plan.message and "mode banded" in plan.message
        # max_gap 0 is exact: the band widens until the bound meets the plan
        zero = plan_optimal(prof, cap, mode="banded", max_gap=0.0)
        assert zero.predicted.time_s == pytest.approx(exact[1], rel=1e-12)


def test_auto_picks_memo_or_banded_above_exact_max_stages(monkeypatch):
    from memplan.planner import optimal

    monkeypatch.setattr(optimal, "EXACT_MAX_STAGES", 10)  # "long" from 11 stages on, for speed
    blocks = _blocks(40, 5)
    c = costs_of(blocks)
    cap = _budgets(c)[2]
    calls = []  # the content classes that decide on memo are the ones memo runs on: found once
    monkeypatch.setattr(_optimal_long, "content_classes",
                        lambda costs: calls.append(1) or content_classes(costs))
    plan = plan_optimal(blocks, cap)
    assert len(calls) == 1
    assert plan.options["mode"] == "memo" and plan.options["optimality_gap"] == 0
    assert plan.predicted.time_s == _exact_point(c, cap)[1]
    _replays(blocks, plan)
    rnd = _random_chain(9, 40, transients=False)
    c = costs_of(rnd)
    cap = _budgets(c)[1]
    plan = plan_optimal(rnd, cap)
    assert plan.options["mode"] == "banded" and plan.options["optimality_gap"] <= 0.01
    assert plan.options["lower_bound_s"] <= _exact_point(c, cap)[1] <= plan.predicted.time_s
    _replays(rnd, plan)
    # an explicit exact_max_stages keeps its meaning: grouped above it
    assert plan_optimal(rnd, cap, exact_max_stages=10).options["mode"] == "grouped"


def test_every_plan_carries_its_certificate():
    prof = _blocks(12, 4, kinds=3)
    c = costs_of(prof)
    cap = _budgets(c)[2]
    exact = plan_optimal(prof, cap)
    assert exact.options["mode"] == "exact" and exact.options["optimality_gap"] == 0
    assert exact.options["lower_bound_s"] == exact.predicted.time_s
    assert "mode exact" in exact.message
    grouped = plan_optimal(prof, cap, mode="grouped", groups=4)
    if grouped.feasible:
        lb = grouped.options["lower_bound_s"]
        assert lb <= exact.predicted.time_s <= grouped.predicted.time_s
        assert grouped.options["optimality_gap"] >= 0
    fastest = plan_optimal(prof, None, mode="grouped", groups=4)
    # the store-all time bounds every schedule (summed in another order: equal up to rounding)
    assert fastest.options["optimality_gap"] == pytest.approx(0, abs=1e-12)


def test_banded_infeasible_and_bad_options():
    prof = _blocks(12, 6, kinds=2)
    c = costs_of(prof)
    least = least_peak_compiled(c)
    plan = plan_optimal(prof, least - 1, mode="banded")
    assert not plan.feasible and f"the least budget it fits is {least} bytes" in plan.message
    with pytest.raises(PlanError, match="mode: 'banded' needs budget_bytes"):
        plan_optimal(prof, None, mode="banded")
    with pytest.raises(PlanError, match="mode: expected one of"):
        plan_optimal(prof, least, mode="bands")


@pytest.mark.parametrize("seed", [0, 1])
def test_frontier_points_carry_certified_gaps(seed):
    from memplan.planner.frontier import frontier

    prof = _random_chain(seed, 24)
    exact = frontier(prof)
    assert all(p.optimality_gap == 0 and p.lower_bound_s == p.time_s for p in exact.points)
    peaks = [p.peak_bytes for p in exact.points]
    grouped = frontier(prof, exact_max_stages=1, groups=6)
    assert grouped.mode == "grouped"
    for p in grouped.points:
        # the exact optimum within p's peak: the fastest exact point at or below it
        best = exact.points[max(i for i, q in enumerate(peaks) if q <= p.peak_bytes)].time_s
        assert p.lower_bound_s <= best * (1 + 1e-12) <= p.time_s * (1 + 2e-12)
        assert p.optimality_gap == pytest.approx((p.time_s - p.lower_bound_s) / p.lower_bound_s)


@_SLOW
@given(random_chains(min_stages=2, max_stages=12, nograd=True), st.floats(0.0, 1.0),
       st.sampled_from([0.0, 0.05, 0.5, -0.2]), st.booleans())
def test_a_time_cap_keeps_the_exact_optimum(prof, frac, over, memo):
    # NOTE [ the time cap ]: with any bound U on the optimum's time, every sub-problem drops the
    # points no schedule within U can use, and the point at the budget is still the exact one
    # (no-grad forward times below the forward's: rule 2 charges fn); a bound below the optimum
    # (over < 0) leaves nothing at the budget and the DP runs again without one
    c = costs_of(prof)
    least = least_peak_compiled(c)
    top = solve_compiled(c).top()[0][-1]
    cap = int(least + frac * (top - least))
    want = _exact_point(c, cap)
    fr = solve_long(c, cap=cap, memo=memo, time_cap_s=want[1] * (1 + over))
    assert (fr.top()[0][-1], fr.top()[1][-1]) == want
    assert (fr.time_cap_s is not None) == (over >= 0)  # found under the cap, or solved again


def test_the_one_level_bound_caps_memo_plans():
    from memplan.planner.optimal import one_level_bound
    from memplan.planner.simulate import store_all_time

    prof = _blocks(150, 7)
    c = costs_of(prof)
    capped_any = False
    for cap in _budgets(c, 4)[1:-1]:
        bound = one_level_bound(prof, cap)
        if bound is None:  # below the one-level schedules' least peak
            continue
        want = _exact_point(c, cap)
        assert bound >= want[1]
        plain = solve_long(c, cap=cap, memo=True)
        capped = solve_long(c, cap=cap, memo=True, time_cap_s=bound)
        assert (capped.top()[0][-1], capped.top()[1][-1]) == want and capped.time_cap_s == bound
        assert len(capped.peaks) < 0.8 * len(plain.peaks)  # the cap drops points: that is its use
        capped_any = True
        plan = plan_optimal(prof, cap, mode="memo")  # with the bound as its time cap
        assert plan.predicted.time_s == want[1]
        _replays(prof, plan)
    assert capped_any
    top = solve_compiled(c).top()[0][-1]
    assert one_level_bound(prof, top) == store_all_time(prof)  # store-all fits: its time
    assert one_level_bound(prof, least_peak_compiled(c)) is None  # no one-level schedule fits
