"""Sizing queries refuse inputs whose results leave floating point, naming the field."""

from __future__ import annotations

import memplan.planner.scaling as scaling
import pytest


@pytest.mark.parametrize(("fn", "field", "value"), [
    ("compute_optimal", "flops", 5e-324),
    ("optimal_for_params", "params", 1e300),
    ("optimal_for_params", "params", 1e-300),
])
def test_extreme_inputs_are_refused_not_divided_by_zero(fn, field, value):
    with pytest.raises(scaling.ScalingError, match=f"{field}: .* too small or too large"):
        getattr(scaling, fn)(value)
