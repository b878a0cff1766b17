"""Optimal checkpointing: the least-time persistent schedule within a memory budget, exact in bytes.

The dynamic programme of Beaumont et al. 2019 ("Optimal checkpointing for heterogeneous chains"),
adapted to docs/chain-model.md and kept as exact Pareto frontiers (peak bytes, seconds)
per sub-chain: see planner/_optimal_dp.py. It also answers the inverse question (`max_overhead`:
the least memory whose time is at most (1 + max_overhead) x the store-all time).

NOTE [ exact and approximate modes ]
The exact frontier DP costs about L^3 x (frontier size) steps; compiled (planner/_optimal_kernel.py)
that is a tenth of a second at 60 stages and 0.4-1.2 s at 200 on two cores for a plan at one
budget (windowed: NOTE [ windows ] there; docs/planner.md has the measurements). Above
`exact_max_stages` stages the planner groups
consecutive stages into macro stages and solves the same recurrence exactly over them: every
schedule it returns is a valid schedule of the original chain and its prediction is a replay, but
schedules that cut inside a group are not searched. The plan says so (`options["mode"] ==
"grouped"`, `options["groups"]`) and reports the least peak the exact recurrence allows, which the
grouped plan may miss. Measured against exact at 200 stages, 150 groups lose at most 0.55%.

NOTE [ long chains and the certificate ]
Above EXACT_MAX_STAGES stages with a budget (and no explicit `exact_max_stages`, which keeps its
meaning: grouped above it), "auto" no longer groups: a chain whose sub-chains
repeat (a transformer's identical blocks) is solved exactly with memoisation by content ("memo"),
any other by the banded DP ("banded"), whose schedule comes with a certified lower bound (both in
planner/_optimal_long.py). Every plan with a schedule carries `options["lower_bound_s"]` (seconds:
no schedule of the recurrence within the budget is faster) and `options["optimality_gap"]` =
(time - lower bound) / lower bound: 0 for exact and memo plans; banded, slotted and grouped plans
say how near they are. Plans without a budget bound the time by the store-all time (a schedule runs
each stage's forward and backward at least once), which is exact for the fastest plan and a plain
bound for `max_overhead` plans, whose objective is memory.
"""

from __future__ import annotations

import logging
import math
import time as _time

import numpy as np
from memplan.planner._build import finish_plan, infeasible_plan, insert_drops
from memplan.planner._optimal_dp import (
    MAX_POLICY_RUNS,
    PolicyRuns,
    backward_floors,
    costs_of,
    expand_ops,
    expand_policies,
    group_costs,
    policy_runs,
    schedule_and_policies,
    schedule_ops,
)
from memplan.planner._optimal_slotted import INF, Refined, gap_of, refine
from memplan.planner.schema import Plan, PlanError
from memplan.planner.simulate import replay, store_all_time
from memplan.profiler.schema import Profile

__all__ = ["plan_optimal", "solve_frontier", "EXACT_MAX_STAGES", "EXACT_MAX_STAGES_UNCAPPED",
           "DEFAULT_GROUPS", "MODES", "BAND_WIDTH", "check_mode", "use_slotted", "plan_slotted",
           "lower_bound_banded", "check_offload", "check_offload_plannable", "backward_floors"]

log = logging.getLogger(__name__)

EXACT_MAX_STAGES = 200  # above this, group stages (exact, windowed: 0.4-1.2 s at 200 on two cores)
# without a budget (max_overhead, the fastest plan, the frontier) nothing caps the frontiers, which
# are then several times larger: exact takes 1-1.5 s at 100 stages and ~10 s at 200
EXACT_MAX_STAGES_UNCAPPED = 120
DEFAULT_GROUPS = 150  # macro stages in grouped mode (1-4 s at 1,000 stages)
# NOTE [ slotted mode and its bound ] for slotted, NOTE [ long chains and the certificate ] for
# memo and banded
MODES = ("auto", "exact", "memo", "banded", "slotted", "grouped")
BAND_WIDTH = 16  # banded mode's first band (stages); doubled until the gap is within max_gap


def solve(c, *, cap: int | None = None, windowed: bool = False):
    """The compiled DP's frontiers (planner/_optimal_kernel.py; `windowed`: NOTE [ windows ]
    there); with save policies, one solve per `policy_runs` combination (NOTE [ save policies in
    the recurrence ] in planner/_optimal_dp.py), as `PolicyRuns`. Imported on first use: numba's
    import is most of `import planner`'s time, and baselines and the simulator never need it."""
    from memplan.planner._optimal_kernel import solve_compiled

    if c.K == 1:
        return solve_compiled(c, cap=cap, windowed=windowed)
    runs, left = policy_runs(c)
    if left:
        log.warning("optimal: stages %s keep several save policies without late splits at their "
                    "boundary (more than %d policy runs)", left, MAX_POLICY_RUNS)
    if len(runs) == 1:
        return solve_compiled(c, cap=cap, windowed=windowed)
    return PolicyRuns(c, [(solve_compiled(cc, cap=cap, windowed=windowed), fixed)
                          for cc, fixed in runs])


