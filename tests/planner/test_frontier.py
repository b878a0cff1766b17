"""The memory-time frontier: exhaustive on small chains, dominating every baseline, its plot and
its command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from memplan.planner.frontier import plot_frontier
from memplan.planner.schema import PlanError
from memplan.profiler.schema import load_profile
from typer.testing import CliRunner

from memplan import planner
from memplan.cli import app
from tests.planner.chains import random_chains, worked_example
from tests.planner.oracle import exhaustive_frontier

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_worked_example_frontier():
    res = planner.frontier(worked_example())
    pairs = [(p.peak_bytes, p.time_s) for p in res.points]
    assert pairs == [(18, 54), (19, 51), (20, 47), (21, 43), (27, 40), (28, 39), (31, 36)]
    exhaustive = sorted((p, t) for p, t, _ in exhaustive_frontier(worked_example()))
    assert pairs == exhaustive  # on this chain the persistent optimum is the optimum
    assert res.least_peak_bytes == 18 and res.store_all_peak_bytes == 31
    assert res.store_all_time_s == 36 and res.mode == "exact" and res.n_pareto == 7
    assert {b.strategy for b in res.baselines} == {"store-all", "sqrt", "uniform", "heuristic"}
    assert all(b.dominated for b in res.baselines)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_chains(max_stages=8))
def test_every_baseline_is_dominated(prof):
    res = planner.frontier(prof)
    peaks = [p.peak_bytes for p in res.points]
    times = [p.time_s for p in res.points]
    assert peaks == sorted(peaks) and times == sorted(times, reverse=True)
    for b in res.baselines:
        assert any(p <= b.peak_bytes and t <= b.time_s for p, t in zip(peaks, times, strict=True)), b
        assert b.dominated
    # each point is what planning for its peak gives
    for p in res.points[:: max(1, len(res.points) // 3)]:
        plan = planner.plan(prof, budget_bytes=p.peak_bytes)
        assert (plan.predicted.peak_bytes, plan.predicted.time_s) == (p.peak_bytes, p.time_s)


def test_points_thin_the_set_and_keep_the_ends():
    prof = load_profile((REPO / "examples" / "gpt24.json").read_text())
    full = planner.frontier(prof)
    thin = planner.frontier(prof, points=5)
    assert full.n_pareto == thin.n_pareto == len(full.points) > 5
    assert thin.points[0] == full.points[0] and thin.points[-1] == full.points[-1]
    assert set(map(repr, thin.points)) <= set(map(repr, full.points))
    assert len(thin.points) < len(full.points)
    assert all(b.dominated for b in thin.baselines)
    for b in thin.baselines:  # the dominating point is kept
        assert any(p.peak_bytes <= b.peak_bytes and p.time_s <= b.time_s for p in thin.points)
    with pytest.raises(PlanError, match="points: expected an integer >= 2"):
        planner.frontier(prof, points=1)


def test_plot_is_a_png(tmp_path):
    out = plot_frontier(planner.frontier(worked_example()), tmp_path / "f.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    path = tmp_path / "worked.json"
    path.write_text(worked_example().model_dump_json())
    return path


def test_frontier_command(profile_path, tmp_path):
    png = tmp_path / "frontier.png"
    res = runner.invoke(app, ["frontier", str(profile_path), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "7 Pareto points" in res.output and "uniform k=2" in res.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    res = runner.invoke(app, ["frontier", str(profile_path), "--json", "--points", "3"])
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data == json.loads(planner.frontier(worked_example(), points=3).model_dump_json())


def test_frontier_command_bad_input(profile_path, tmp_path):
    res = runner.invoke(app, ["frontier", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "no such file" in res.output
    res = runner.invoke(app, ["frontier", str(profile_path), "--points", "1"])
    assert res.exit_code == 2 and "--points" in res.output
    res = runner.invoke(app, ["frontier", str(profile_path), "--plot", str(tmp_path / "f.jpg")])
    assert res.exit_code == 2 and ".png" in res.output


def test_plan_command_max_overhead(profile_path):
    res = runner.invoke(app, ["plan", str(profile_path), "--max-overhead", "0.2", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["strategy"] == "optimal" and data["predicted"]["peak_bytes"] == 21
    res = runner.invoke(app, ["plan", str(profile_path), "--budget", "16"])
    assert res.exit_code == 1 and "18 bytes (raise the budget)" in res.output


def _random_chain(L: int, seed: int):
    import random

    from tests.planner.chains import chain

    r = random.Random(seed)
    return chain([r.randint(1, 6) for _ in range(L + 1)], [r.randint(1, 6) for _ in range(L)],
                 [r.randint(1, 6) for _ in range(L)], [r.randint(0, 6) for _ in range(L)],
                 [r.randint(0, 3) for _ in range(L)], [r.randint(0, 3) for _ in range(L)])


def _exact_within(exact, peak: int) -> float:
    """The exact frontier's least time within `peak` bytes."""
    return min(p.time_s for p in exact.points if p.peak_bytes <= peak)


