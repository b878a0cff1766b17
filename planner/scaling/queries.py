"""Sizing queries on a law's compute-optimal frontier: compute -> (N, D, loss), N -> (D, C),
target loss -> the cheapest (N, D).

Every answer is a `Sizing` whose JSON keys are `params`, `tokens`, `loss`, `tokens_per_param`,
`flops` (N, D, nats per token, D/N, FLOPs with C = 6 N D).
"""

from __future__ import annotations

import math
from typing import Literal

from memplan.planner.scaling.errors import ScalingError, check_positive
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN, Law, get_law
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Sizing",
    "compute_optimal",
    "optimal_for_params",
    "cheapest_for_loss",
    "optimal_loss",
]

Query = Literal[
    "compute", "params", "loss", "inference", "data-constrained", "data-constrained-loss", "memory",
    "fits",
]


class Sizing(BaseModel):
    """A model size and a token count, what they cost and the loss the law predicts for them."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    query: Query = Field(description="which question this answers")
    law: str = Field(description="the law's name")
    params: float = Field(gt=0, description="N, parameters")
    tokens: float = Field(gt=0, description="D, training tokens")
    loss: float | None = Field(description="predicted loss, nats per token (None: the law has none)")
    tokens_per_param: float = Field(gt=0, description="D / N")
    flops: float = Field(gt=0, description="training FLOPs, C = 6 N D")
    warnings: list[str] = Field(default_factory=list)


def _in_range(field: str, value: float, *results: float) -> None:
    """Refuse inputs so extreme that a result under- or overflows floating point (a silent 0,
    infinity or NaN otherwise)."""
    if not all(math.isfinite(r) and r > 0 for r in results):
        raise ScalingError(
            f"{field}: {value:g} is too small or too large to size (the result under- or "
            "overflows floating point)"
        )


def sizing(law: Law, query: Query, params: float, tokens: float, **extra) -> dict:
    """The common fields of a `Sizing` (a dict, so that subclasses can add theirs)."""
    _in_range("params" if query == "params" else "flops" if query == "compute" else query,
              params, params, tokens, params * tokens)
    return dict(
        query=query,
        law=law.name,
        params=float(params),
        tokens=float(tokens),
        loss=float(law.loss(params, tokens)) if law.has_loss else None,
        tokens_per_param=float(tokens / params),
        flops=FLOPS_PER_PARAM_TOKEN * float(params) * float(tokens),
        **extra,
    )


def compute_optimal(flops: float, *, law: str | Law | None = None) -> Sizing:
    """The compute-optimal (N, D) for `flops` FLOPs of training, with its predicted loss.

    Closed form N_opt = G (C/6)^(beta/(alpha+beta)) and D_opt = C / (6 N_opt), so 6 N D = C exactly.
    """
    C = check_positive("flops", flops)
    lw = get_law(law)
    N = float(lw.optimal_params(C))
    _in_range("flops", C, N)
    return Sizing(**sizing(lw, "compute", N, C / (FLOPS_PER_PARAM_TOKEN * N)))


def optimal_for_params(params: float, *, law: str | Law | None = None) -> Sizing:
    """For a model of `params` parameters: the tokens D_opt and compute C at which it is
    compute-optimal."""
    N = check_positive("params", params)
    lw = get_law(law)
    try:
        C = lw.optimal_flops_for_params(N)
    except OverflowError:
        C = math.inf
    _in_range("params", N, C)
    return Sizing(**sizing(lw, "params", N, C / (FLOPS_PER_PARAM_TOKEN * N)))


def optimal_loss(flops: float, *, law: str | Law | None = None) -> float:
    """The least loss (nats per token) `flops` FLOPs can buy under the law."""
    return compute_optimal(flops, law=law).loss  # type: ignore[return-value]


def cheapest_for_loss(target_loss: float, *, law: str | Law | None = None) -> Sizing:
    """The (N, D) that reach `target_loss` with the least compute.

    The least C with L_opt(C) = target lies on the compute-optimal frontier (L_opt decreases in C),
    so this solves L_opt(C) = target. Raises `ScalingError` when target <= E (unreachable).
    """
    target = check_positive("target_loss", target_loss)
    lw = get_law(law)
    lw._need_loss("a compute for a target loss")
    if target <= lw.E:  # type: ignore[operator]
        raise ScalingError(
            f"target_loss: {target:g} is not above the law's irreducible loss E = {lw.E:g}; "
            "no finite model reaches it, ask for a larger loss"
        )
    # On the frontier L_opt(C) - E = K (C/6)^-(alpha beta/(alpha+beta)) exactly, so invert it.
    a, b = lw.alpha, lw.beta
    N1 = lw.G  # N_opt at C/6 = 1 (D_opt = 1/G there)
    K = lw.A * N1 ** -a + lw.B * (1.0 / N1) ** -b  # type: ignore[operator]
    gamma = a * b / (a + b)  # type: ignore[operator]
    log_c6 = (math.log(K) - math.log(target - lw.E)) / gamma  # type: ignore[operator]
    C = FLOPS_PER_PARAM_TOKEN * math.exp(log_c6)
    if not math.isfinite(C):
        raise ScalingError(f"target_loss: {target:g} is too close to E = {lw.E:g} to size")
    out = compute_optimal(C, law=lw)
    return out.model_copy(update={"query": "loss"})
