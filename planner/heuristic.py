"""The seed's manual heuristic, automated: recompute the memory-intensive, cheap stages first.

Stages are ranked by the bytes that recomputing them frees (saved plus output bytes) per second of
forward; the top m are recomputed (consecutive ones as one segment), the rest recorded once. m is
the smallest count whose peak fits the budget.

The last stage (the head and its loss) is never a candidate: its backward follows its forward at
once, so its records are held either way and recomputing it only adds time; and a model's own
forward cannot run its loss twice, so such a plan could not be installed (executor/apply.py).
"""

from __future__ import annotations

from memplan.planner._build import finish_plan, infeasible_plan, one_level_ops
from memplan.planner.schema import Op, Plan
from memplan.planner.simulate import Simulation, replay
from memplan.profiler.schema import Profile

__all__ = ["plan_heuristic", "heuristic_order"]

_LINEAR_SCAN_MAX = 256  # above this many stages, bisect on m instead of scanning every count


def heuristic_order(profile: Profile) -> list[int]:
    """Stages 1..L-1 (1-based; never the last, see the module's docstring) by descending
    (saved + output bytes) per forward second; ties by index."""
    def score(i: int) -> float:
        layer = profile.layers[i - 1]
        return (layer.saved_bytes + layer.output_bytes) / max(layer.forward_s, 1e-12)

    return sorted(range(1, profile.n_stages), key=lambda i: (-score(i), i))


def _segments(recompute: set[int], n_stages: int) -> list[tuple[int, int, bool]]:
    segs: list[tuple[int, int, bool]] = []
    p = 1
    for i in range(2, n_stages + 2):
        if i == n_stages + 1 or (i in recompute) != (p in recompute):
            segs.append((p, i - 1, p in recompute))
            p = i
    return segs


def _try(profile: Profile, order: list[int], m: int) -> tuple[list[Op], Simulation]:
    ops = one_level_ops(_segments(set(order[:m]), profile.n_stages), profile.n_stages)
    return ops, replay(profile, ops)


def plan_heuristic(profile: Profile, budget_bytes: int | None = None) -> Plan:
    """Recompute the fewest top-ranked stages that fit; no budget: recompute none (store-all)."""
    order = heuristic_order(profile)
    L = profile.n_stages
    if budget_bytes is None:
        ops, sim = _try(profile, order, 0)
        return finish_plan(profile, ops, strategy="heuristic", budget_bytes=None, sim=sim)
    found: tuple[int, list[Op], Simulation] | None = None
    least = None
    if L <= _LINEAR_SCAN_MAX:
        for m in range(len(order) + 1):
            ops, sim = _try(profile, order, m)
            least = sim.peak_bytes if least is None else min(least, sim.peak_bytes)
            if sim.peak_bytes <= budget_bytes:
                found = (m, ops, sim)
                break
    else:  # the peak falls roughly monotonically with m: bisect, then check
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            if _try(profile, order, mid)[1].peak_bytes <= budget_bytes:
                hi = mid
            else:
                lo = mid + 1
        ops, sim = _try(profile, order, lo)
        least = sim.peak_bytes
        if sim.peak_bytes <= budget_bytes:
            found = (lo, ops, sim)
    if found is None:
        return infeasible_plan(profile, strategy="heuristic", budget_bytes=budget_bytes,
                               least_bytes=int(least or 0))
    m, ops, sim = found
    return finish_plan(
        profile, ops, strategy="heuristic", budget_bytes=budget_bytes, sim=sim,
        message=f"recomputes the {m} most memory-intensive stages per forward second",
        options={"recomputed": sorted(order[:m])},
    )