@pytest.mark.parametrize("seed", [3, 4])
def test_banded_frontier_certifies_each_point(seed):
    # 40 stages, band 16: the upper run's points are schedules (replayed), the lower run's
    # staircase bounds each one: lower_bound_s <= exact optimum within its peak <= its time
    prof = _random_chain(40, seed)
    exact = planner.frontier(prof)
    banded = planner.frontier(prof, mode="banded")
    assert exact.mode == "exact" and banded.mode == "banded"
    # below the banded run's least peak, grouped's points (every one below every banded one)
    modes = [p.mode for p in banded.points]
    assert set(modes) == {"banded", "grouped"}  # band 16 of 40 stages stops above the least peak
    assert modes == sorted(modes, key=lambda m: m == "banded")
    assert banded.least_peak_bytes >= exact.least_peak_bytes
    assert any(p.optimality_gap > 0 for p in banded.points)  # a real band, not the whole chain
    for p in banded.points:
        best = _exact_within(exact, p.peak_bytes)
        assert p.lower_bound_s <= best * (1 + 1e-12) <= p.time_s * (1 + 2e-12)
        assert p.optimality_gap == pytest.approx((p.time_s - p.lower_bound_s) / p.lower_bound_s)
    for b in banded.baselines:  # the banded frontier need not dominate them: it says which
        assert b.dominated == any(p.peak_bytes <= b.peak_bytes and p.time_s <= b.time_s * (1 + 1e-9)
                                  for p in banded.points)


def test_memo_frontier_is_the_exact_frontier():
    from tests.planner.test_long_chains import _blocks

    prof = _blocks(40, 11)
    exact = planner.frontier(prof)
    memo = planner.frontier(prof, mode="memo")
    assert memo.mode == "memo" and memo.n_pareto == exact.n_pareto
    assert [(p.peak_bytes, p.time_s) for p in memo.points] == \
        [(p.peak_bytes, p.time_s) for p in exact.points]
    assert all(p.optimality_gap == 0 and p.mode == "memo" for p in memo.points)


def test_auto_frontier_above_exact_max_stages(monkeypatch):
    import sys

    from tests.planner.test_long_chains import _blocks

    frontier_mod = sys.modules["memplan.planner.frontier"]  # the package exports the function
    monkeypatch.setattr(frontier_mod, "EXACT_MAX_STAGES_UNCAPPED", 10)  # "long" from 11 stages
    assert planner.frontier(_blocks(30, 12), points=6).mode == "memo"  # repeats: exact by content
    rnd = _random_chain(30, 5)
    res = planner.frontier(rnd, points=6)
    assert res.mode == "banded" and {p.mode for p in res.points} <= {"banded", "grouped"}
    assert res.points[-1].mode == "banded"
    for b in res.baselines:  # thinned, the point that dominates a baseline is kept
        assert b.dominated == any(p.peak_bytes <= b.peak_bytes and p.time_s <= b.time_s * (1 + 1e-9)
                                  for p in res.points)
    # an explicit exact_max_stages keeps its meaning: grouped above it, bounded by the banded run
    grouped = planner.frontier(rnd, points=6, exact_max_stages=10, groups=8)
    assert grouped.mode == "grouped" and all(p.mode == "grouped" for p in grouped.points)
    with pytest.raises(PlanError, match="mode: expected one of"):
        planner.frontier(rnd, mode="fast")


def test_long_chain_baselines_are_spread():
    from memplan.planner.frontier import BASELINES_ALL_MAX, UNIFORM_KS, _uniform_ks

    assert _uniform_ks(BASELINES_ALL_MAX) == list(range(1, BASELINES_ALL_MAX + 1))
    ks = _uniform_ks(1000)
    assert ks[:16] == list(range(1, 17)) and ks[-1] == 1000 and len(ks) <= UNIFORM_KS + 1
    assert ks == sorted(set(ks))
