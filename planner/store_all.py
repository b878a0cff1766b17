"""Store everything: record every stage in the forward, recompute nothing (the fastest schedule)."""

from __future__ import annotations

from memplan.planner._build import finish_plan, one_level_ops
from memplan.planner.schema import Plan
from memplan.profiler.schema import Profile

__all__ = ["plan_store_all"]


def plan_store_all(profile: Profile, budget_bytes: int | None = None) -> Plan:
    """`R 1..L, loss, B L..1` with drops: time sum f + sum b. Infeasible when its peak is over."""
    ops = one_level_ops([(1, profile.n_stages, False)], profile.n_stages)
    return finish_plan(profile, ops, strategy="store-all", budget_bytes=budget_bytes)
