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
