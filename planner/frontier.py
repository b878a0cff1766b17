"""The memory-time frontier: every Pareto-optimal (peak, time) of the optimal planner, from the
store-all peak down to the least feasible budget (banded mode: down to grouped's least peak,
NOTE [ the frontier's modes ]), with each baseline strategy's point beside it.

Every number is a replay (`memplan.planner.simulate`) of the schedule the point stands for.

NOTE [ the frontier's modes ]
1. "auto" solves exactly up to `exact_max_stages` (default EXACT_MAX_STAGES_UNCAPPED: without a
   budget nothing caps the frontiers). Above it, without save policies: where sub-chains repeat
   (NOTE [ memoised by content ] in planner/_optimal_long.py) memo mode, exact (gap 0) at every
   budget; elsewhere the banded DP without a budget (NOTE [ banded DP and its certificate ]
   there): the upper run's staircase is the frontier (schedules of the recurrence) and the lower
   run's staircase bounds every budget at once, so each point carries its own certified gap. The
   upper run does not reach the tightest budgets (it offers no long left parts): on the benchmark's
   random chains its least peak is 1.9 x the exact least peak at 300 stages and 3.6 x at 1,000
   (grouped's: 1.26 x and 2.55 x), with gaps of 16-22% there and under 0.05% above a third of the
   store-all peak. A wider band does not help there (300 stages, band 32: least peak 1.32 x, gap
   42% at it), so the band stays BAND_WIDTH. Below the upper run's least peak the grouped DP,
   capped there (0.6 s at 1,000 stages against 9 s uncapped), gives the points (mode "grouped",
   bounded by the same lower run); below grouped's least peak, plan_optimal with that budget
   gives a certified plan. On 1,000 identical blocks banded cost 3.8 s of CPU (lower run not yet
   folded) against memo's 14 s (2026-12-05), but its least peak is 1.25 x the exact one: memo is
   the certified option that covers every budget.
2. An explicit `exact_max_stages` keeps its meaning: grouped above it (`mode="grouped"` too), its
   points bounded by the banded lower run (with save policies, which the banded DP does not plan:
   by the store-all time, a plain bound). `mode` "exact", "memo", "banded" force one mode.
3. Every returned point is replayed. In exact, memo and banded modes a DP point is the replay of
   its schedule (tests/planner/test_optimal_kernel.py, test_long_chains.py), so only the returned
   points are replayed (`points` thins first); grouped DP points over-estimate peaks, so every
   one is replayed before the Pareto filter.
4. Above BASELINES_ALL_MAX stages the baselines are uniform at UNIFORM_KS values of k (every k up
   to 16, then spread geometrically to L) and the heuristic at HEURISTIC_PEAKS of their peaks:
   every k and every peak cost minutes at 1,000 stages (a uniform replay 22 ms, a heuristic plan
   0.16 s there). The heuristic's plans share their tries (`heuristic_plans`).
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from pathlib import Path
from time import perf_counter

from memplan.planner._build import one_level_ops
from memplan.planner._optimal_slotted import gap_of
from memplan.planner.optimal import (
    BAND_WIDTH,
    DEFAULT_GROUPS,
    EXACT_MAX_STAGES_UNCAPPED,
    _check_options,
    check_offload,
    check_offload_plannable,
    point_for,
    solve_frontier,
)
from memplan.planner.schema import PlanError
from memplan.planner.simulate import replay, store_all_time
from memplan.profiler.schema import Profile, load_profile
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FrontierPoint", "BaselinePoint", "Frontier", "frontier", "plot_frontier", "FRONTIER_MODES"]

log = logging.getLogger(__name__)

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
_REL = 1e-9  # float tolerance when comparing times summed in different orders


class FrontierPoint(BaseModel):
    """One Pareto-optimal schedule: no schedule of the planner is both faster and smaller."""

    model_config = _STRICT

    peak_bytes: int = Field(ge=0, description="activation peak (bytes above fixed_bytes)")
    time_s: float = Field(ge=0, description="predicted step time in seconds")
    overhead: float = Field(ge=0, description="time / store-all time - 1")
    lower_bound_s: float = Field(
        ge=0, description="certified: no schedule of the recurrence within peak_bytes is faster "
        "(seconds; NOTE [ long chains and the certificate ] in planner/optimal.py)",
    )
    optimality_gap: float = Field(ge=0, description="(time - lower_bound_s) / lower_bound_s; 0: exact")
    mode: str = Field(default="exact", description="the DP mode whose schedule this is: exact, "
                      "memo (exact), banded or grouped (NOTE [ the frontier's modes ])")
    policies: dict[str, int] = Field(
        default_factory=dict, description="save policy -> stages recorded under it at this point "
        "(policies other than 'all'; docs/chain-model.md section 10.8)")
    host_peak_bytes: int = Field(default=0, ge=0, description="bytes the point's schedule holds "
                                 "in host memory at most (offload, docs/chain-model.md 10.9)")
    transfer_wait_s: float = Field(default=0.0, ge=0, description="seconds the step waits for "
                                   "its host-device copies (offload)")


class BaselinePoint(BaseModel):
    """A baseline strategy's (peak, time), and whether a frontier point dominates it."""

    model_config = _STRICT

    strategy: str
    label: str = Field(description="strategy and setting, e.g. 'uniform k=4'")
    peak_bytes: int = Field(ge=0)
    time_s: float = Field(ge=0)
    overhead: float = Field(ge=0)
    dominated: bool = Field(description="some frontier point has peak and time both no larger")


