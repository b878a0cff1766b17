"""The memory-time frontier: every Pareto-optimal (peak, time) of the optimal planner, from the
store-all peak down to the least feasible budget, with each baseline strategy's point beside it.

Every number is a replay (`memplan.planner.simulate`) of the schedule the point stands for.
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

from memplan.planner._build import one_level_ops
from memplan.planner._optimal_slotted import gap_of
from memplan.planner.optimal import (
    BAND_WIDTH,
    DEFAULT_GROUPS,
    _check_options,
    point_for,
    solve_frontier,
)
from memplan.planner.schema import PlanError
from memplan.planner.simulate import replay, store_all_time
from memplan.profiler.schema import Profile, load_profile
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FrontierPoint", "BaselinePoint", "Frontier", "frontier", "plot_frontier"]

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
    policies: dict[str, int] = Field(
        default_factory=dict, description="save policy -> stages recorded under it at this point "
        "(policies other than 'all'; docs/chain-model.md section 10.8)")


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
    mode: str = Field(description="'exact', or 'grouped' (stages solved in groups, see optimal.py)")
    store_all_time_s: float
    store_all_peak_bytes: int
    least_peak_bytes: int = Field(description="the least budget any schedule here fits")
    n_pareto: int = Field(description="Pareto points found (before thinning to `points`)")
    points: list[FrontierPoint] = Field(description="by ascending peak (descending time)")
    baselines: list[BaselinePoint]
    whole_stage_points: list[FrontierPoint] | None = Field(
        default=None, description="with save policies in the profile: the frontier with every "
        "stage recorded whole ('all'), to show what the policies buy; None otherwise")


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
    from memplan.planner.heuristic import plan_heuristic
    from memplan.planner.sqrt import plan_sqrt
    from memplan.planner.uniform import uniform_segments

    L = profile.n_stages
    out = []
    sa = replay(profile, one_level_ops([(1, L, False)], L))
    out.append(("store-all", "store-all", sa.peak_bytes, sa.time_s))
    sq = plan_sqrt(profile, None).predicted
    out.append(("sqrt", "sqrt", sq.peak_bytes, sq.time_s))
    uniform_peaks = set()
    for k in range(1, L + 1):
        sim = replay(profile, one_level_ops(uniform_segments(L, k), L))
        out.append(("uniform", f"uniform k={k}", sim.peak_bytes, sim.time_s))
        uniform_peaks.add(sim.peak_bytes)
    for budget in sorted(uniform_peaks):
        plan = plan_heuristic(profile, budget)
        if plan.feasible:
            p = plan.predicted
            out.append(("heuristic", f"heuristic within {budget} B", p.peak_bytes, p.time_s))
    seen, uniq = set(), []
    for row in out:
        if (row[1], row[2], row[3]) not in seen:
            seen.add((row[1], row[2], row[3]))
            uniq.append(row)
    return uniq


def frontier(
    profile: Profile | dict | str,
    *,
    points: int | None = None,
    exact_max_stages: int | None = None,
    groups: int = DEFAULT_GROUPS,
) -> Frontier:
    """The Pareto set of (peak bytes, seconds) of the optimal planner for `profile`, from the
    store-all peak down to the least feasible budget, and each baseline's point.

    `points`: thin the set to about that many points spread evenly in memory (the ends, and the
    point that dominates each baseline, are always kept); None keeps all. Returns a `Frontier`.
    """
    prof = load_profile(profile)
    if points is not None and (isinstance(points, bool) or not isinstance(points, int) or points < 2):
        raise PlanError(f"points: expected an integer >= 2 (or none for all), got {points!r}")
    _check_options(None, exact_max_stages, groups)
    fr, bounds = solve_frontier(prof, exact_max_stages=exact_max_stages, groups=groups)
    dp_peaks, _ = fr.top()
    L = prof.n_stages
    # replay every point's schedule: the frontier is made of predictions, like every plan
    replayed = []
    used: dict[tuple[int, float], dict[str, int]] = {}
    for peak in dp_peaks:
        ops, pols = point_for(fr, bounds, peak, L, prof)
        sim = replay(prof, ops, None, pols)
        replayed.append((sim.peak_bytes, sim.time_s))
        counts: dict[str, int] = {}
        for name in pols.values():
            counts[name] = counts.get(name, 0) + 1
        used[replayed[-1]] = dict(sorted(counts.items()))
    front = _pareto(replayed)
    base = store_all_time(prof)
    rows = _baselines(prof)
    peaks = [p for p, _ in front]
    baselines, keep = [], set()
    for strategy, label, peak, time in rows:
        k = max((i for i, p in enumerate(peaks) if p <= peak), default=None)
        dominated = k is not None and front[k][1] <= time * (1 + _REL)
        if k is not None:
            keep.add(k)
        baselines.append(BaselinePoint(
            strategy=strategy, label=label, peak_bytes=peak, time_s=time,
            overhead=max(0.0, time / base - 1) if base > 0 else 0.0, dominated=dominated,
        ))
    idx = _thin(peaks, points, keep) if points is not None else range(len(front))
    lower = _lower_bounds(prof, [front[i] for i in idx], exact=bounds is None)
    return Frontier(
        profile_name=prof.name,
        n_stages=L,
        mode="exact" if bounds is None else "grouped",
        store_all_time_s=base,
        store_all_peak_bytes=rows[0][2],
        least_peak_bytes=front[0][0],
        n_pareto=len(front),
        points=[
            FrontierPoint(peak_bytes=front[i][0], time_s=front[i][1],
                          overhead=max(0.0, front[i][1] / base - 1) if base > 0 else 0.0,
                          lower_bound_s=lb, optimality_gap=gap_of(front[i][1], lb),
                          policies=used.get(front[i], {}))
            for i, lb in zip(idx, lower, strict=True)
        ],
        baselines=baselines,
        whole_stage_points=(frontier(prof.with_policies(None), points=points,
                                     exact_max_stages=exact_max_stages, groups=groups).points
                            if prof.has_policies else None),
    )


# the longest chain whose grouped frontier gets the banded bound: its uncapped run took 1.4 s of
# CPU at 300 random stages (frontiers of ~1,800 points) and grows about as L^3; longer chains get
# the store-all time, a plain bound
BOUND_MAX_STAGES = 300


def _lower_bounds(prof: Profile, pts: list[tuple[int, float]], *, exact: bool) -> list[float]:
    """A certified lower bound (seconds) on the time within each point's peak: the point's own time
    when the frontier is exact; else, up to BOUND_MAX_STAGES stages, the banded DP's optimistic run
    without a budget (NOTE [ banded DP and its certificate ] in planner/_optimal_long.py: one
    staircase for every budget), and above, the store-all time."""
    if exact:
        return [t for _, t in pts]
    if prof.n_stages > BOUND_MAX_STAGES or prof.has_policies:  # the banded DP plans no policies
        base = store_all_time(prof)
        return [min(t, base) for _, t in pts]
    from memplan.planner._optimal_dp import costs_of
    from memplan.planner._optimal_long import solve_long

    lp, lt = solve_long(costs_of(prof), cap=None, width=BAND_WIDTH, optimistic=True,
                        windowed=False).top()
    out = []
    for peak, time in pts:
        k = bisect_right(lp, peak) - 1
        out.append(min(time, lt[k]) if k >= 0 else time)
    return out


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
