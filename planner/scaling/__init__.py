"""Compute-optimal sizing: scaling laws by name, sizing queries, fits to a user's runs, and sizing
that knows the memory plan. numpy and scipy only (scipy loaded on first use); no torch.

    >>> from planner import scaling
    >>> s = scaling.compute_optimal(5.76e23, law="epoch")
    >>> s.params, s.tokens, s.loss, s.tokens_per_param
    >>> fit = scaling.fit_law("runs.csv", bootstrap=1000, flops=[1e22])

Laws and their sources: planner/scaling/laws.py; the fit: planner/scaling/fit.py; docs/sizing.md.
"""

from memplan.planner.scaling.data_constrained import (
    R_D_STAR,
    R_N_STAR,
    DataConstrainedSizing,
    data_constrained_loss,
    data_constrained_optimal,
)
from memplan.planner.scaling.errors import ScalingError
from memplan.planner.scaling.fit import FitPrediction, FitResult, fit_law
from memplan.planner.scaling.inference import InferenceSizing, inference_aware
from memplan.planner.scaling.laws import DEFAULT_LAW, LAWS, Law, get_law, parametric_law
from memplan.planner.scaling.memory_aware import MemorySizing, memory_aware_size
from memplan.planner.scaling.queries import (
    Sizing,
    cheapest_for_loss,
    compute_optimal,
    optimal_for_params,
    optimal_loss,
)
from memplan.planner.scaling.runs import Runs, load_runs
from memplan.planner.scaling.shapes import GPTShape, gpt_shape, shape_for_layers
from memplan.planner.scaling.size import size

__all__ = [
    "size",
    "DEFAULT_LAW",
    "LAWS",
    "Law",
    "get_law",
    "parametric_law",
    "Sizing",
    "compute_optimal",
    "optimal_for_params",
    "optimal_loss",
    "cheapest_for_loss",
    "InferenceSizing",
    "inference_aware",
    "R_D_STAR",
    "R_N_STAR",
    "DataConstrainedSizing",
    "data_constrained_loss",
    "data_constrained_optimal",
    "Runs",
    "load_runs",
    "FitResult",
    "FitPrediction",
    "fit_law",
    "MemorySizing",
    "memory_aware_size",
    "GPTShape",
    "gpt_shape",
    "shape_for_layers",
    "ScalingError",
]