def least_peak(c) -> int:
    """The least peak (bytes) of any schedule of the recurrence, compiled (see `solve`)."""
    from memplan.planner._optimal_kernel import least_peak_compiled

    if c.K == 1:
        return least_peak_compiled(c)
    return min(least_peak_compiled(cc) for cc, _ in policy_runs(c)[0])


def _groups(n_stages: int, groups: int) -> list[tuple[int, int]]:
    """`groups` contiguous runs of stages whose sizes differ by at most one."""
    g = max(1, min(groups, n_stages))
    base, extra = divmod(n_stages, g)
    bounds, p = [], 1
    for k in range(g):
        q = p + base + (1 if k < extra else 0) - 1
        bounds.append((p, q))
        p = q + 1
    return bounds


def solve_frontier(
    profile: Profile,
    *,
    cap_bytes: int | None = None,
    exact_max_stages: int | None = None,
    groups: int = DEFAULT_GROUPS,
    windowed: bool = False,
    memo: bool | None = False,
    classes: np.ndarray | None = None,
    time_cap_s: float | None = None,
) -> tuple[object, list[tuple[int, int]] | None]:
    """The DP's frontiers for `profile` (points above `cap_bytes` dropped; `top()` and `choice()`
    as in `_optimal_dp.Frontiers`; `windowed`: only what a plan within `cap_bytes` needs, and
    `top()` is its one point) and the stage groups used (None: exact, one per macro stage).
    `memo`: solve exactly with memoisation by content (NOTE [ memoised by content ] in
    planner/_optimal_long.py) at any length; None: where it saves most of the work and the chain
    is longer than `exact_max_stages` (instead of grouping); `classes`: the content classes where
    the caller has them (`repeated_classes`); `time_cap_s` (memo with `cap_bytes`): an upper
    bound on the optimum's time (NOTE [ the time cap ] in planner/_optimal_kernel.py)."""
    c = costs_of(profile)
    L = profile.n_stages
    bounds = None
    if exact_max_stages is None:
        exact_max_stages = EXACT_MAX_STAGES if cap_bytes is not None else EXACT_MAX_STAGES_UNCAPPED
    if memo is None and L > exact_max_stages and c.K == 1:
        from memplan.planner._optimal_long import repeated_classes

        classes = repeated_classes(c)
    if memo is None:
        memo = classes is not None
    if memo:
        from memplan.planner._optimal_long import solve_long

        return solve_long(c, cap=cap_bytes, memo=True, classes=classes, windowed=windowed,
                          time_cap_s=time_cap_s), None
    if L > exact_max_stages:
        bounds = _groups(L, groups)
        c = group_costs(c, bounds)
        log.info("optimal: %d stages > exact_max_stages=%d; solving over %d groups",
                 L, exact_max_stages, len(bounds))
    return solve(c, cap=cap_bytes, windowed=windowed), bounds


def _check_policy_options(mode: str, checkpoint_dtype: str) -> None:
    """Refuse (PlanError naming the field) the options that do not plan save policies yet."""
    if mode in ("memo", "banded", "slotted"):
        raise PlanError(f"mode: {mode!r} does not plan save policies; use mode 'auto', 'exact' or "
                        "'grouped' (or a profile without `policies`)")
    if checkpoint_dtype not in ("compute", None):
        from memplan.planner.checkpoint_dtype import parse_checkpoint_dtype

        if parse_checkpoint_dtype(checkpoint_dtype) != "compute":
            raise PlanError("checkpoint_dtype: storing checkpoints in another dtype is not planned "
                            "together with save policies yet; use 'compute' (or a profile "
                            "without `policies`)")


