"""The compiled frontier DP (planner/_optimal_kernel.py) against the pure-Python reference
(planner/_optimal_dp.py): the same frontiers, schedules that replay to their points."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.planner._build import insert_drops
from memplan.planner._optimal_dp import costs_of, late_useful, least_peak, schedule_ops, solve
from memplan.planner._optimal_kernel import available, least_peak_compiled, solve_compiled
from memplan.planner.simulate import simulate

from tests.planner.chains import chain, random_chains, worked_example

pytestmark = pytest.mark.skipif(not available(), reason="numba is not installed")


def _same_top(ref, got):
    (rp, rt), (gp, gt) = ref.top(), got.top()
    assert gp == rp
    assert all(abs(a - b) <= 1e-12 * max(abs(a), 1.0) for a, b in zip(rt, gt, strict=True))


def _replays_to_its_points(prof, fr):
    for peak, time in zip(*fr.top(), strict=True):
        sim = simulate(prof, insert_drops(schedule_ops(fr, peak), prof.n_stages))
        assert sim.valid, sim.error
        assert sim.peak_bytes <= peak and sim.time_s == pytest.approx(time, rel=1e-12)


def test_worked_example_frontier():
    prof = worked_example()
    fr = solve_compiled(costs_of(prof))
    # the doc's facts: 39 within 30, 43 within 26, 47 within 20, store-all 36 at 31, least 18
    assert fr.top() == ([18, 19, 20, 21, 27, 28, 31], [54, 51, 47, 43, 40, 39, 36])
    assert fr.choice(1, 4, 17) is None and fr.choice(1, 4, 31) is not None
    _same_top(solve(costs_of(prof)), fr)
    _replays_to_its_points(prof, fr)
    assert least_peak_compiled(costs_of(prof)) == 18


def _with_nograd(prof, scale):
    """The chain with forward_nograd_s = scale x forward_s (None: left out)."""
    if scale is None:
        return prof
    d = prof.model_dump()
    for la in d["layers"]:
        la["forward_nograd_s"] = la["forward_s"] * scale
    return type(prof).model_validate(d)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=random_chains(max_stages=9), cap_frac=st.one_of(st.none(), st.floats(0.0, 1.2)),
       width=st.sampled_from([1, 2, 256]), nograd=st.sampled_from([None, 0.5, 0.75]),
       parallel_work=st.sampled_from([0, 100_000]))
def test_equals_the_reference(prof, cap_frac, width, nograd, parallel_work):
    # with a no-grad forward time, the replay (which charges it to F ops) must still agree with
    # the DP's times point for point; parallel_work 0 runs every length on numba's threads,
    # 100,000 (the default) each of these short ones in the calling thread
    prof = _with_nograd(prof, nograd)
    c = costs_of(prof)
    cap = None if cap_frac is None else int(cap_frac * (sum(c.x) + sum(c.s) + 6))
    # width 1-2: the staging rows overflow
    got = solve_compiled(c, cap=cap, _width=width, _parallel_work=parallel_work)
    _same_top(solve(c, cap=cap), got)
    _replays_to_its_points(prof, got)
    assert least_peak_compiled(c) == least_peak(c)


def _real_bytes_chain(L, seed):
    """Large, distinct byte sizes (frontiers with many points) and float times."""
    r = random.Random(seed)
    return chain([r.randint(1, 10**9) for _ in range(L + 1)], [r.uniform(0.1, 2) for _ in range(L)],
                 [r.uniform(0.1, 4) for _ in range(L)], [r.randint(0, 2 * 10**9) for _ in range(L)],
                 [r.randint(0, 10**8) for _ in range(L)], [r.randint(0, 10**8) for _ in range(L)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thirty_stage_chains_with_real_byte_sizes(seed):
    """Large, distinct sizes (so frontiers have many points) and float times."""
    prof = _real_bytes_chain(30, seed)
    c = costs_of(prof)
    ref = solve(c)
    assert len(ref.top()[0]) > 20
    _same_top(ref, solve_compiled(c))
    cap = ref.top()[0][len(ref.top()[0]) // 3]
    _same_top(solve(c, cap=cap), solve_compiled(c, cap=cap, _width=4))


def test_nothing_fits_a_negative_or_tiny_cap():
    c = costs_of(worked_example())
    for cap in (-5, 0, 17):
        assert solve_compiled(c, cap=cap).top() == ([], [])


def _fastest_within(fr, cap):
    peaks, times = fr.top()
    k = max((i for i, p in enumerate(peaks) if p <= cap), default=None)
    return None if k is None else (peaks[k], times[k])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=random_chains(max_stages=9), cap_frac=st.floats(0.0, 1.2),
       width=st.sampled_from([1, 256]), nograd=st.sampled_from([None, 0.5]))
def test_windowed_point_is_the_references_point_at_the_budget(prof, cap_frac, width, nograd):
    """NOTE [ windows ]: the one point of a windowed solve is the full frontier's point at the cap,
    and its schedule (rebuilt at the cap or at the point's peak) replays to it."""
    prof = _with_nograd(prof, nograd)
    c = costs_of(prof)
    cap = int(cap_frac * (sum(c.x) + sum(c.s) + 6))
    want = _fastest_within(solve(c), cap)
    got = solve_compiled(c, cap=cap, windowed=True, _width=width)
    if want is None:
        assert got.top() == ([], [])
        return
    (peak,), (time,) = got.top()
    assert peak == want[0] and time == pytest.approx(want[1], rel=1e-12)
    for budget in (cap, peak):
        sim = simulate(prof, insert_drops(schedule_ops(got, budget), prof.n_stages))
        assert sim.valid, sim.error
        assert sim.peak_bytes <= peak and sim.time_s == pytest.approx(time, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_windowed_on_sixty_stages_with_real_byte_sizes(seed):
    """Many distinct peaks and windows that cut every frontier: the optimum at several budgets."""
    prof = _real_bytes_chain(60, seed)
    c = costs_of(prof)
    full = solve_compiled(c)
    peaks, times = full.top()
    for q in (0.05, 0.3, 0.7):
        cap = peaks[0] + int(q * (peaks[-1] - peaks[0]))
        got = solve_compiled(c, cap=cap, windowed=True)
        assert got.top()[1][0] == pytest.approx(_fastest_within(full, cap)[1], rel=1e-12)
        assert len(got._peaks) < len(full._peaks)  # the windows cut the frontiers


def _late_chain(L, seed):
    """Chains where late splits help: large forward transients, small records and outputs (so
    most boundaries pass `late_useful`), real byte sizes and float times."""
    r = random.Random(seed)
    u = 10**6
    return chain([r.randint(1, 6) * u + r.randint(0, 999) for _ in range(L + 1)],
                 [r.uniform(0.1, 2) for _ in range(L)], [r.uniform(0.1, 4) for _ in range(L)],
                 [r.randint(0, 2) * u + r.randint(0, 999) for _ in range(L)],
                 [r.randint(4, 12) * u for _ in range(L)], [r.randint(0, 1) * u for _ in range(L)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_late_splits_compiled_as_in_the_reference(seed):
    """NOTE [ late left parts ]: where many boundaries qualify, the kernel (full, capped,
    windowed, narrow staging rows) equals the reference, and its schedules use late splits."""
    prof = _late_chain(24, seed)
    c = costs_of(prof)
    assert sum(late_useful(c)) >= 3
    ref = solve(c)
    got = solve_compiled(c)
    _same_top(ref, got)
    _replays_to_its_points(prof, got)
    assert least_peak_compiled(c) == least_peak(c) == ref.top()[0][0]
    peaks = ref.top()[0]
    late_used = 0
    for cap in (peaks[0], peaks[len(peaks) // 4], peaks[len(peaks) // 2]):
        _same_top(solve(c, cap=cap), solve_compiled(c, cap=cap, _width=2))
        win = solve_compiled(c, cap=cap, windowed=True)
        assert win.top()[1] == pytest.approx([_fastest_within(ref, cap)[1]], rel=1e-12)
        ops = schedule_ops(win, cap)
        # a late split shows as `R j` run while a_j is live, just before `B j+1`
        late_used += sum(1 for a, b in zip(ops, ops[1:], strict=False)
                         if a[0] == "R" and b == ("B", a[1] + 1))
    assert late_used > 0


def _staircase(r, n):
    """A staircase of n points: peaks ascending (some shared with the other one's), times falling
    (some equal within 1e-12 relative, as ties)."""
    import numpy as np

    peaks = sorted(r.sample(range(1, 4 * n + 2), n))
    times, t = [], 100.0
    for _ in range(n):
        t -= r.choice([1.0, 0.5, 1e-14 * t])
        times.append(t)
    return (np.asarray(peaks, np.int64), np.asarray(times), np.asarray(r.sample(range(1000), n)))


@pytest.mark.parametrize("seed", range(40))
def test_both_merges_equal_the_reference_envelope(seed):
    """NOTE [ winners first ]: the envelope merged in place (head kept, tail moved) and the one
    `_merge_env` copies out are both the reference DP's lower envelope of the two staircases'
    points (planner/_optimal_dp.py), point for point and choice for choice: on exact ties the
    envelope's point stays, and times within 1e-12 relative are ties."""
    import numpy as np
    from memplan.planner._optimal_dp import _envelope
    from memplan.planner._optimal_kernel import _merge_env, _merge_in_place

    r = random.Random(seed)
    ne, ns = r.randint(1, 30), r.randint(1, 8)
    E = [np.asarray(a) for a in _envelope(list(zip(*_staircase(r, ne), strict=True)), None)]
    ne = len(E[0])  # a proper envelope: its own near-ties already dropped
    Sp, St, Sc = _staircase(r, ns)
    Sc = Sc + 1000  # on exact ties the envelope's point (a lower choice sorts first) stays
    want = [list(w) for w in _envelope(list(zip(*E, strict=True))
                                       + list(zip(Sp, St, Sc, strict=True)), None)]
    E = [np.asarray(a, d) for a, d in zip(E, (np.int64, np.float64, np.int64), strict=True)]
    copied = [np.empty(ne + ns + 1, a.dtype) for a in E]
    n = _merge_env(*E, ne, Sp, St, Sc, ns, *copied)
    assert [c[:n].tolist() for c in copied] == want
    got = [np.concatenate([a, np.full(ns + 1, -7, a.dtype)]) for a in E]
    scratch = [np.empty(ne + ns + 1, a.dtype) for a in E]
    m = _merge_in_place(*got, ne, Sp, St, Sc, ns, *scratch)
    assert [g[:m].tolist() for g in got] == want


def test_a_pool_that_outgrows_its_reservation_grows_to_the_same_frontiers(monkeypatch):
    # NOTE [ the pool's memory ]: reserved once; a pool that outgrows it doubles instead
    import numpy as np
    from memplan.planner import _optimal_kernel as kernel

    c = costs_of(_real_bytes_chain(30, 7))
    reserved = solve_compiled(c)
    monkeypatch.setattr(kernel, "_POOL_POINTS_PER_SUB", 0)  # the least reservation: 2^16 points
    monkeypatch.setattr(kernel, "_pool", lambda n_sub, f=kernel._pool: tuple(
        a[:64] for a in f(n_sub)))  # and cut to 64 points, so the kernel must grow it
    grown = solve_compiled(c)
    assert grown.top() == reserved.top()
    for st_ in range(1, c.L + 1):
        for t in range(st_, c.L + 1):
            for a, b in zip(grown.point_arrays(st_, t), reserved.point_arrays(st_, t), strict=True):
                assert np.array_equal(a, b)


def test_the_frontiers_outlive_the_object_that_made_them():
    # the result is a view of the reserved pool (NOTE [ the pool's memory ]), which the view
    # keeps alive
    import gc

    import numpy as np

    fr = solve_compiled(costs_of(_real_bytes_chain(30, 3)))
    peaks, times, _ = fr.point_arrays(1, fr.costs.L)
    kept = peaks.copy(), times.copy()
    del fr
    gc.collect()
    junk = [np.ones(1 << 16) for _ in range(64)]  # reuse whatever memory was freed
    assert np.array_equal(peaks, kept[0]) and np.array_equal(times, kept[1]) and len(junk) == 64
