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

__all__ = ["plan_heuristic", "heuristic_plans", "heuristic_order"]

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


class _Tries:
    """The schedule and replay of recomputing the top m stages of `order`, each m built once
    (the frontier asks for several budgets, whose bisections visit many of the same m)."""

    def __init__(self, profile: Profile, order: list[int]):
        self.profile, self.order = profile, order
        self._done: dict[int, tuple[list[Op], Simulation]] = {}

    def __call__(self, m: int) -> tuple[list[Op], Simulation]:
        if m not in self._done:
            L = self.profile.n_stages
            ops = one_level_ops(_segments(set(self.order[:m]), L), L)
            self._done[m] = (ops, replay(self.profile, ops))
        return self._done[m]


def plan_heuristic(profile: Profile, budget_bytes: int | None = None) -> Plan:
    """Recompute the fewest top-ranked stages that fit; no budget: recompute none (store-all)."""
    return heuristic_plans(profile, [budget_bytes])[0]


def heuristic_plans(profile: Profile, budgets: list[int | None]) -> list[Plan]:
    """`plan_heuristic` at each of `budgets` (bytes; None: no budget), in their order, each
    schedule built and replayed once for all of them."""
    tries = _Tries(profile, heuristic_order(profile))
    return [_plan_at(tries, budget) for budget in budgets]


def _plan_at(tries: _Tries, budget_bytes: int | None) -> Plan:
    profile, order = tries.profile, tries.order
    L = profile.n_stages
    if budget_bytes is None:
        ops, sim = tries(0)
        return finish_plan(profile, ops, strategy="heuristic", budget_bytes=None, sim=sim)
    found: tuple[int, list[Op], Simulation] | None = None
    least = None
    if L <= _LINEAR_SCAN_MAX:
        for m in range(len(order) + 1):
            ops, sim = tries(m)
            least = sim.peak_bytes if least is None else min(least, sim.peak_bytes)
            if sim.peak_bytes <= budget_bytes:
                found = (m, ops, sim)
                break
    else:  # the peak falls roughly monotonically with m: bisect, then check
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            if tries(mid)[1].peak_bytes <= budget_bytes:
                hi = mid
            else:
                lo = mid + 1
        ops, sim = tries(lo)
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