def one_level_bound(profile: Profile, budget_bytes: int) -> float | None:
    """An upper bound (seconds) on the optimum within `budget_bytes`: the replayed time of the
    fastest one-level schedule found that fits (the last q stages recorded, the ones before in
    recomputed segments of q), None when none fits. Such a schedule is one of the recurrence's
    (nested right parts, recorded left parts), so the bound holds for the DP's optimum; memo plans
    use it as their time cap (NOTE [ the time cap ] in planner/_optimal_kernel.py).

    Above q = sqrt(L) the family's peak grows about linearly with q and its time falls by one
    no-grad forward per stage of q, so q is searched between a q that fits and one that does not,
    each probe where the line through the two meets the budget (every other probe a bisection),
    until they are L / 256 stages apart: a bound within about L / 256 forwards of the family's
    best, in 5-7 replays (store-all's and q = sqrt(L)'s included) instead of a bisection's 12."""
    from memplan.planner._build import one_level_ops
    from memplan.planner.uniform import uniform_segments

    L = profile.n_stages

    def replayed(q: int):
        head = L - q  # stages 1..head in segments of q, all recomputed; the tail recorded
        segments = [(p, e, True) for p, e, _ in uniform_segments(head, q)]
        return replay(profile, one_level_ops(segments + [(head + 1, L, False)], L))

    high = replayed(L)  # store-all
    if high.peak_bytes <= budget_bytes:
        return high.time_s
    lo = max(1, math.isqrt(L))  # near the least peak of the family; above it peaks grow with q
    best = replayed(lo)
    if best.peak_bytes > budget_bytes:
        return None
    hi, probes = L, 0  # q = lo fits, q = hi does not
    while hi - lo > max(1, L // 256):
        probes += 1
        mid = (lo + hi) // 2
        if probes % 2 and high.peak_bytes > best.peak_bytes:  # where the line meets the budget
            step = (budget_bytes - best.peak_bytes) * (hi - lo) // (high.peak_bytes - best.peak_bytes)
            mid = min(hi - 1, max(lo + 1, lo + step))
        sim = replayed(mid)
        if sim.peak_bytes <= budget_bytes:
            lo, best = mid, sim
        else:
            hi, high = mid, sim
    return best.time_s


def lower_bound_banded(c, budget_bytes: int, width: int = BAND_WIDTH) -> float:
    """A certified lower bound (seconds) on the exact recurrence's least time within
    `budget_bytes`: the banded DP's optimistic run (NOTE [ banded DP and its certificate ] in
    planner/_optimal_long.py); inf when no schedule fits."""
    from memplan.planner._optimal_long import solve_long

    _, times = solve_long(c, cap=budget_bytes, width=width, optimistic=True).top()
    return times[-1] if times else INF


def _ops_for(fr, bounds, peak: int, n_stages: int):
    return point_for(fr, bounds, peak, n_stages)[0]


def point_for(fr, bounds, peak: int, n_stages: int, profile: Profile | None = None
              ) -> tuple[list, dict[int, str]]:
    """The schedule (drops included) of the frontiers' fastest point within `peak` bytes, and
    its save policies by name ({stage: policy}, stages under 'all' left out; names need
    `profile`)."""
    ops, chosen = schedule_and_policies(fr, peak)
    if bounds is not None:
        ops = expand_ops(ops, bounds)
        npol = [1] + [1 + len(la.policies) for la in profile.layers] if profile else None
        chosen = expand_policies(chosen, bounds, npol)
    names = {}
    if chosen and profile is not None:
        names = {i: profile.layers[i - 1].policy_names[p] for i, p in sorted(chosen.items())}
    return insert_drops(ops, n_stages), names


def _check_options(max_overhead, exact_max_stages, groups) -> None:
    if max_overhead is not None:
        if isinstance(max_overhead, bool) or not isinstance(max_overhead, (int, float)) or not (
            math.isfinite(max_overhead) and max_overhead >= 0
        ):
            raise PlanError(
                f"max_overhead: expected a finite fraction >= 0 (0.2 for at most 20% slower), "
                f"got {max_overhead!r}"
            )
    for name, val in (("exact_max_stages", exact_max_stages), ("groups", groups)):
        if name == "exact_max_stages" and val is None:
            continue  # the default: by whether a budget caps the frontiers
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise PlanError(f"{name}: expected a positive integer, got {val!r}")


def plan_optimal(
    profile: Profile,
    budget_bytes: int | None = None,
    *,
    max_overhead: float | None = None,
    exact_max_stages: int | None = None,
    groups: int = DEFAULT_GROUPS,
    checkpoint_dtype: str = "compute",
    tolerance: float | None = None,
    mode: str = "auto",
    slots: int = 500,
    max_gap: float = 0.01,
    offload_bandwidth: float | None = None,
    host_memory_bytes: int | None = None,
) -> Plan:
    """The fastest persistent schedule whose peak (bytes above fixed memory) fits `budget_bytes`.

    - No budget and no `max_overhead`: the fastest schedule (store-all time) at its least peak.
    - `max_overhead` (a fraction, 0.2 = 20%): the least peak whose time is at most
      (1 + max_overhead) x store-all time; with a budget too, infeasible when that peak is over it.
    - Infeasible budgets give `feasible=False` and the least budget that fits in the message.

    Returns a `Plan` (times in seconds, sizes in bytes, from a replay of its schedule). Chains of
    more than `exact_max_stages` stages are solved over `groups` macro stages (NOTE [ exact and
    approximate modes ]); `options` says which mode ran.

    `checkpoint_dtype` other than `compute` (`auto`, `bf16`, `fp8`, ...) also chooses the storage
    dtype of the kept activations within the relative gradient error `tolerance`
    (planner/checkpoint_dtype.py): the fastest frontier schedule that fits the budget once stored.

    `mode`: "auto" (exact up to `exact_max_stages` stages; above, grouped, except with a budget
    and the default `exact_max_stages`: memo where sub-chains repeat, else banded), "exact", "memo" (exact, memoised by content),
    "banded" (certified, refined while the gap exceeds `max_gap`), "grouped" or "slotted"
    (rotor's formulation: memory in `slots` slots, refined while the certified `optimality_gap`
    exceeds `max_gap`, NOTE [ slotted mode and its bound ]). Every plan with a schedule carries
    `options["lower_bound_s"]` and `options["optimality_gap"]` (NOTE [ long chains and the
    certificate ]); its message names the mode, the gap and the seconds spent.

    `offload_bandwidth` (bytes/s; None or 0: no offload) also lets the plan move kept activations
    and records to host memory and back, overlapped with compute, within `host_memory_bytes` of
    host memory (None: unlimited): docs/chain-model.md section 10.9, planner/_optimal_offload.py.
    Such plans carry transfer ops and `predicted.host_peak_bytes`, `predicted.transfer_wait_s`."""
    t0 = _time.perf_counter()
    _check_options(max_overhead, exact_max_stages, groups)
    check_mode(mode, slots, max_gap)
    bandwidth = check_offload(offload_bandwidth, host_memory_bytes)
    if bandwidth:
        return _plan_offload(profile, budget_bytes, max_overhead=max_overhead, mode=mode,
                             checkpoint_dtype=checkpoint_dtype, bandwidth=bandwidth,
                             host_cap=host_memory_bytes, t0=t0)
    if profile.has_policies:
        _check_policy_options(mode, checkpoint_dtype)
    if use_slotted(mode, budget_bytes, max_overhead, checkpoint_dtype):
        return plan_slotted(profile, budget_bytes, slots=slots, max_gap=max_gap)
    if mode == "banded" and (budget_bytes is None or max_overhead is not None):
        raise PlanError("mode: 'banded' needs budget_bytes and no max_overhead (its bound is on the "
                        "time within a budget); use mode='auto' for the other questions")
    if mode == "exact":
        exact_max_stages = profile.n_stages
    elif mode == "grouped":
        exact_max_stages = 1
    if checkpoint_dtype != "compute":
        from memplan.planner.checkpoint_dtype import parse_checkpoint_dtype

        if parse_checkpoint_dtype(checkpoint_dtype) != "compute":
            return _plan_with_storage(
                profile, budget_bytes, max_overhead=max_overhead, exact_max_stages=exact_max_stages,
                groups=groups, checkpoint_dtype=checkpoint_dtype, tolerance=tolerance,
            )
    L = profile.n_stages
    cap = budget_bytes if max_overhead is None else None
    memo: bool | None = mode == "memo"
    classes = None
    if mode == "auto" and exact_max_stages is None and cap is not None and L > EXACT_MAX_STAGES:
        # NOTE [ long chains and the certificate ]; an explicit exact_max_stages keeps its meaning
        # (grouped above it), and without a budget the frontiers are uncapped (several times
        # larger): grouped, as before
        if not profile.has_policies:
            from memplan.planner._optimal_long import repeated_classes

            classes = repeated_classes(costs_of(profile))
        memo = classes is not None
        if not memo and not profile.has_policies:  # with policies: grouped (solve_frontier)
            mode = "banded"
    if mode == "banded":
        return _plan_banded(profile, budget_bytes, max_gap=max_gap, t0=t0)
    # memo: a one-level schedule's time caps what each sub-problem may take (NOTE [ the time cap ]
    # in planner/_optimal_kernel.py); the result is the same exact optimum
    time_cap = one_level_bound(profile, cap) if memo and cap is not None else None
    fr, bounds = solve_frontier(
        profile, cap_bytes=cap, exact_max_stages=exact_max_stages, groups=groups,
        windowed=cap is not None,  # one point is wanted: the fastest within the budget
        memo=memo, classes=classes, time_cap_s=time_cap,
    )
    peaks, times = fr.top()
    name = "memo" if memo else "exact" if bounds is None else "grouped"
    options: dict = {"mode": name}
    if bounds is not None:
        options["groups"] = [[p, q] for p, q in bounds]
    if max_overhead is not None:
        options["max_overhead"] = max_overhead
    if not peaks:  # nothing within the cap
        least = least_peak(fr.costs)
        return _infeasible(profile, budget_bytes, least, options)
    if max_overhead is not None:
        limit = (1.0 + max_overhead) * store_all_time(profile)
        k = next((i for i, tm in enumerate(times) if tm <= limit * (1 + 1e-12)), len(times) - 1)
        if budget_bytes is not None and peaks[k] > budget_bytes:
            ops, pols = point_for(fr, bounds, peaks[k], L, profile)
            sim = replay(profile, ops, None, pols)
            if sim.peak_bytes > budget_bytes:
                return finish_plan(
                    profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim,
                    options=options, policies=pols,
                    message=f"the least memory within +{max_overhead:.1%} time is {sim.peak_bytes} bytes",
                )
    elif budget_bytes is None:
        k = len(peaks) - 1
    else:
        k = len(peaks) - 1  # the cap already dropped the points above the budget
    ops, pols = point_for(fr, bounds, peaks[k], L, profile)
    sim = replay(profile, ops, None, pols)
    # the certificate (NOTE [ long chains and the certificate ])
    if bounds is None:
        lower = sim.time_s
    elif profile.has_policies:  # each stage runs forward and backward once, under some policy
        lower = min(sim.time_s, sum(min(la.policy(n).forward_s + la.policy(n).backward_s
                                        for n in la.policy_names) for la in profile.layers))
    elif cap is not None:
        lower = min(sim.time_s, lower_bound_banded(costs_of(profile), cap))
    else:
        lower = store_all_time(profile)
    gap = gap_of(sim.time_s, lower)
    options["lower_bound_s"] = lower
    options["optimality_gap"] = gap
    desc = {"exact": "exact", "memo": "exact (memoised by content)",
            "grouped": f"grouped ({len(bounds or ())} groups)"}[name]
    msg = (
        f"{desc} persistent optimum: "
        f"{_recomputed(ops, L)} recomputed forwards"
    )
    if bounds is not None:
        msg += "; stages are grouped (cuts inside a group are not searched)"
        if L <= 200:  # the exact least peak is O(L^3) scalar work: affordable up to ~200 stages
            msg += f"; the exact least peak is {least_peak(costs_of(profile))} bytes"
        msg += f"; within {gap:.3%} of the exact optimum (lower bound {lower:.6g} s)"
    if pols:
        msg += f"; {len(pols)} stages under save policies"
    msg += f"; mode {name}, {_time.perf_counter() - t0:.2f} s"
    return finish_plan(
        profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim,
        message=msg, options=options, policies=pols,
    )


def _plan_banded(profile: Profile, budget_bytes: int, *, max_gap: float, t0: float) -> Plan:
    """Banded mode's Plan (NOTE [ banded DP and its certificate ] in planner/_optimal_long.py):
    bands of BAND_WIDTH stages, doubled until the certified gap is within `max_gap` (at the whole
    chain's length both runs are exact). Times in seconds, sizes in bytes, from a replay."""
    from memplan.planner._optimal_long import schedule_ops_long, solve_long

    c = costs_of(profile)
    L = profile.n_stages
    width = BAND_WIDTH
    best = None  # (time, ops, sim)
    lower = 0.0
    while True:
        lo = lower_bound_banded(c, budget_bytes, width)
        if lo == INF:  # the relaxation fits nothing: no schedule fits (certified)
            return _infeasible(profile, budget_bytes, least_peak(c), {"mode": "banded"})
        lower = max(lower, lo)
        fr = solve_long(c, cap=budget_bytes, width=width)
        peaks, _ = fr.top()
        if peaks:
            ops = insert_drops(schedule_ops_long(fr, peaks[-1]), L)
            sim = replay(profile, ops)
            if best is None or sim.time_s < best[0]:
                best = (sim.time_s, ops, sim)
        gap = gap_of(best[0], lower) if best is not None else INF
        log.info("banded: width %d, gap %.4g, %.2f s", width, gap, _time.perf_counter() - t0)
        if gap <= max_gap or width >= L:
            break
        width = min(2 * width, L)
    _, ops, sim = best
    lower = min(lower, sim.time_s)  # at the whole chain both runs agree up to float rounding
    gap = gap_of(sim.time_s, lower)
    options = {"mode": "banded", "band": width, "lower_bound_s": lower, "optimality_gap": gap}
    msg = (f"banded persistent optimum (segments of at most {width} stages below the suffixes): "
           f"{_recomputed(ops, L)} recomputed forwards; within "
           f"{gap:.3%} of the exact optimum (certified lower bound {lower:.6g} s); mode banded, "
           f"{_time.perf_counter() - t0:.2f} s")
    return finish_plan(profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim,
                       options=options, message=msg)


def check_offload(offload_bandwidth, host_memory_bytes) -> float | None:
    """Validate the offload options (PlanError naming the field); the bandwidth in bytes/s, None
    when nothing may be offloaded (None or 0)."""
    bw = offload_bandwidth
    if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float))
                           or not math.isfinite(bw) or bw < 0):
        raise PlanError(f"offload_bandwidth: expected bytes per second, a finite number >= 0 (25e9 "
                        f"for 25 GB/s; 0 or null: no offload), got {bw!r}")
    h = host_memory_bytes
    if h is not None:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= 2**60:
            raise PlanError(f"host_memory_bytes: expected an integer number of bytes in 0..2^60 "
                            f"(null: unlimited), got {h!r}")
        if bw is None:
            raise PlanError("host_memory_bytes: it bounds what offload moves to the host; give "
                            "offload_bandwidth too (bytes/s), or leave host_memory_bytes out")
    return float(bw) if bw else None


