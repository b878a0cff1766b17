"""memplan's executor: run a plan's schedule on real stages, measure it, and prove it.

    >>> from executor import run_plan
    >>> report = run_plan(stages, example_input, plan, profile=profile, steps=3)
    >>> report.status, report.peak_error_pct, report.grad_max_rel_diff

Imports torch lazily: `import executor` stays light (the report schema needs only pydantic).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["run_plan", "check_plan", "RunReport", "ExecutorError", "ScheduleRunner", "is_recomputing"]

_LAZY = {
    "run_plan": "memplan.executor.run",
    "check_plan": "memplan.executor.run",
    "ScheduleRunner": "memplan.executor.runner",
    "is_recomputing": "memplan.executor.guards",
    "RunReport": "memplan.executor.report",
    "ExecutorError": "memplan.executor.report",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
