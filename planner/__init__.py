"""memplan's planner: checkpoint schedules for a profile and a memory budget. No torch here.

    >>> import planner
    >>> plan = planner.plan(profile, budget_bytes=2 << 30, strategy="uniform")
    >>> plan.feasible, plan.predicted.peak_bytes, plan.predicted.overhead

Every prediction comes from `planner.simulate.simulate`, the replay of a schedule under
../shared/docs/chain-model.md.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from planner.schema import Plan, PlanError, Predicted
from planner.simulate import Simulation, simulate
from profiler.schema import Profile, ProfileError, load_profile

__all__ = [
    "plan",
    "simulate",
    "STRATEGIES",
    "Plan",
    "Predicted",
    "PlanError",
    "ProfileError",
    "Simulation",
    "frontier",
]

# name -> "module:function"; each function is `(profile, budget_bytes, **options) -> Plan`.
STRATEGIES: dict[str, str] = {
    "store-all": "planner.store_all:plan_store_all",
    "uniform": "planner.uniform:plan_uniform",
    "sqrt": "planner.sqrt:plan_sqrt",
    "heuristic": "planner.heuristic:plan_heuristic",
    "optimal": "planner.optimal:plan_optimal",
}


def _strategy(name: str) -> Callable[..., Plan]:
    if name not in STRATEGIES:
        raise PlanError(f"strategy: unknown {name!r}; choose one of {', '.join(STRATEGIES)}")
    module, func = STRATEGIES[name].split(":")
    return getattr(importlib.import_module(module), func)


def plan(
    profile: Profile | dict | str,
    *,
    budget_bytes: int | None = None,
    strategy: str = "optimal",
    **options: Any,
) -> Plan:
    """A checkpoint plan for `profile` (a Profile, dict or JSON text) whose activation peak
    (bytes above `fixed_bytes`) is at most `budget_bytes` (None: no limit).

    Returns a `Plan` whose `predicted` block (seconds, bytes) is a replay of its schedule. A budget
    that the strategy cannot meet gives `feasible=False` and a message with the least budget it
    can; invalid input raises `PlanError` (or `ProfileError`) naming the field.
    """
    from planner._build import check_budget

    prof = load_profile(profile)
    fn = _strategy(strategy)
    accepted = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    for key in options:
        if key not in accepted:
            raise PlanError(
                f"{key}: strategy {strategy!r} takes no such option"
                + (f"; it takes {', '.join(accepted)}" if accepted else "; it takes none")
            )
    return fn(prof, check_budget(budget_bytes), **options)


from planner.frontier import frontier  # noqa: E402  (needs plan and STRATEGIES above)