class Frontier(BaseModel):
    """The optimal planner's memory-time trade-off for one profile."""

    model_config = _STRICT

    profile_name: str
    n_stages: int
    mode: str = Field(description="'exact', 'memo' (exact), 'banded' (its points below the "
                      "banded run's least peak grouped: each point names its mode) or 'grouped' "
                      "(NOTE [ the frontier's modes ])")
    store_all_time_s: float
    store_all_peak_bytes: int
    least_peak_bytes: int = Field(description="the least budget any schedule here fits")
    n_pareto: int = Field(description="Pareto points found (before thinning to `points`)")
    points: list[FrontierPoint] = Field(description="by ascending peak (descending time)")
    baselines: list[BaselinePoint]
    whole_stage_points: list[FrontierPoint] | None = Field(
        default=None, description="with save policies in the profile: the frontier with every "
        "stage recorded whole ('all'), to show what the policies buy; None otherwise")
    offload_bandwidth: float | None = Field(default=None, description="bytes/s the offload "
                                            "points assume; None: no offload")
    host_memory_bytes: int | None = Field(default=None, description="the host budget of the "
                                          "offload points (bytes); None: unlimited")
    recompute_only_points: list[FrontierPoint] | None = Field(
        default=None, description="with offload: the frontier without it, to show what offload "
        "buys; None otherwise")


