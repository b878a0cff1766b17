"""Save policies (docs/chain-model.md section 10.8): the replay, the optimal DP against an
exhaustive search over every persistent schedule and every choice of policies, and plans."""

from __future__ import annotations

import itertools
import random

import pytest
from memplan.planner import plan, simulate
from memplan.planner._build import insert_drops
from memplan.planner._optimal_dp import (
    PolicyRuns,
    costs_of,
    least_peak,
    policy_runs,
    schedule_and_policies,
    solve,
)
from memplan.planner._optimal_kernel import solve_compiled
from memplan.planner.frontier import frontier
from memplan.planner.schema import PlanError
from memplan.planner.simulate import replay
from memplan.profiler.schema import Profile, ProfileError, load_profile

from tests.planner.oracle import exhaustive_frontier


def random_policy_chain(rng: random.Random, L: int, max_policies: int = 3) -> Profile:
    """Small integer sizes and times; each stage gets 0..max_policies-1 extra policies, each
    keeping at most its base record, with its own transients and a slower backward (or not).

    A policy's recorded-forward transient stays at most the stage's no-grad one: above it, a
    schedule that records the last stage, drops a_L and makes it again by `F L` for the loss can
    win, and the recurrence does not search those (docs/chain-model.md section 9), policies or
    not."""
    layers = []
    for i in range(L):
        s, f, b, tf = rng.randint(0, 6), rng.randint(1, 5), rng.randint(1, 8), rng.randint(0, 4)
        pols = [dict(name=f"p{k}", recompute=[f"aten.op{k}"], saved_bytes=rng.randint(0, s),
                     forward_temp_bytes=rng.randint(0, tf), backward_temp_bytes=rng.randint(0, 8),
                     forward_s=f + rng.randint(0, 1), backward_s=b + rng.randint(0, 5))
                for k in range(rng.randint(0, max_policies - 1))]
        layers.append(dict(name=f"s{i + 1}", forward_s=f, backward_s=b,
                           output_bytes=rng.randint(1, 5), saved_bytes=s, forward_temp_bytes=tf,
                           backward_temp_bytes=rng.randint(0, 4), policies=pols))
    return Profile(input_bytes=rng.randint(1, 4), layers=layers)


def _envelope(points) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    for p, t in sorted(points):
        if not out or t < out[-1][1]:
            if out and out[-1][0] == p:
                out[-1] = (p, t)
            else:
                out.append((p, t))
    return out


def oracle_frontier(prof: Profile) -> list[tuple[int, float]]:
    """The Pareto set over every policy assignment of the exhaustive persistent frontier."""
    points = []
    for combo in itertools.product(*(la.policy_names for la in prof.layers)):
        sub = prof.with_policies({i + 1: n for i, n in enumerate(combo)})
        points += [(p, t) for p, t, _ in exhaustive_frontier(sub, persistent=True)]
    return _envelope(points)


def _frontiers(prof: Profile, solver):
    c = costs_of(prof)
    runs, left = policy_runs(c)
    assert not left
    solved = [(solver(cc), fixed) for cc, fixed in runs]
    return PolicyRuns(c, solved) if len(solved) > 1 else solved[0][0]


@pytest.mark.parametrize("solver", [solve, solve_compiled], ids=["reference", "compiled"])
def test_dp_equals_exhaustive_search_over_schedules_and_policies(solver):
    rng = random.Random(22)
    several_runs = 0
    for _ in range(120):
        prof = random_policy_chain(rng, rng.randint(1, 4))
        fr = _frontiers(prof, solver)
        several_runs += isinstance(fr, PolicyRuns)
        top = list(zip(*fr.top(), strict=True))
        assert top == oracle_frontier(prof), prof.model_dump_json()
        for peak, time in top:  # each point's schedule replays to the point, under its policies
            ops, chosen = schedule_and_policies(fr, peak)
            names = {i: prof.layers[i - 1].policy_names[p] for i, p in chosen.items()}
            sim = replay(prof, insert_drops(ops, prof.n_stages), None, names)
            assert sim.valid and sim.peak_bytes <= peak and sim.time_s == pytest.approx(time)
    assert several_runs > 0  # some chains needed a policy fixed for a late split


