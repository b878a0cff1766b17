"""The optimal DP with offload (docs/chain-model.md section 10.9, planner/_optimal_offload.py).

Facts held: with no bandwidth (or a zero host budget) the frontiers equal the plain DP's; with a
bandwidth they equal an exhaustive search over the same schedules ("eager offload, lazy fetch",
tests/planner/oracle.py), with and without a host budget; every plan replays to the DP's point;
offload is never slower than recompute-only at the same budget and strictly faster where the
transfers hide; bad options name their field.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memplan.planner import plan
from memplan.planner._build import insert_drops
from memplan.planner._optimal_dp import costs_of, late_useful, solve
from memplan.planner._optimal_offload import OFFLOAD_MAX_STAGES, offload_ops, solve_offload
from memplan.planner.schema import PlanError
from memplan.planner.simulate import replay
from memplan.profiler.analytic import gpt_analytic_profile

from tests.planner.chains import chain, random_chains, worked_example
from tests.planner.oracle import exhaustive_frontier


def _pairs(points) -> list[tuple[int, float]]:
    return [(p[0], p[2]) for p in points]


def _least_within(front, budget: int, host: int | None = None) -> float:
    """Least time over (peak, time[, host]) points within the budgets (inf: none)."""
    return min((t for p, t, *h in front if p <= budget and (host is None or h[0] <= host)),
               default=math.inf)


@settings(max_examples=60, deadline=None)
@given(random_chains(1, 7))
def test_no_bandwidth_is_the_plain_dp(prof):
    c = costs_of(prof)
    peaks, times = solve(c).top()
    assert _pairs(solve_offload(c, bandwidth=None).top()) == list(zip(peaks, times, strict=True))
    assert _pairs(solve_offload(c, bandwidth=0.0).top()) == list(zip(peaks, times, strict=True))


@settings(max_examples=40, deadline=None)
@given(random_chains(1, 6), st.sampled_from([0.5, 1.0, 3.0]))
def test_zero_host_budget_is_the_plain_dp(prof, bw):
    c = costs_of(prof)
    peaks, times = solve(c).top()
    assert _pairs(solve_offload(c, bandwidth=bw, host_cap=0).top()) == list(
        zip(peaks, times, strict=True))


def _oracle_points(prof, bw, host=None):
    return [(pk, tm) for pk, tm, _ in exhaustive_frontier(
        prof, persistent=True, offload_bandwidth=bw, host_memory_bytes=host)]


def _no_late(prof) -> bool:
    """Chains where a late split cannot help (NOTE [ late left parts ]): a late split does not
    offload (section 10.9), so there the DP's schedules and the oracle's class coincide."""
    return not any(late_useful(costs_of(prof)))


@settings(max_examples=40, deadline=None)
@given(random_chains(1, 4), st.sampled_from([0.5, 1.0, 2.0, 8.0]))
def test_equals_exhaustive_search(prof, bw):
    if not _no_late(prof):
        return
    c = costs_of(prof)
    dp = _pairs(solve_offload(c, bandwidth=bw).top())
    oracle = _oracle_points(prof, bw)
    budgets = sorted({p for p, _ in oracle} | {p for p, _ in dp})
    for m in budgets:
        assert _least_within([(p, t) for p, t in dp], m) == pytest.approx(
            _least_within(oracle, m), rel=1e-12), m


@settings(max_examples=25, deadline=None)
@given(random_chains(2, 4), st.sampled_from([1.0, 4.0]), st.integers(0, 12))
def test_equals_exhaustive_search_with_a_host_budget(prof, bw, host):
    if not _no_late(prof):
        return
    c = costs_of(prof)
    dp = [(p[0], p[2]) for p in solve_offload(c, bandwidth=bw, host_cap=host).top()]
    oracle = _oracle_points(prof, bw, host)
    for m in sorted({p for p, _ in oracle} | {p for p, _ in dp}):
        assert _least_within(dp, m) == pytest.approx(_least_within(oracle, m), rel=1e-12), m


@settings(max_examples=40, deadline=None)
@given(random_chains(1, 6), st.sampled_from([0.5, 2.0, 16.0]))
def test_every_point_replays_to_itself(prof, bw):
    c = costs_of(prof)
    fr = solve_offload(c, bandwidth=bw)
    for pt in fr.top():
        ops = insert_drops(offload_ops(fr, pt), prof.n_stages)
        sim = replay(prof, ops, offload_bandwidth=bw)
        assert sim.valid, sim.error
        assert sim.peak_bytes == pt[0]
        assert sim.host_peak_bytes == pt[1]
        assert sim.time_s == pytest.approx(pt[2], rel=1e-12)


def test_worked_example_at_two_bytes_per_second():
    prof = worked_example()
    p = plan(prof, budget_bytes=20, offload_bandwidth=2.0)
    assert p.feasible and p.predicted.time_s == 36 and p.predicted.peak_bytes == 20
    assert p.predicted.host_peak_bytes == 11 and p.predicted.transfer_wait_s == 0
    assert plan(prof, budget_bytes=20).predicted.time_s == 47
    assert plan(prof, budget_bytes=20, offload_bandwidth=1.0).predicted.time_s == 39
    # a host budget: the fastest within 6 host bytes is 43 s
    p6 = plan(prof, budget_bytes=20, offload_bandwidth=2.0, host_memory_bytes=6)
    assert p6.predicted.time_s == 43 and p6.predicted.host_peak_bytes <= 6
    assert p6.options["host_memory_bytes"] == 6 and p6.options["offload_bandwidth"] == 2.0


def test_zero_bandwidth_plans_equal_todays():
    prof = worked_example()
    for budget in (18, 20, 27, 31):
        a, b = plan(prof, budget_bytes=budget), plan(prof, budget_bytes=budget, offload_bandwidth=0)
        assert a.schedule == b.schedule and a.predicted == b.predicted


def test_infeasible_names_the_least_budget():
    p = plan(worked_example(), budget_bytes=17, offload_bandwidth=2.0)
    assert not p.feasible and "18 bytes" in p.message


def test_max_overhead_with_offload():
    prof = worked_example()
    p = plan(prof, max_overhead=0.0, offload_bandwidth=2.0)
    assert p.predicted.time_s == 36 and p.predicted.peak_bytes == 20  # store-all time, 11 less


def _gpt2(layers: int = 6):
    return gpt_analytic_profile(dict(n_layer=layers, n_head=12, n_embd=768, batch_size=8,
                                     block_size=1024), device="cuda", flops_per_s=400e12,
                                precision="bf16-mixed")


def test_never_slower_than_recompute_only_and_faster_where_transfers_hide():
    # GPT-2 small's blocks at 400 TFLOP/s: a forward of 0.35 ms, a 25 MB block input and a 216
    # MB record; so an input hides behind a forward from about 72 GB/s and a record only from
    # about 610 GB/s (the window is one op: section 10.9)
    prof = _gpt2()
    c = costs_of(prof)
    peaks, _ = solve(c).top()
    for bw, hides in ((25e9, False), (100e9, True), (1e12, True)):
        faster = 0
        # every point of either frontier
        for budget in sorted(set(peaks) | {p[0] for p in solve_offload(c, bandwidth=bw).top()}):
            base = plan(prof, budget_bytes=budget)
            p = plan(prof, budget_bytes=budget, offload_bandwidth=bw)
            assert p.feasible and p.predicted.peak_bytes <= budget
            assert p.predicted.time_s <= base.predicted.time_s * (1 + 1e-12)
            faster += p.predicted.time_s < base.predicted.time_s * (1 - 1e-6)
        assert (faster > 0) == hides, bw


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(offload_bandwidth=-1.0), "offload_bandwidth"),
    (dict(offload_bandwidth=float("nan")), "offload_bandwidth"),
    (dict(offload_bandwidth=True), "offload_bandwidth"),
    (dict(host_memory_bytes=10), "host_memory_bytes"),
    (dict(offload_bandwidth=1.0, host_memory_bytes=-1), "host_memory_bytes"),
    (dict(offload_bandwidth=1.0, mode="banded"), "mode"),
    (dict(offload_bandwidth=1.0, checkpoint_dtype="bf16"), "checkpoint_dtype"),
])
def test_bad_options_name_their_field(kwargs, field):
    with pytest.raises(PlanError) as err:
        plan(worked_example(), budget_bytes=20, **kwargs)
    assert err.value.field in (field, f"options.{field}")


def test_other_strategies_refuse_offload():
    with pytest.raises(PlanError) as err:
        plan(worked_example(), budget_bytes=20, strategy="uniform", offload_bandwidth=1.0)
    assert "offload_bandwidth" in str(err.value)


def test_long_chains_are_refused_with_the_limit():
    L = OFFLOAD_MAX_STAGES + 1
    prof = chain([1] * (L + 1), [1] * L, [2] * L, [1] * L)
    with pytest.raises(PlanError) as err:
        plan(prof, budget_bytes=100, offload_bandwidth=1.0)
    assert err.value.field == "offload_bandwidth" and str(OFFLOAD_MAX_STAGES) in str(err.value)


def test_frontier_with_offload_beside_the_one_without():
    from memplan.planner.frontier import frontier

    prof = worked_example()
    f = frontier(prof, offload_bandwidth=2.0)
    assert [(p.peak_bytes, p.time_s, p.host_peak_bytes) for p in f.points] == [
        (18, 48.0, 6), (19, 45.0, 10), (20, 36.0, 11)]
    assert [(p.peak_bytes, p.time_s) for p in f.recompute_only_points] == [
        (p.peak_bytes, p.time_s) for p in frontier(prof).points]
    for p in f.points:  # each point is the plan at its own peak
        q = plan(prof, budget_bytes=p.peak_bytes, offload_bandwidth=2.0)
        assert (q.predicted.peak_bytes, q.predicted.time_s) == (p.peak_bytes, p.time_s)
    f6 = frontier(prof, offload_bandwidth=2.0, host_memory_bytes=6)
    assert all(p.host_peak_bytes <= 6 for p in f6.points)
    assert [(p.peak_bytes, p.time_s) for p in f6.points][:3] == [(18, 48.0), (20, 43.0), (21, 40.0)]
    assert f6.host_memory_bytes == 6 and f6.offload_bandwidth == 2.0


def test_frontier_request_and_cli_take_offload(tmp_path):
    from memplan.planner.request import frontier_request
    from typer.testing import CliRunner

    from memplan.cli import app

    req = frontier_request(profile=worked_example(), options={"offload_bandwidth": 2.0,
                                                              "host_memory_bytes": 6})
    assert req.options.offload_bandwidth == 2.0 and req.options.host_memory_bytes == 6
    path = tmp_path / "p.json"
    path.write_text(worked_example().model_dump_json())
    out = CliRunner().invoke(app, ["frontier", str(path), "--offload-bandwidth", "2",
                                   "--host-memory", "6", "--json"])
    assert out.exit_code == 0, out.output
    assert '"host_memory_bytes": 6' in out.output
    bad = CliRunner().invoke(app, ["frontier", str(path), "--host-memory", "6"])
    assert bad.exit_code != 0 and "--host-memory" in bad.output


@settings(max_examples=30, deadline=None)
@given(random_chains(2, 5), st.sampled_from([1.0, 4.0]), st.integers(0, 40))
def test_a_host_budget_plan_is_the_three_dimensional_optimum(prof, bw, host):
    # the planner solves without the host budget first and keeps that point when it fits
    c = costs_of(prof)
    top3 = solve_offload(c, bandwidth=bw, host_cap=host).top()
    for budget in sorted({p[0] for p in top3}):
        p = plan(prof, budget_bytes=budget, offload_bandwidth=bw, host_memory_bytes=host)
        want = min(q[2] for q in top3 if q[0] <= budget)
        assert p.feasible and p.predicted.host_peak_bytes <= host
        assert p.predicted.time_s == pytest.approx(want, rel=1e-12)


def test_progress_hook_sees_every_length():
    from memplan.planner._optimal_offload import PROGRESS

    seen = []
    token = PROGRESS.set(lambda done, total: seen.append((done, total)))
    try:
        solve_offload(costs_of(worked_example()), bandwidth=2.0)
    finally:
        PROGRESS.reset(token)
    assert [d for d, _ in seen] == [1, 4, 10, 20] and {t for _, t in seen} == {20}