def check_offload_plannable(profile: Profile, mode: str) -> None:
    """Raise PlanError naming the field when the offload DP (planner/_optimal_offload.py) cannot
    plan `profile` in `mode`: modes other than auto and exact, save policies, or more than
    OFFLOAD_MAX_STAGES stages. For plans and frontiers alike."""
    from memplan.planner._optimal_offload import OFFLOAD_MAX_STAGES

    if mode not in ("auto", "exact"):
        raise PlanError(f"mode: offload is planned by the exact DP only; use mode 'auto' or "
                        f"'exact' (got {mode!r}), or leave offload_bandwidth out")
    if profile.has_policies:
        raise PlanError("offload_bandwidth: save policies and offload are not planned together; "
                        "plan the profile without policies (Profile.with_policies(None)) or "
                        "without offload_bandwidth")
    L = profile.n_stages
    if L > OFFLOAD_MAX_STAGES:
        raise PlanError(f"offload_bandwidth: offload is planned for chains of up to "
                        f"{OFFLOAD_MAX_STAGES} stages (the DP with transfers is pure Python), this "
                        f"one has {L}; profile coarser stages (a block per stage) or plan without "
                        f"offload_bandwidth")


def _plan_offload(profile: Profile, budget_bytes, *, max_overhead, mode, checkpoint_dtype,
                  bandwidth: float, host_cap: int | None, t0: float) -> Plan:
    """The optimal plan with offload (planner/_optimal_offload.py): the DP's fastest point within
    the budgets, replayed (seconds, bytes)."""
    from memplan.planner._optimal_offload import offload_ops, solve_offload

    check_offload_plannable(profile, mode)
    if checkpoint_dtype != "compute":
        raise PlanError("offload_bandwidth: offload plans keep activations in their compute dtype; "
                        "use checkpoint_dtype 'compute' or leave offload_bandwidth out")
    L = profile.n_stages
    c = costs_of(profile)
    cap = budget_bytes if max_overhead is None else None
    options: dict = {"mode": "exact", "offload_bandwidth": bandwidth,
                     "host_memory_bytes": host_cap}
    if max_overhead is not None:
        options["max_overhead"] = max_overhead

    def pick(fr):
        top = fr.top()
        if not top:
            return top, None
        if max_overhead is None:
            return top, fr.best(budget_bytes)
        limit = (1.0 + max_overhead) * store_all_time(profile)
        within = [p for p in top if p[2] <= limit * (1 + 1e-12)]
        return top, (min(within, key=lambda p: (p[0], p[2])) if within
                     else min(top, key=lambda p: p[2]))

    # NOTE [ offload in the recurrence ]: the host budget makes the frontiers three-dimensional
    # (much larger); the plan without it is a relaxation, so when its point fits the host budget
    # it is the optimum under it, and the three-dimensional DP runs only when it does not
    fr = solve_offload(c, bandwidth=bandwidth, cap=cap)
    top, point = pick(fr)
    if host_cap is not None and (point is None or point[1] > host_cap):
        fr = solve_offload(c, bandwidth=bandwidth, cap=cap, host_cap=host_cap)
        top, point = pick(fr)
    if not top:
        least_fr = fr if cap is None else solve_offload(c, bandwidth=bandwidth, host_cap=host_cap)
        pts = least_fr.top()
        if not pts:  # only the host budget can make every schedule infeasible
            raise PlanError(f"host_memory_bytes: no schedule fits {host_cap} host bytes; raise it "
                            f"or leave it out")
        return _infeasible(profile, budget_bytes, pts[0][0], options)
    ops = insert_drops(offload_ops(fr, point), L)
    sim = replay(profile, ops, None, None, offload_bandwidth=bandwidth)
    if not sim.valid or (host_cap is not None and sim.host_peak_bytes > host_cap):
        raise AssertionError(f"the offload DP built an invalid schedule: {sim.error}")
    options["lower_bound_s"] = sim.time_s
    options["optimality_gap"] = 0.0
    moved = sum(1 for op in ops if op[0] in ("offload", "offload_record"))
    msg = (f"exact persistent optimum with offload at {bandwidth:.4g} bytes/s: "
           f"{_recomputed(ops, L)} recomputed forwards, {moved} "
           f"tensors moved to the host (host peak {sim.host_peak_bytes} bytes, transfer wait "
           f"{sim.transfer_wait_s:.4g} s); mode exact, {_time.perf_counter() - t0:.2f} s")
    return finish_plan(profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim,
                       message=msg, options=options)