def test_compiled_least_peak_and_windowed_point_equal_the_reference():
    from memplan.planner.optimal import least_peak as least_compiled

    rng = random.Random(7)
    for _ in range(40):
        prof = random_policy_chain(rng, rng.randint(2, 7), max_policies=4)
        c = costs_of(prof)
        runs, _ = policy_runs(c)
        assert least_compiled(c) == min(least_peak(cc) for cc, _ in runs)
        peaks, times = _frontiers(prof, solve).top()
        for cap in {peaks[0], peaks[len(peaks) // 2], peaks[-1]}:
            wp, wt = solve_compiled(c, cap=cap, windowed=True).top() if len(runs) == 1 else (
                PolicyRuns(c, [(solve_compiled(cc, cap=cap, windowed=True), f)
                               for cc, f in runs]).top())
            k = max(i for i, p in enumerate(peaks) if p <= cap)
            assert (wp[-1], wt[-1]) == (peaks[k], pytest.approx(times[k]))


def test_without_policies_costs_and_plans_are_unchanged():
    rng = random.Random(3)
    prof = random_policy_chain(rng, 6, max_policies=1)
    assert not prof.has_policies and costs_of(prof).K == 1
    p = plan(prof, strategy="optimal", budget_bytes=10**6)
    assert p.stage_policies == {}


def _gpt_like(n: int = 6) -> Profile:
    """A chain whose blocks offer a cheaper record at a higher backward time, like a transformer
    block's op-level policies."""
    layers = [dict(name="embed", forward_s=0.1, backward_s=0.2, output_bytes=1000, saved_bytes=100)]
    for i in range(n):
        layers.append(dict(
            name=f"block.{i}", forward_s=1.0, backward_s=2.0, output_bytes=1000, saved_bytes=8000,
            forward_nograd_s=0.9,
            policies=[dict(name="matmuls", recompute=["aten.gelu"], saved_bytes=3000,
                           backward_temp_bytes=1000, forward_s=1.0, backward_s=2.3),
                      dict(name="none", recompute=["*"], saved_bytes=0,
                           backward_temp_bytes=8000, forward_s=0.95, backward_s=3.0)]))
    layers.append(dict(name="head", forward_s=0.1, backward_s=0.2, output_bytes=4, saved_bytes=500))
    return Profile(input_bytes=100, layers=layers)


def test_plans_choose_policies_and_their_prediction_is_the_replay():
    prof = _gpt_like()
    full = plan(prof, strategy="optimal")
    for frac in (0.3, 0.5, 0.7):
        budget = int(frac * full.predicted.peak_bytes)
        p = plan(prof, strategy="optimal", budget_bytes=budget)
        assert p.feasible and p.predicted.peak_bytes <= budget
        sim = simulate(prof, p.schedule, policies=p.stage_policies)
        assert (sim.peak_bytes, sim.time_s) == (p.predicted.peak_bytes, p.predicted.time_s)
        # never slower than the same budget without policies
        base = plan(prof.with_policies(None), strategy="optimal", budget_bytes=budget)
        if base.feasible:
            assert p.predicted.time_s <= base.predicted.time_s * (1 + 1e-12)
    p = plan(prof, strategy="optimal", budget_bytes=int(0.5 * full.predicted.peak_bytes))
    assert set(p.stage_policies.values()) <= {"matmuls", "none"} and p.stage_policies
    again = load_profile(prof.model_dump_json())  # JSON round trip keeps the policies
    assert plan(again, strategy="optimal", budget_bytes=p.budget_bytes).stage_policies == p.stage_policies


def test_grouped_mode_plans_policies_and_replays():
    prof = _gpt_like(12)
    budget = int(0.4 * plan(prof, strategy="optimal").predicted.peak_bytes)
    exact = plan(prof, strategy="optimal", budget_bytes=budget, mode="exact")
    grouped = plan(prof, strategy="optimal", budget_bytes=budget,
                   mode="grouped", groups=4)
    assert grouped.options["mode"] == "grouped" and grouped.feasible
    sim = simulate(prof, grouped.schedule, policies=grouped.stage_policies)
    assert (sim.peak_bytes, sim.time_s) == (grouped.predicted.peak_bytes, grouped.predicted.time_s)
    assert grouped.predicted.time_s >= exact.predicted.time_s * (1 - 1e-12)
    assert 0 <= grouped.options["optimality_gap"]


def test_infeasible_names_the_least_peak_over_policies():
    prof = _gpt_like(3)
    least = frontier(prof).least_peak_bytes
    assert least < frontier(prof.with_policies(None)).least_peak_bytes
    p = plan(prof, strategy="optimal", budget_bytes=least - 1)
    assert not p.feasible and str(least) in p.message
    assert plan(prof, strategy="optimal", budget_bytes=least).feasible


@pytest.mark.parametrize("options, field", [
    ({"mode": "memo"}, "mode"), ({"mode": "banded"}, "mode"), ({"mode": "slotted"}, "mode"),
    ({"checkpoint_dtype": "bf16", "tolerance": 1.0}, "checkpoint_dtype"),
])
def test_modes_that_do_not_plan_policies_refuse_them(options, field):
    with pytest.raises(PlanError) as err:
        plan(_gpt_like(3), strategy="optimal", budget_bytes=10**5, **options)
    assert err.value.field == field


def test_replay_refuses_unknown_policies_by_field():
    prof = _gpt_like(2)
    ops = plan(prof, strategy="optimal").schedule
    with pytest.raises(PlanError) as err:
        simulate(prof, ops, policies={2: "nope"})
    assert err.value.field == "stage_policies.2" and "matmuls" in str(err.value)
    with pytest.raises(PlanError) as err:
        simulate(prof, ops, policies={9: "none"})
    assert err.value.field == "stage_policies.9"


def test_policy_schema_is_validated():
    base = dict(name="s", forward_s=1, backward_s=1, output_bytes=1, saved_bytes=1)
    for bad, needle in [
        (dict(name="all", saved_bytes=0, forward_s=1, backward_s=1), "'all' names"),
        (dict(name="x", recompute=["*", "aten.gelu"], saved_bytes=0, forward_s=1, backward_s=1),
         "list it alone"),
        (dict(name="x", recompute=["not an op"], saved_bytes=0, forward_s=1, backward_s=1),
         "not an operator"),
        (dict(name="x", saved_bytes=-1, forward_s=1, backward_s=1), "policies.0.saved_bytes"),
        (dict(name="x", recompute=["mincut:1.5"], saved_bytes=0, forward_s=1, backward_s=1),
         "budget B between 0 and 1"),
        (dict(name="x", recompute=["mincut:half"], saved_bytes=0, forward_s=1, backward_s=1),
         "budget B between 0 and 1"),
        (dict(name="x", recompute=["mincut:0.5", "aten.gelu"], saved_bytes=0, forward_s=1,
              backward_s=1), "list it alone"),
    ]:
        with pytest.raises(ProfileError, match=needle):
            load_profile({"input_bytes": 1, "layers": [{**base, "policies": [bad]}]})
    # a min-cut policy (compiled stages) is data like any other: planned and replayed
    cut = dict(name="mincut50", recompute=["mincut:0.5"], saved_bytes=0, forward_s=1, backward_s=2)
    prof = load_profile({"input_bytes": 1, "layers": [{**base, "policies": [cut]}, {**base, "name": "t"}]})
    assert prof.layers[0].policies[0].recompute == ["mincut:0.5"]
    two = [dict(name="x", saved_bytes=0, forward_s=1, backward_s=1)] * 2
    with pytest.raises(ProfileError, match="repeats the name"):
        load_profile({"input_bytes": 1, "layers": [{**base, "policies": two}]})


def test_frontier_names_the_policies_and_shows_what_they_buy(tmp_path):
    from memplan.planner.frontier import plot_frontier

    prof = _gpt_like(4)
    fr = frontier(prof)
    whole = fr.whole_stage_points
    assert whole is not None and fr.least_peak_bytes < whole[0].peak_bytes
    assert any(p.policies for p in fr.points) and not any(p.policies for p in whole)
    for p in fr.points:  # each point's policy counts are those of the plan at its peak
        plan_p = plan(prof, strategy="optimal", budget_bytes=p.peak_bytes)
        counts: dict[str, int] = {}
        for name in plan_p.stage_policies.values():
            counts[name] = counts.get(name, 0) + 1
        assert plan_p.predicted.time_s == pytest.approx(p.time_s) and counts == p.policies
    for w in whole:  # policies never make a budget slower
        k = max(i for i, p in enumerate(fr.points) if p.peak_bytes <= w.peak_bytes)
        assert fr.points[k].time_s <= w.time_s * (1 + 1e-9)
    assert plot_frontier(fr, tmp_path / "f.png").stat().st_size > 0
    assert frontier(prof.with_policies(None)).whole_stage_points is None


def test_a_stages_backward_floor_under_its_least_policy_bounds_the_least_peak():
    # NOTE [ the least peak's stage ] in planner/optimal.py, with save policies
    from memplan.planner.optimal import backward_floors
    from memplan.planner.optimal import least_peak as least_compiled

    rng = random.Random(11)
    for _ in range(60):
        c = costs_of(random_policy_chain(rng, rng.randint(1, 7), max_policies=4))
        assert max(backward_floors(c)) <= least_compiled(c)
