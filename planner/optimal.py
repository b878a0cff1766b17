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
"""

from __future__ import annotations

import logging
import math

from memplan.planner._build import finish_plan, infeasible_plan, insert_drops
from memplan.planner._optimal_dp import costs_of, expand_ops, group_costs, schedule_ops
from memplan.planner.schema import Plan, PlanError
from memplan.planner.simulate import _replay, store_all_time
from memplan.profiler.schema import Profile

__all__ = ["plan_optimal", "solve_frontier", "EXACT_MAX_STAGES", "EXACT_MAX_STAGES_UNCAPPED",
           "DEFAULT_GROUPS", "MODES"]

log = logging.getLogger(__name__)

EXACT_MAX_STAGES = 200  # above this, group stages (exact, windowed: 0.4-1.2 s at 200 on two cores)
# without a budget (max_overhead, the fastest plan, the frontier) nothing caps the frontiers, which
# are then several times larger: exact takes 1-1.5 s at 100 stages and ~10 s at 200
EXACT_MAX_STAGES_UNCAPPED = 120
DEFAULT_GROUPS = 150  # macro stages in grouped mode (1-4 s at 1,000 stages)
MODES = ("auto", "exact", "slotted", "grouped")  # NOTE [ slotted mode and its bound ] for slotted


def solve(c, *, cap: int | None = None, windowed: bool = False):
    """The compiled DP's frontiers (planner/_optimal_kernel.py; `windowed`: NOTE [ windows ]
    there). Imported on first use: numba's import is most of `import planner`'s time, and
    baselines and the simulator never need it."""
    from memplan.planner._optimal_kernel import solve_compiled

    return solve_compiled(c, cap=cap, windowed=windowed)


def least_peak(c) -> int:
    """The least peak (bytes) of any schedule of the recurrence, compiled (see `solve`)."""
    from memplan.planner._optimal_kernel import least_peak_compiled

    return least_peak_compiled(c)


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
) -> tuple[object, list[tuple[int, int]] | None]:
    """The DP's frontiers for `profile` (points above `cap_bytes` dropped; `top()` and `choice()`
    as in `_optimal_dp.Frontiers`; `windowed`: only what a plan within `cap_bytes` needs, and
    `top()` is its one point) and the stage groups used (None: exact, one per macro stage)."""
    c = costs_of(profile)
    L = profile.n_stages
    bounds = None
    if exact_max_stages is None:
        exact_max_stages = EXACT_MAX_STAGES if cap_bytes is not None else EXACT_MAX_STAGES_UNCAPPED
    if L > exact_max_stages:
        bounds = _groups(L, groups)
        c = group_costs(c, bounds)
        log.info("optimal: %d stages > exact_max_stages=%d; solving over %d groups",
                 L, exact_max_stages, len(bounds))
    return solve(c, cap=cap_bytes, windowed=windowed), bounds


def _ops_for(fr, bounds, peak: int, n_stages: int):
    ops = schedule_ops(fr, peak)
    if bounds is not None:
        ops = expand_ops(ops, bounds)
    return insert_drops(ops, n_stages)


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

    `mode`: "auto" (exact up to `exact_max_stages` stages, grouped above), "exact", "grouped" or
    "slotted" (rotor's formulation: memory in `slots` slots, refined while the certified
    `optimality_gap` exceeds `max_gap`, NOTE [ slotted mode and its bound ])."""
    _check_options(max_overhead, exact_max_stages, groups)
    from memplan.planner._optimal_slotted import check_mode, plan_slotted, use_slotted

    check_mode(mode, slots, max_gap)
    if use_slotted(mode, budget_bytes, max_overhead, checkpoint_dtype):
        return plan_slotted(profile, budget_bytes, slots=slots, max_gap=max_gap)
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
    fr, bounds = solve_frontier(
        profile, cap_bytes=cap, exact_max_stages=exact_max_stages, groups=groups,
        windowed=cap is not None,  # one point is wanted: the fastest within the budget
    )
    peaks, times = fr.top()
    options: dict = {"mode": "exact" if bounds is None else "grouped"}
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
            ops = _ops_for(fr, bounds, peaks[k], L)
            sim = _replay(profile, ops)
            if sim.peak_bytes > budget_bytes:
                return finish_plan(
                    profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim,
                    options=options,
                    message=f"the least memory within +{max_overhead:.1%} time is {sim.peak_bytes} bytes",
                )
    elif budget_bytes is None:
        k = len(peaks) - 1
    else:
        k = len(peaks) - 1  # the cap already dropped the points above the budget
    ops = _ops_for(fr, bounds, peaks[k], L)
    sim = _replay(profile, ops)
    msg = (
        f"{'exact' if bounds is None else f'grouped ({len(bounds)} groups)'} persistent optimum: "
        f"{sum(1 for op in ops if op[0] in ('F', 'R')) - L} recomputed forwards"
    )
    if bounds is not None:
        msg += "; stages are grouped (cuts inside a group are not searched)"
        if L <= 200:  # the exact least peak is O(L^3) scalar work: affordable up to ~200 stages
            msg += f"; the exact least peak is {least_peak(costs_of(profile))} bytes"
    return finish_plan(
        profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim,
        message=msg, options=options,
    )


def _infeasible(profile: Profile, budget_bytes, least: int, options: dict) -> Plan:
    plan = infeasible_plan(
        profile, strategy="optimal", budget_bytes=budget_bytes, least_bytes=least, options=options
    )
    # the shared message ends by suggesting this very strategy; say what helps instead
    msg = plan.message.replace(" or try strategy 'optimal'", "")
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
        sim = _replay(profile, ops, choice.storage)
        options = {"mode": "exact" if bounds is None else "grouped",
                   **storage_options(checkpoint_dtype, choice)}
        if bounds is not None:
            options["groups"] = [[p, q] for p, q in bounds]
        plan = finish_plan(
            profile, ops, strategy="optimal", budget_bytes=budget_bytes, sim=sim, options=options,
            message=(f"persistent optimum with stored checkpoints: "
                     f"{sum(1 for op in ops if op[0] in ('F', 'R')) - L} recomputed forwards; "
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