def _recomputed(ops, n_stages: int) -> int:
    """The forwards a schedule runs beyond one per stage (F and R ops): its recomputed forwards,
    the count every optimal plan's message states."""
    return sum(1 for op in ops if op[0] in ("F", "R")) - n_stages


# NOTE [ the least peak's stage ]
# A budget below the least peak gets an infeasible plan that says the least budget. Where one
# stage's own backward is most of that least peak (at least FLOOR_SHARE of it), the message names
# the stage: no placement of records and recomputes goes below what the stage holds while it runs
# its backward, so the budget can only be met by changing the stage itself (a save policy; for a
# language model's head, a fused or chunked cross-entropy such as memplan.lean_loss, which never
# holds the log-softmax and its gradient). A full-vocabulary GPT-2 head is such a stage: 3 x 206 MB
# of log-softmax and gradients at batch 4 x 256 tokens (docs/benchmarks.md, bench_peers at full
# size; docs/apply.md, "A lean loss").
FLOOR_SHARE = 0.9


def _infeasible(profile: Profile, budget_bytes, least: int, options: dict) -> Plan:
    plan = infeasible_plan(
        profile, strategy="optimal", budget_bytes=budget_bytes, least_bytes=least, options=options
    )
    # the shared message ends by suggesting this very strategy; say what helps instead
    msg = plan.message.replace(" or try strategy 'optimal'", "")
    floors = backward_floors(costs_of(profile))
    t = max(range(1, len(floors)), key=floors.__getitem__)
    if least > 0 and floors[t] >= FLOOR_SHARE * least:  # NOTE [ the least peak's stage ]
        lean = (profile.meta or {}).get("loss") == "lean"  # the head computes the lean loss already
        msg += (f"; stage {t} ({profile.layers[t - 1].name!r}) alone holds {floors[t]} bytes in "
                "its backward (its input, record, gradients and transients), which no placement "
                "of recomputes lowers: lower it inside that stage (a save policy"
                + ("" if lean else "; for a loss head, a fused or chunked cross-entropy: "
                   "memplan.lean_loss(model)") + ")")
    return plan.model_copy(update={"message": msg})


