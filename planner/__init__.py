"""memplan's planner: checkpoint schedules for a profile and a memory budget. No torch here.

    >>> import planner
    >>> plan = planner.plan(profile, budget_bytes=2 << 30, strategy="uniform")
    >>> plan.feasible, plan.predicted.peak_bytes, plan.predicted.overhead

Every prediction comes from `memplan.planner.simulate.simulate`, the replay of a schedule under
docs/chain-model.md.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from memplan.planner.request import FrontierRequest, PlanRequest
from memplan.planner.schema import Plan, PlanError, Predicted
from memplan.planner.simulate import Simulation, simulate
from memplan.profiler.schema import Profile, ProfileError, load_profile

__all__ = [
    "plan",
    "plan_for",
    "PlanRequest",
    "FrontierRequest",
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
    "store-all": "memplan.planner.store_all:plan_store_all",
    "uniform": "memplan.planner.uniform:plan_uniform",
    "sqrt": "memplan.planner.sqrt:plan_sqrt",
    "heuristic": "memplan.planner.heuristic:plan_heuristic",
    "optimal": "memplan.planner.optimal:plan_optimal",
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
    n_gpus: int = 1,
    zero_stage: int = 0,
    precision: str | None = None,
    memory_bytes: int | None = None,
    checkpoint_dtype: str = "compute",
    tolerance: float | None = None,
    **options: Any,
) -> Plan:
    """A checkpoint plan for `profile` (a Profile, dict or JSON text) whose activation peak
    (bytes above `fixed_bytes`) is at most `budget_bytes` (None: no limit).

    Returns a `Plan` whose `predicted` block (seconds, bytes) is a replay of its schedule. A budget
    that the strategy cannot meet gives `feasible=False` and a message with the least budget it
    can; invalid input raises `PlanError` (or `ProfileError`) naming the field.

    Data parallel over `n_gpus` GPUs at ZeRO `zero_stage` (0-3), or with the model states priced
    by a `precision` policy: the profile's fixed bytes become the per-GPU bytes of
    `memplan.planner.sharding.shard_profile`, so `predicted.total_peak_bytes` is what each GPU holds.
    `memory_bytes` (per GPU) instead of `budget_bytes`: the budget is that minus the fixed bytes.

    `checkpoint_dtype` (compute, auto, or a dtype) and `tolerance` choose how kept activations are
    stored (planner/checkpoint_dtype.py): a strategy that takes them (optimal) chooses within its
    search; the others' schedules get the storage applied afterwards.
    """
    from memplan.planner.request import plan_request

    request = plan_request(
        profile=load_profile(profile), budget_bytes=budget_bytes, memory_bytes=memory_bytes,
        strategy=strategy, options=options, checkpoint_dtype=checkpoint_dtype,
        tolerance=tolerance, precision=precision, n_gpus=n_gpus, zero_stage=zero_stage,
    )
    return plan_for(request)


def plan_for(request: PlanRequest) -> Plan:
    """The `Plan` for a validated `PlanRequest` (planner/request.py): what `plan` returns for the
    same fields. Raises `PlanError` only for what depends on the profile's contents (a precision
    policy it was not made under, a parameter count sharding needs)."""
    prof = request.profile
    budget_bytes, memory_bytes = request.budget_bytes, request.memory_bytes
    strategy, precision = request.strategy, request.precision
    n_gpus, zero_stage = request.n_gpus, request.zero_stage
    checkpoint_dtype, tolerance = request.checkpoint_dtype, request.tolerance
    options = request.option_kwargs()
    sharded = n_gpus != 1 or zero_stage != 0 or precision is not None
    if precision is not None:  # a profile made under another policy is refused
        from memplan.planner.precision import check_profile_policy

        check_profile_policy(prof, precision)
    if sharded:
        from memplan.planner.sharding import shard_profile

        prof = shard_profile(prof, n_gpus=n_gpus, zero_stage=zero_stage, policy=precision)
    if memory_bytes is not None:
        if memory_bytes < prof.fixed_bytes:  # infeasible, not bad input
            from memplan.planner.sharding import over_memory_plan

            return over_memory_plan(prof, memory_bytes, strategy=strategy, options={
                "n_gpus": n_gpus, "zero_stage": zero_stage, "precision": precision,
                "fixed_bytes_per_gpu": prof.fixed_bytes})
        budget_bytes = memory_bytes - prof.fixed_bytes
    fn = _strategy(strategy)
    accepted = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    from memplan.planner.checkpoint_dtype import apply_storage, parse_checkpoint_dtype

    stored = parse_checkpoint_dtype(checkpoint_dtype) != "compute"
    if stored and "checkpoint_dtype" in accepted:  # the strategy chooses storage in its search
        options.update(checkpoint_dtype=checkpoint_dtype, tolerance=tolerance)
        stored = False
    out = fn(prof, budget_bytes, **options)
    if stored:
        out = apply_storage(out, prof, checkpoint_dtype=checkpoint_dtype, tolerance=tolerance)
    if sharded:
        shard = prof.meta["sharding"]
        out = out.model_copy(update={"options": {**out.options, "n_gpus": n_gpus,
                                                 "zero_stage": zero_stage,
                                                 "precision": shard["policy"],
                                                 "fixed_bytes_per_gpu": prof.fixed_bytes}})
    return out


from memplan.planner.frontier import frontier  # noqa: E402  (needs plan and STRATEGIES above)
