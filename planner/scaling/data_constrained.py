"""Data-constrained sizing (Muennighoff et al. 2023, "Scaling Data-Constrained Language Models",
arXiv 2305.16264, section 3.1, Eqs. 5-6 and App. A).

With U unique tokens repeated for D training tokens, and N parameters:

    R_D = D/U - 1 (repetitions),   U_N = min(N, N_opt(U)),   R_N = N/U_N - 1 (excess parameters),
    D' = U + U R_D* (1 - exp(-R_D / R_D*)),   N' = U_N + U_N R_N* (1 - exp(-R_N / R_N*)),
    L = E + A / N'^alpha + B / D'^beta,

with R_D* = 15.387756 and R_N* = 5.309743 (App. A). N_opt(U) is the parameter count for which U
tokens are compute-optimal: (U G)^(beta/alpha) G (datablations README, "Parametric Fit"). Repeated
tokens are worth less than fresh ones, and parameters beyond what U supports decay faster still
(R_N* < R_D*). The default law is `muennighoff` (their C4 fit), which the two constants were
fitted with.
"""

from __future__ import annotations

import math

import numpy as np
from memplan.planner.scaling.errors import ScalingError, check_positive
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN, Law, get_law
from memplan.planner.scaling.queries import Sizing, compute_optimal
from pydantic import Field

__all__ = [
    "R_D_STAR",
    "R_N_STAR",
    "DataConstrainedSizing",
    "data_constrained_loss",
    "data_constrained_optimal",
]

R_D_STAR = 15.387756  # Muennighoff et al. 2023, App. A: decay constant of repeated data
R_N_STAR = 5.309743  # ... and of excess parameters
DEFAULT_DC_LAW = "muennighoff"


class DataConstrainedSizing(Sizing):
    """`Sizing` under a limit of unique tokens; `loss` is the data-constrained loss."""

    unique_tokens: float = Field(gt=0, description="U, unique tokens available")
    epochs: float = Field(gt=0, description="D / U")
    effective_tokens: float = Field(gt=0, description="D', what the repeated tokens are worth")
    effective_params: float = Field(gt=0, description="N', what the parameters are worth")
    unconstrained_params: float | None = Field(
        default=None, description="N of the compute-optimal model with unlimited data"
    )
    unconstrained_loss: float | None = Field(default=None, description="its loss")


def _terms(lw: Law, N: np.ndarray, D: np.ndarray, U: float, rd: float, rn: float):
    G = lw.G
    U_D = np.minimum(U, D)  # with D <= U nothing repeats: every token is fresh
    n_for_u = (U_D * G) ** (lw.beta / lw.alpha) * G  # type: ignore[operator]
    R_D = np.maximum(D / U_D - 1.0, 0.0)
    U_N = np.minimum(N, n_for_u)
    R_N = np.maximum(N / U_N - 1.0, 0.0)
    D_eff = U_D + U_D * rd * (1.0 - np.exp(-R_D / rd))
    N_eff = U_N + U_N * rn * (1.0 - np.exp(-R_N / rn))
    loss = lw.E + lw.A * N_eff ** -lw.alpha + lw.B * D_eff ** -lw.beta  # type: ignore[operator]
    return loss, D_eff, N_eff


def _inputs(unique_tokens: float, r_d_star: float, r_n_star: float, law: str | Law | None,
            what: str) -> tuple[float, float, float, Law]:
    """(U in tokens, R_D*, R_N*, the law: `muennighoff` by default), validated: ScalingError naming
    the field, or saying the law cannot price `what` (it has no loss terms)."""
    U = check_positive("unique_tokens", unique_tokens)
    rd = check_positive("r_d_star", r_d_star)
    rn = check_positive("r_n_star", r_n_star)
    lw = get_law(law or DEFAULT_DC_LAW)
    lw._need_loss(what)
    return U, rd, rn, lw


def data_constrained_loss(
    params: float,
    tokens: float,
    unique_tokens: float,
    *,
    law: str | Law | None = None,
    r_d_star: float = R_D_STAR,
    r_n_star: float = R_N_STAR,
) -> DataConstrainedSizing:
    """The loss (nats per token) of N = `params` trained on `tokens` tokens drawn from
    `unique_tokens` unique ones, with the effective N' and D' behind it."""
    N = check_positive("params", params)
    D = check_positive("tokens", tokens)
    U, rd, rn, lw = _inputs(unique_tokens, r_d_star, r_n_star, law, "a data-constrained loss")
    loss, D_eff, N_eff = _terms(lw, np.array(N), np.array(D), U, rd, rn)
    return DataConstrainedSizing(
        query="data-constrained-loss", law=lw.name, params=N, tokens=D, loss=float(loss),
        tokens_per_param=D / N, flops=FLOPS_PER_PARAM_TOKEN * N * D, unique_tokens=U,
        epochs=D / U, effective_tokens=float(D_eff), effective_params=float(N_eff),
    )


def data_constrained_optimal(
    flops: float,
    unique_tokens: float,
    *,
    law: str | Law | None = None,
    r_d_star: float = R_D_STAR,
    r_n_star: float = R_N_STAR,
) -> DataConstrainedSizing:
    """The (N, D) with 6 N D = `flops` that minimise the data-constrained loss for
    `unique_tokens` unique tokens (a log-spaced scan over N, then a bounded refinement)."""
    C = check_positive("flops", flops)
    U, rd, rn, lw = _inputs(unique_tokens, r_d_star, r_n_star, law, "a data-constrained size")
    free = compute_optimal(C, law=lw)
    x = C / FLOPS_PER_PARAM_TOKEN

    def loss_at(logN: np.ndarray) -> np.ndarray:
        N = np.exp(logN)
        return _terms(lw, N, x / N, U, rd, rn)[0]

    center = math.log(free.params)
    grid = center + np.linspace(-12.0, 6.0, 1801)  # N from e^-12 to e^6 times the free optimum
    vals = loss_at(grid)
    k = int(np.argmin(vals))
    if k in (0, len(grid) - 1):
        raise ScalingError(
            "flops, unique_tokens: the optimum lies outside e^-12..e^6 times the unconstrained "
            "model size; check the two are in FLOPs and tokens"
        )
    from scipy.optimize import minimize_scalar

    res = minimize_scalar(lambda t: float(loss_at(np.array([t]))[0]),
                          bounds=(grid[k - 1], grid[k + 1]), method="bounded",
                          options={"xatol": 1e-10})
    logN = float(res.x) if res.fun <= vals[k] else float(grid[k])
    N = math.exp(logN)
    out = data_constrained_loss(N, x / N, U, law=lw, r_d_star=rd, r_n_star=rn)
    return out.model_copy(update={
        "query": "data-constrained", "flops": C,
        "unconstrained_params": free.params, "unconstrained_loss": free.loss,
    })