def _plan_with_storage(profile: Profile, budget_bytes, *, max_overhead, exact_max_stages, groups,
                       checkpoint_dtype: str, tolerance) -> Plan:
    """The fastest frontier schedule whose peak, with its kept activations stored as
    `choose_storage` decides, fits the budget (NOTE [ Storage precision of checkpoints ]).

    Storage lowers the peak of a schedule that keeps activations, so schedules faster than the
    compute-dtype optimum may fit: walk the uncapped frontier from the fastest point down to the
    fastest one that fits as computed, and take the first that fits once stored."""
    from memplan.planner.checkpoint_dtype import apply_storage, choose_storage, storage_options

    base = plan_optimal(profile, budget_bytes, max_overhead=max_overhead,
                        exact_max_stages=exact_max_stages, groups=groups)
    if budget_bytes is None or max_overhead is not None:
        # no budget to meet (or the least memory within an overhead): store to lower the peak
        out = apply_storage(base, profile, checkpoint_dtype=checkpoint_dtype, tolerance=tolerance)
        return out
    L = profile.n_stages
    fr, bounds = solve_frontier(profile, exact_max_stages=exact_max_stages, groups=groups)
    peaks, times = fr.top()
    limit = base.predicted.time_s if base.feasible and base.predicted else math.inf
    for k in range(len(peaks) - 1, -1, -1):
        if times[k] >= limit * (1 - 1e-12):
            break  # no faster than what fits as computed
        if peaks[k] <= budget_bytes:
            continue
        ops = _ops_for(fr, bounds, peaks[k], L)
        choice = choose_storage(profile, ops, checkpoint_dtype=checkpoint_dtype, tolerance=tolerance)
        if choice.peak_bytes > budget_bytes:
            continue
        sim = replay(profile, ops, choice.storage)
        options = {"mode": "exact" if bounds is None else "grouped",
                   **storage_options(checkpoint_dtype, choice)}
        if bounds is not None:
            options["groups"] = [[p, q] for p, q in bounds]
        plan = finish_plan(
            profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim, options=options,
            message=(f"persistent optimum with stored checkpoints: "
                     f"{_recomputed(ops, L)} recomputed forwards; "
                     + choice.message),
        )
        return plan.model_copy(update={"checkpoint_dtypes": dict(choice.storage)})
    # nothing faster fits once stored: the compute-dtype optimum, stored as computed (it fits, or
    # no schedule does)
    none = choose_storage(profile, [], checkpoint_dtype="compute", tolerance=tolerance)
    note = "no faster schedule fits with stored checkpoints; stored as computed"
    return base.model_copy(update={
        "options": {**base.options, **storage_options(checkpoint_dtype, none)},
        "message": "; ".join(m for m in (base.message, note) if m),
    })


