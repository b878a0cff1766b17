"""The one error type of sizing, and the checks that raise it at the boundary."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ScalingError", "InfeasibleSizing", "check_positive", "check_fraction"]


class ScalingError(ValueError):
    """Invalid sizing input (a law, a query, runs to fit); the message names the field and the fix."""


class InfeasibleSizing(ScalingError):
    """Valid input that no model meets (not even one layer fits the memory): the CLI's exit code
    1, as for an infeasible plan, where bad input is 2."""


def check_positive(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """`value` as a finite float > 0 (or >= 0); otherwise `ScalingError` naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy scalars, numeric strings from a CLI
        except (TypeError, ValueError):
            raise ScalingError(f"{name}: expected a number, got {value!r}") from None
    value = float(value)
    if math.isnan(value):
        raise ScalingError(f"{name}: is NaN; give a finite number")
    if math.isinf(value):
        raise ScalingError(f"{name}: is infinite; give a finite number")
    if value < 0 or (value == 0 and not allow_zero):
        bound = "at least 0" if allow_zero else "greater than 0"
        raise ScalingError(f"{name}: must be {bound}, got {value:g}")
    return value


def check_fraction(name: str, value: Any) -> float:
    """`value` as a float in (0, 1]; otherwise `ScalingError` naming `name`."""
    v = check_positive(name, value)
    if v > 1:
        raise ScalingError(f"{name}: must be a fraction in (0, 1], got {v:g} (write 40% as 0.4)")
    return v
