"""memplan's profiler: per-stage costs of a model (the profile).

Only the schema is imported eagerly; the measuring code imports torch and is loaded on first use
(`memplan.profiler.profile_chain`, `memplan.profiler.analytic`), so that `import profiler` stays light for the
planner and the service.
"""

from __future__ import annotations

from typing import Any

from memplan.profiler.schema import (
    SCHEMA_VERSION,
    LayerProfile,
    Profile,
    ProfileError,
    load_profile,
)

__all__ = [
    "SCHEMA_VERSION",
    "LayerProfile",
    "Profile",
    "ProfileError",
    "load_profile",
    "profile_chain",
    "gpt_analytic_profile",
    "conv_analytic_profile",
]

_LAZY = {
    "profile_chain": "memplan.profiler.measure",
    "gpt_analytic_profile": "memplan.profiler.analytic",
    "conv_analytic_profile": "memplan.profiler.analytic",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