# NOTE [ when slotted mode runs ] only when asked (mode="slotted"): since the exact DP is compiled
# (planner/_optimal_kernel.py) it is faster than a pair of slotted runs at every length "auto"
# solves exactly (docs/planner.md), and exact needs no bound. Slotted stays for its certificate
# (a lower bound, from the same tables) and as rotor's formulation, measured beside ours.
TIME_CAP_S = 4.0  # refinement stops before a doubling would pass this many seconds


def check_mode(mode, slots, max_gap) -> None:
    """Validate the mode options (PlanError naming the field)."""
    if mode not in MODES:
        raise PlanError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(slots, bool) or not isinstance(slots, int) or not 8 <= slots <= 100_000:
        raise PlanError(f"slots: expected an integer from 8 to 100000 (500 is rotor's), got {slots!r}")
    if isinstance(max_gap, bool) or not isinstance(max_gap, (int, float)) or not (
        max_gap == max_gap and 0 <= max_gap < float("inf")
    ):
        raise PlanError(f"max_gap: expected a finite fraction >= 0 (0.01 for 1%), got {max_gap!r}")


def use_slotted(mode, budget_bytes, max_overhead, checkpoint_dtype) -> bool:
    """Whether `plan_optimal` runs the slotted mode: when asked (NOTE [ when slotted mode runs ]);
    it needs a budget, since slots are its fractions."""
    if mode == "slotted":
        if budget_bytes is None or max_overhead is not None:
            raise PlanError("mode: 'slotted' needs budget_bytes and no max_overhead (the slots are "
                            "fractions of the budget); use mode='auto' for the other questions")
        if checkpoint_dtype != "compute":
            raise PlanError("mode: 'slotted' plans compute-dtype checkpoints only; use mode='auto' "
                            "with checkpoint_dtype")
        return True
    return False


