"""memplan: measure, plan, prove and size activation checkpointing.

    >>> import memplan
    >>> prof = memplan.profile_chain(stages, x)              # measure (torch), or load a JSON profile
    >>> plan = memplan.plan(prof, budget_bytes=6 << 30)      # the least recompute that fits
    >>> memplan.simulate(prof, plan.schedule).peak_bytes     # replay any schedule
    >>> memplan.frontier(prof).points                        # the memory-time trade-off
    >>> memplan.run_plan(stages, x, plan, prof)              # prove it: measured against predicted
    >>> memplan.size(compute_flops=5.76e23, law="epoch")       # compute-optimal sizing
    >>> memplan.auto_checkpoint(model, batch, budget="2GiB")  # profile, plan, install in place
    >>> memplan.lean_loss(model)                              # a head that never holds the log-softmax

The line's packages live under this one import root: `memplan.profiler`, `memplan.planner`,
`memplan.executor`, `memplan.service`, `memplan.cli`. `import memplan` loads none of them (no torch):
each verb imports its package on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# verb -> (module, attribute), imported on first use
_LAZY: dict[str, tuple[str, str]] = {
    "plan": ("memplan.planner", "plan"),
    "frontier": ("memplan.planner", "frontier"),
    "simulate": ("memplan.planner", "simulate"),
    "load_profile": ("memplan.profiler.schema", "load_profile"),
    "profile_chain": ("memplan.profiler.measure", "profile_chain"),
    "run_plan": ("memplan.executor.run", "run_plan"),
    "size": ("memplan.planner.scaling.size", "size"),
    "auto_checkpoint": ("memplan.executor.apply", "auto_checkpoint"),
    "install_plan": ("memplan.executor.apply", "install_plan"),
    "remove_checkpoint": ("memplan.executor.apply", "remove_checkpoint"),
    "measure_step": ("memplan.executor.apply", "measure_step"),
    "profile_model": ("memplan.executor.apply", "profile_model"),
    "lean_loss": ("memplan.executor.lean_loss", "lean_loss"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'memplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