def _pareto(pairs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    for peak, time in sorted(pairs):
        if not out or time < out[-1][1] * (1 - _REL):
            if out and out[-1][0] == peak:
                out[-1] = (peak, time)
            else:
                out.append((peak, time))
    return out


def _thin(peaks: list[int], n: int, keep: set[int]) -> list[int]:
    """Indices of about `n` points spread evenly in peak (ends included), plus `keep`."""
    if n >= len(peaks):
        return list(range(len(peaks)))
    lo, hi = peaks[0], peaks[-1]
    chosen = {0, len(peaks) - 1} | keep
    for j in range(1, n - 1):
        target = lo + (hi - lo) * j / (n - 1)
        k = max(i for i in range(len(peaks)) if peaks[i] <= target)
        chosen.add(k)
    return sorted(chosen)


def _baselines(profile: Profile) -> list[tuple[str, str, int, float]]:
    from memplan.planner.heuristic import heuristic_plans
    from memplan.planner.sqrt import plan_sqrt
    from memplan.planner.uniform import uniform_segments

    L = profile.n_stages
    out = []
    sa = replay(profile, one_level_ops([(1, L, False)], L))
    out.append(("store-all", "store-all", sa.peak_bytes, sa.time_s))
    sq = plan_sqrt(profile, None).predicted
    out.append(("sqrt", "sqrt", sq.peak_bytes, sq.time_s))
    uniform_peaks = set()
    for k in _uniform_ks(L):
        sim = replay(profile, one_level_ops(uniform_segments(L, k), L))
        out.append(("uniform", f"uniform k={k}", sim.peak_bytes, sim.time_s))
        uniform_peaks.add(sim.peak_bytes)
    heur = sorted(uniform_peaks)
    if L > BASELINES_ALL_MAX and len(heur) > HEURISTIC_PEAKS:  # NOTE [ the frontier's modes ], 4
        heur = [heur[round(j * (len(heur) - 1) / (HEURISTIC_PEAKS - 1))]
                for j in range(HEURISTIC_PEAKS)]
    for budget, plan in zip(heur, heuristic_plans(profile, heur), strict=True):
        if plan.feasible:
            p = plan.predicted
            out.append(("heuristic", f"heuristic within {budget} B", p.peak_bytes, p.time_s))
    seen, uniq = set(), []
    for row in out:
        if (row[1], row[2], row[3]) not in seen:
            seen.add((row[1], row[2], row[3]))
            uniq.append(row)
    return uniq


FRONTIER_MODES = ("auto", "exact", "memo", "banded", "grouped")
BASELINES_ALL_MAX = 120  # up to this many stages: uniform at every k, heuristic at every peak
UNIFORM_KS = 40  # above it: about this many values of k (NOTE [ the frontier's modes ], 4)
HEURISTIC_PEAKS = 12  # and the heuristic at this many of their peaks


def _uniform_ks(L: int) -> list[int]:
    """The uniform baseline's segment counts: every k up to BASELINES_ALL_MAX stages, else every k
    up to 16 and about UNIFORM_KS in all, spread geometrically to L."""
    if L <= BASELINES_ALL_MAX:
        return list(range(1, L + 1))
    n = UNIFORM_KS - 16
    return sorted({*range(1, 17), *(round(16 * (L / 16) ** (j / n)) for j in range(n + 1))})


def _solve_mode(prof: Profile, mode: str, exact_max_stages: int | None, groups: int):
    """(mode, frontiers, groups or None, lower staircase or None, band): the DP run the frontier
    is read from (NOTE [ the frontier's modes ]); the lower staircase (peaks in bytes, seconds)
    bounds every budget, None where the frontier is exact."""
    L = prof.n_stages
    auto = mode == "auto"
    if auto:
        if exact_max_stages is not None:
            mode = "exact" if L <= exact_max_stages else "grouped"
        elif L <= EXACT_MAX_STAGES_UNCAPPED:
            mode = "exact"
        else:
            mode = "grouped" if prof.has_policies else "banded"
    if mode in ("memo", "banded") and prof.has_policies:
        raise PlanError(f"mode: {mode!r} does not plan save policies; use mode 'auto', 'exact' or "
                        "'grouped' (or a profile without `policies`)")
    if mode == "exact":
        fr, _ = solve_frontier(prof, exact_max_stages=L, groups=groups)
        return "exact", fr, None, None, None
    if mode == "grouped":
        top = max(1, L - 1)  # grouped needs L above it
        fr, bounds = solve_frontier(prof, exact_max_stages=top if exact_max_stages is None
                                    else min(exact_max_stages, top), groups=groups)
        return "grouped", fr, bounds, _lower_staircase(prof), None
    from memplan.planner._optimal_dp import costs_of
    from memplan.planner._optimal_long import repeated_classes, solve_long

    c = costs_of(prof)
    classes = repeated_classes(c) if auto else None
    if mode == "memo" or classes is not None:
        return ("memo", solve_long(c, cap=None, memo=True, classes=classes, windowed=False), None,
                None, None)
    up = solve_long(c, cap=None, width=BAND_WIDTH, windowed=False)
    return "banded", up, None, _lower_staircase(prof, BAND_WIDTH), BAND_WIDTH


def frontier(
    profile: Profile | dict | str,
    *,
    points: int | None = None,
    exact_max_stages: int | None = None,
    groups: int = DEFAULT_GROUPS,
    mode: str = "auto",
    offload_bandwidth: float | None = None,
    host_memory_bytes: int | None = None,
) -> Frontier:
    """The Pareto set of (peak bytes, seconds) of the optimal planner for `profile`, from the
    store-all peak down to the least feasible budget, and each baseline's point.

    `points`: thin the set to about that many points spread evenly in memory (the ends, and the
    point that dominates each baseline, are always kept); None keeps all. `mode`: one of
    FRONTIER_MODES (NOTE [ the frontier's modes ]). Returns a `Frontier`; each point says its mode, lower bound and gap.
    `offload_bandwidth` (bytes/s) and `host_memory_bytes`: the frontier of plans that may also
    offload (docs/chain-model.md section 10.9), each point with its host peak, and beside it
    `recompute_only_points`, the frontier without offload.
    """
    prof = load_profile(profile)
    if points is not None and (isinstance(points, bool) or not isinstance(points, int) or points < 2):
        raise PlanError(f"points: expected an integer >= 2 (or none for all), got {points!r}")
    if mode not in FRONTIER_MODES:
        raise PlanError(f"mode: expected one of {', '.join(FRONTIER_MODES)}, got {mode!r}")
    _check_options(None, exact_max_stages, groups)
    if check_offload(offload_bandwidth, host_memory_bytes):
        return _offload_frontier(prof, points=points, mode=mode, bandwidth=float(offload_bandwidth),
                                 host_cap=host_memory_bytes, exact_max_stages=exact_max_stages,
                                 groups=groups)
    t0 = perf_counter()
    mode, fr, bounds, lower, band = _solve_mode(prof, mode, exact_max_stages, groups)
    t_dp = perf_counter() - t0
    L = prof.n_stages
    used: dict[tuple[int, float], dict[str, int]] = {}
    done: dict[tuple[int, float], str] = {}  # replayed points -> their mode

    def replayed(run, groups_used, peak: int, point_mode: str) -> tuple[int, float]:
        ops, pols = point_for(run, groups_used, peak, L, prof)
        sim = replay(prof, ops, None, pols)
        counts: dict[str, int] = {}
        for name in pols.values():
            counts[name] = counts.get(name, 0) + 1
        used[(sim.peak_bytes, sim.time_s)] = dict(sorted(counts.items()))
        done[(sim.peak_bytes, sim.time_s)] = point_mode
        return sim.peak_bytes, sim.time_s

    dp_peaks, dp_times = fr.top()
    if bounds is None:  # a DP point is its schedule's replay: replay only those returned (3)
        front = _pareto(list(zip(dp_peaks, dp_times, strict=True)))
    else:
        front = _pareto([replayed(fr, bounds, peak, mode) for peak in dp_peaks])
    if mode == "banded" and front:  # below the upper run's least peak: grouped's points (1)
        low, low_groups = solve_frontier(prof, cap_bytes=front[0][0] - 1,
                                         exact_max_stages=max(1, L - 1), groups=groups)
        below = [replayed(low, low_groups, peak, "grouped") for peak in low.top()[0]]
        front = _pareto([q for q in below if q[0] < front[0][0]] + front)
    base = store_all_time(prof)
    rows = _baselines(prof)
    peaks = [p for p, _ in front]
    baselines, keep = [], set()
    for strategy, label, peak, time_s in rows:
        k = max((i for i, p in enumerate(peaks) if p <= peak), default=None)
        dominated = k is not None and front[k][1] <= time_s * (1 + _REL)
        if k is not None:
            keep.add(k)
        baselines.append(BaselinePoint(
            strategy=strategy, label=label, peak_bytes=peak, time_s=time_s,
            overhead=max(0.0, time_s / base - 1) if base > 0 else 0.0, dominated=dominated,
        ))
    idx = _thin(peaks, points, keep) if points is not None else range(len(front))
    chosen = [front[i] if front[i] in done else replayed(fr, bounds, front[i][0], mode)
              for i in idx]
    if lower is None:  # exact: each point is its own bound
        lbs = [t for _, t in chosen]
    else:
        lbs = [_bound_at(lower, p, t) for p, t in chosen]
    log.info("frontier: %d stages, mode %s%s, %d Pareto points, DP %.2f s, %.2f s in all", L, mode,
             f" (band {band})" if band else "", len(front), t_dp, perf_counter() - t0)
    return Frontier(
        profile_name=prof.name,
        n_stages=L,
        mode=mode,
        store_all_time_s=base,
        store_all_peak_bytes=rows[0][2],
        least_peak_bytes=front[0][0],
        n_pareto=len(front),
        points=[
            FrontierPoint(peak_bytes=p, time_s=t,
                          overhead=max(0.0, t / base - 1) if base > 0 else 0.0,
                          mode=done.get((p, t), mode),
                          lower_bound_s=lb, optimality_gap=gap_of(t, lb),
                          policies=used.get((p, t), {}))
            for (p, t), lb in zip(chosen, lbs, strict=True)
        ],
        baselines=baselines,
        whole_stage_points=(frontier(prof.with_policies(None), points=points,
                                     exact_max_stages=exact_max_stages, groups=groups).points
                            if prof.has_policies else None),
    )


def _offload_frontier(prof: Profile, *, points, mode, bandwidth: float, host_cap, exact_max_stages,
                      groups) -> Frontier:
    """The frontier with offload (planner/_optimal_offload.py): every point of the DP's uncapped
    run, as (peak, time) Pareto points at the host budget, each replayed for its host peak and
    wait; exact, so each point is its own bound."""
    from memplan.planner._build import insert_drops
    from memplan.planner._optimal_dp import costs_of
    from memplan.planner._optimal_offload import offload_ops, solve_offload

    check_offload_plannable(prof, mode)
    L = prof.n_stages
    c = costs_of(prof)
    fr = solve_offload(c, bandwidth=bandwidth)  # a relaxation of the host budget: exact when
    # every point fits it (NOTE [ offload in the recurrence ]); else the three-dimensional DP
    if host_cap is not None and any(pt[1] > host_cap for pt in fr.top()):
        fr = solve_offload(c, bandwidth=bandwidth, host_cap=host_cap)
    best: dict[int, tuple] = {}  # peak -> the fastest point (least host on ties)
    for pt in fr.top():
        if pt[0] not in best or (pt[2], pt[1]) < (best[pt[0]][2], best[pt[0]][1]):
            best[pt[0]] = pt
    front, by_pair = [], {}
    for peak in sorted(best):  # Pareto in (peak, time): the host budget is a constraint
        pt = best[peak]
        if not front or pt[2] < front[-1][1] * (1 - _REL):
            front.append((peak, pt[2]))
            by_pair[(peak, pt[2])] = pt
    plain = frontier(prof, points=points, exact_max_stages=exact_max_stages, groups=groups)
    peaks = [p for p, _ in front]
    base = store_all_time(prof)
    baselines, keep = [], set()
    for b in plain.baselines:
        k = max((i for i, p in enumerate(peaks) if p <= b.peak_bytes), default=None)
        if k is not None:
            keep.add(k)
        baselines.append(b.model_copy(update={
            "dominated": k is not None and front[k][1] <= b.time_s * (1 + _REL)}))
    idx = _thin(peaks, points, keep) if points is not None else range(len(front))
    out = []
    for i in idx:
        pt = by_pair[front[i]]
        sim = replay(prof, insert_drops(offload_ops(fr, pt), L), offload_bandwidth=bandwidth)
        out.append(FrontierPoint(
            peak_bytes=sim.peak_bytes, time_s=sim.time_s,
            overhead=max(0.0, sim.time_s / base - 1) if base > 0 else 0.0,
            lower_bound_s=sim.time_s, optimality_gap=0.0, mode="exact",
            host_peak_bytes=sim.host_peak_bytes, transfer_wait_s=sim.transfer_wait_s))
    return Frontier(
        profile_name=prof.name, n_stages=L, mode="exact", store_all_time_s=base,
        store_all_peak_bytes=plain.store_all_peak_bytes, least_peak_bytes=front[0][0],
        n_pareto=len(front), points=out, baselines=baselines, offload_bandwidth=bandwidth,
        host_memory_bytes=host_cap, recompute_only_points=plain.points,
    )


def _bound_at(lower: tuple[list[int], list[float]], peak: int, time_s: float) -> float:
    """The lower staircase's time (seconds) within `peak` bytes, at most `time_s` (the point's
    own time bounds its own budget only from above; a tie in another summation order is kept)."""
    k = bisect_right(lower[0], peak) - 1
    return min(time_s, lower[1][k]) if k >= 0 else time_s


def _lower_staircase(prof: Profile, width: int = BAND_WIDTH) -> tuple[list[int], list[float]]:
    """A certified lower bound on the time within every budget: the banded DP's optimistic run
    without a budget, folded (NOTE [ banded DP and its certificate ] and NOTE [ folded lower run ]
    in planner/_optimal_long.py: 2.3 s of CPU at 1,000 random stages against 8.6 s), as
    (peaks in bytes, seconds); with save policies (which it does not plan), the store-all time at
    every budget."""
    if prof.has_policies:
        return [0], [store_all_time(prof)]
    from memplan.planner._optimal_dp import costs_of
    from memplan.planner._optimal_long import solve_long

    return solve_long(costs_of(prof), cap=None, width=width, optimistic=True, windowed=False,
                      fold=True).top()


def plot_frontier(result: Frontier, path: str | Path) -> Path:
    """Draw the frontier as a staircase with each baseline's point, as a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from memplan.planner.units import format_bytes

    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    gib = 1 / 2**30 if result.store_all_peak_bytes >= 2**30 else 1 / 2**20
    unit = "GiB" if gib == 1 / 2**30 else "MiB"
    xs = [p.peak_bytes * gib for p in result.points]
    ys = [p.overhead * 100 for p in result.points]
    ax.step(xs, ys, where="post", color="black", lw=1.5, label=f"optimal ({result.mode})")
    ax.plot(xs, ys, "o", color="black", ms=3)
    if result.recompute_only_points:  # what offload buys (section 10.9)
        ax.step([p.peak_bytes * gib for p in result.recompute_only_points],
                [p.overhead * 100 for p in result.recompute_only_points], where="post",
                color="grey", lw=1, ls=":", label="recompute only (no offload)")
    if result.whole_stage_points:  # what the save policies buy (section 10.8)
        ax.step([p.peak_bytes * gib for p in result.whole_stage_points],
                [p.overhead * 100 for p in result.whole_stage_points], where="post",
                color="grey", lw=1, ls="--", label="whole stages only (no save policies)")
    markers = {"store-all": "s", "sqrt": "^", "uniform": "x", "heuristic": "+"}
    for strategy in dict.fromkeys(b.strategy for b in result.baselines):
        pts = [b for b in result.baselines if b.strategy == strategy]
        ax.plot([b.peak_bytes * gib for b in pts], [b.overhead * 100 for b in pts],
                markers.get(strategy, "o"), ls="none", label=strategy)
    ax.set_xlabel(f"activation peak ({unit}); least feasible {format_bytes(result.least_peak_bytes)}")
    ax.set_ylabel("recompute overhead (% of store-all time)")
    ax.set_title(f"{result.profile_name}: memory-time frontier ({result.n_stages} stages)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