def plan_slotted(profile, budget_bytes: int, *, slots: int = 500, max_gap: float = 0.01):
    """The slotted mode's Plan: the UP run's schedule, replayed (its time and peak), with
    `options` mode/slots/lower_bound_s/optimality_gap (NOTE [ slotted mode and its bound ])."""
    c = costs_of(profile)
    L = profile.n_stages
    r = (refine(c, budget_bytes, slots=slots, tolerance=max_gap, time_cap_s=TIME_CAP_S)
         if budget_bytes > 0 else Refined(None, INF, INF, slots, 0.0))
    if r.ops is None:
        least = least_peak(c)
        if least > budget_bytes:  # the relaxation agrees (or was skipped): nothing fits
            return _infeasible(profile, budget_bytes, least, {"mode": "slotted", "slots": r.slots})
        # rounding up lost a budget close to the least peak: the exact DP capped at the budget
        # keeps only points below it, so it is fast there
        ops = insert_drops(schedule_ops(solve(c, cap=budget_bytes), budget_bytes), L)
        sim = replay(profile, ops)
        return finish_plan(profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim,
                           options={"mode": "exact", "lower_bound_s": sim.time_s,
                                    "optimality_gap": 0.0},
                           message="exact persistent optimum (the budget is too close to the "
                                   "least peak for slots)")
    ops = insert_drops(r.ops, L)
    sim = replay(profile, ops)
    if not sim.valid or sim.peak_bytes > budget_bytes:  # NOTE [ slotted mode ]: cannot happen
        raise AssertionError(f"slotted schedule breaks the budget: {sim.error or sim.peak_bytes}")
    gap = gap_of(sim.time_s, r.lower_s)
    options = {"mode": "slotted", "slots": r.slots, "lower_bound_s": r.lower_s,
               "optimality_gap": gap}
    msg = (f"slotted persistent optimum ({r.slots} slots): "
           f"{_recomputed(ops, L)} recomputed forwards; within "
           f"{gap:.3%} of the exact optimum (certified lower bound {r.lower_s:.6g} s)")
    return finish_plan(profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim,
                       options=options, message=msg)
