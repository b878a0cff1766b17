"""Uniform checkpointing: keep every k-th stage's input and recompute the segments between them."""

from __future__ import annotations

from memplan.planner._build import finish_plan, infeasible_plan, one_level_ops
from memplan.planner.schema import Plan, PlanError
from memplan.planner.simulate import Simulation, replay
from memplan.profiler.schema import Profile

__all__ = ["plan_uniform", "uniform_segments"]


def uniform_segments(n_stages: int, k: int) -> list[tuple[int, int, bool]]:
    """Segments of k stages; all but the last are recomputed (the last is recorded directly, as
    torch's `checkpoint_sequential` does, since its backward comes first)."""
    bounds = [(p, min(p + k - 1, n_stages)) for p in range(1, n_stages + 1, k)]
    return [(p, q, n < len(bounds) - 1) for n, (p, q) in enumerate(bounds)]


def plan_uniform(profile: Profile, budget_bytes: int | None = None, *, k: int | None = None) -> Plan:
    """Every-k checkpointing; returns a `Plan`. With `k` given, that k. Otherwise, with no budget
    or a budget that store-all's peak meets, k = L: every stage kept, nothing recomputed (NOTE
    [ Uniform without a need to save ]); else the fastest k whose peak fits the budget (ties: the
    smaller peak), or an infeasible plan naming the least peak (bytes) any k reaches.

    NOTE [ Uniform without a need to save ]
    k = L is one segment, recorded directly (the last segment is never recomputed), so its
    schedule is store-all's: the fastest there is. Recomputing buys memory only, so a strategy
    asked for no memory, or for no less memory than store-all needs, keeps everything; only an
    explicit `k` makes it recompute then."""
    L = profile.n_stages
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= L:
            raise PlanError(f"k: the segment length must be an integer in 1..{L}, got {k!r}")
        ops = one_level_ops(uniform_segments(L, k), L)
        return finish_plan(
            profile, ops, strategy="uniform", budget_bytes=budget_bytes,
            message=f"a checkpoint every {k} stages", options={"k": k},
        )
    keep_all = one_level_ops(uniform_segments(L, L), L)
    sim_all = replay(profile, keep_all)
    if budget_bytes is None or sim_all.peak_bytes <= budget_bytes:
        return finish_plan(
            profile, keep_all, strategy="uniform", budget_bytes=budget_bytes, sim=sim_all,
            message=f"every stage kept (k = {L}): "
            + ("no budget" if budget_bytes is None else "store-all fits the budget"),
            options={"k": L},
        )
    best: tuple[tuple[float, int], int, list, Simulation] | None = None
    least: tuple[int, int, list, Simulation] | None = None
    for kk in range(1, L + 1):
        ops = one_level_ops(uniform_segments(L, kk), L)
        sim = replay(profile, ops)
        if least is None or sim.peak_bytes < least[0]:
            least = (sim.peak_bytes, kk, ops, sim)
        if sim.peak_bytes <= budget_bytes:
            key = (sim.time_s, sim.peak_bytes)
            if best is None or key < best[0]:
                best = (key, kk, ops, sim)
    assert least is not None
    if best is None:
        return infeasible_plan(profile, strategy="uniform", budget_bytes=budget_bytes,
                               least_bytes=least[0])
    _, kk, ops, sim = best
    return finish_plan(
        profile, ops, strategy="uniform", budget_bytes=budget_bytes, sim=sim,
        message=f"a checkpoint every {kk} stages", options={"k": kk},
    )
