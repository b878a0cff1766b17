"""Scaling laws, each selectable by name: the loss L(N, D) and the compute-optimal allocation.

Parametric laws (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", approach 3,
Eq. 2 and section D.2):

    L(N, D) = E + A / N^alpha + B / D^beta,   C = 6 N D  (FLOPs of training, N parameters, D tokens)

Minimising L at fixed C gives the closed form (Hoffmann et al. Eq. 4)

    N_opt(C) = G (C/6)^a,  D_opt(C) = G^-1 (C/6)^b,  a = beta/(alpha+beta),  b = alpha/(alpha+beta),
    G = (alpha A / (beta B))^(1/(alpha+beta)).

Approach 1 of the same paper gives no loss, only the frontier; `approach1` is a power law
N_opt = k C^a fitted (least squares in log-log) through the paper's Table 3, with D = C / (6 N).

NOTE [ which law is the default ]
Besiroglu et al. 2024 ("Chinchilla Scaling: A replication attempt", arXiv 2404.10102) refit
approach 3 on the 245 points they extracted from the paper's Figure 4 and showed that the printed
constants fit those points badly (Hoffmann's optimiser stopped early; the printed values are
rounded). Their refit agrees with approaches 1 and 2 (about 20 tokens per parameter), so `epoch` is
the default here.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from memplan.planner.scaling.errors import ScalingError, check_positive
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Law",
    "LAWS",
    "DEFAULT_LAW",
    "FLOPS_PER_PARAM_TOKEN",
    "CHINCHILLA_TABLE3",
    "get_law",
    "parametric_law",
]

# C = 6 N D: 2 FLOPs per parameter per token forward, 4 backward (Kaplan et al. 2020, section 2.1).
FLOPS_PER_PARAM_TOKEN = 6.0

# Hoffmann et al. 2022, Table 3 (approach 1): (parameters, FLOPs, tokens) of compute-optimal models.
CHINCHILLA_TABLE3: tuple[tuple[float, float, float], ...] = (
    (400e6, 1.92e19, 8.0e9),
    (1e9, 1.21e20, 20.2e9),
    (10e9, 1.23e22, 205.1e9),
    (67e9, 5.76e23, 1.5e12),
    (175e9, 3.85e24, 3.7e12),
    (280e9, 9.90e24, 5.9e12),
    (520e9, 3.43e25, 11.0e12),
    (1e12, 1.27e26, 21.2e12),
    (10e12, 1.30e28, 216.2e12),
)


class Law(BaseModel):
    """A named scaling law. `parametric`: L = E + A/N^alpha + B/D^beta. `power`: only the frontier,
    N_opt(C) = n_coef * C^n_exp (no loss)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    name: str
    kind: Literal["parametric", "power"] = "parametric"
    E: float | None = Field(default=None, gt=0, description="irreducible loss (nats per token)")
    A: float | None = Field(default=None, gt=0)
    B: float | None = Field(default=None, gt=0)
    alpha: float | None = Field(default=None, gt=0, description="exponent of N")
    beta: float | None = Field(default=None, gt=0, description="exponent of D")
    n_coef: float | None = Field(default=None, gt=0, description="power law: N_opt = n_coef C^n_exp")
    n_exp: float | None = Field(default=None, gt=0)
    source: str = ""

    @property
    def has_loss(self) -> bool:
        """Whether the law predicts a loss (parametric laws do; approach 1 does not)."""
        return self.kind == "parametric"

    # --- the parametric form -------------------------------------------------------------------

    def loss(self, params: float | np.ndarray, tokens: float | np.ndarray) -> float | np.ndarray:
        """Predicted loss (nats per token) at N = `params`, D = `tokens`."""
        self._need_loss("loss")
        N = np.asarray(params, dtype=np.float64)
        D = np.asarray(tokens, dtype=np.float64)
        out = self.E + self.A * N ** -self.alpha + self.B * D ** -self.beta  # type: ignore[operator]
        return float(out) if out.ndim == 0 else out

    @property
    def G(self) -> float:
        """G = (alpha A / (beta B))^(1/(alpha+beta)) (Hoffmann et al. Eq. 4)."""
        self._need_loss("G")
        a, b = self.alpha, self.beta
        return (a * self.A / (b * self.B)) ** (1.0 / (a + b))  # type: ignore[operator]

    @property
    def params_exponent(self) -> float:
        """a in N_opt proportional to C^a."""
        if self.kind == "power":
            return float(self.n_exp)  # type: ignore[arg-type]
        return self.beta / (self.alpha + self.beta)  # type: ignore[operator]

    # --- the frontier ---------------------------------------------------------------------------

    def optimal_params(self, flops: float | np.ndarray) -> float | np.ndarray:
        """N_opt(C): the compute-optimal parameter count for `flops` FLOPs of training."""
        C = np.asarray(flops, dtype=np.float64)
        if self.kind == "power":
            out = self.n_coef * C ** self.n_exp  # type: ignore[operator]
        else:
            out = self.G * (C / FLOPS_PER_PARAM_TOKEN) ** self.params_exponent
        return float(out) if out.ndim == 0 else out

    def optimal_flops_for_params(self, params: float) -> float:
        """The compute C at which `params` is compute-optimal (the inverse of `optimal_params`)."""
        if self.kind == "power":
            return (params / self.n_coef) ** (1.0 / self.n_exp)  # type: ignore[operator]
        return FLOPS_PER_PARAM_TOKEN * (params / self.G) ** (1.0 / self.params_exponent)

    def _need_loss(self, what: str) -> None:
        if not self.has_loss:
            raise ScalingError(
                f"law: {self.name!r} gives only the compute-optimal frontier, not {what}; "
                "use a parametric law (epoch, hoffmann, hoffmann-tex, muennighoff)"
            )


def parametric_law(
    name: str, *, E: float, A: float, B: float, alpha: float, beta: float, source: str = ""
) -> Law:
    """A parametric law from its five coefficients, validated (each finite and > 0)."""
    for field, v in (("E", E), ("A", A), ("B", B), ("alpha", alpha), ("beta", beta)):
        check_positive(field, v)
    return Law(name=name, E=E, A=A, B=B, alpha=alpha, beta=beta, source=source)


def _approach1() -> Law:
    logC = np.log([c for _, c, _ in CHINCHILLA_TABLE3])
    logN = np.log([n for n, _, _ in CHINCHILLA_TABLE3])
    slope, intercept = np.polyfit(logC, logN, 1)
    return Law(
        name="approach1", kind="power", n_coef=math.exp(intercept), n_exp=float(slope),
        source="Hoffmann et al. 2022, Table 3 (approach 1), power law fitted in log-log",
    )


LAWS: dict[str, Law] = {
    "epoch": parametric_law(
        "epoch", E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658,
        source="Besiroglu et al. 2024 (arXiv 2404.10102), Eq. 3: approach 3 refit",
    ),
    "hoffmann": parametric_law(
        "hoffmann", E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28,
        source="Hoffmann et al. 2022, approach 3 as printed (section 3.3, Eq. 10)",
    ),
    "hoffmann-tex": parametric_law(
        "hoffmann-tex", E=1.69337368, A=406.401018, B=410.722827, alpha=0.33917084,
        beta=0.2849083,
        source="Hoffmann et al. 2022, approach 3, unrounded values from the paper's TeX source",
    ),
    # Muennighoff et al. 2023 (arXiv 2305.16264), App. A: the C4 fit with alpha = beta; the
    # coefficients are exp() of the fitted logs a=6.255414, b=7.3049974, e=0.6254804 (datablations
    # README, "Parametric Fit").
    "muennighoff": parametric_law(
        "muennighoff", E=math.exp(0.6254804), A=math.exp(6.255414), B=math.exp(7.3049974),
        alpha=0.3526596, beta=0.3526596,
        source="Muennighoff et al. 2023 (arXiv 2305.16264), App. A, C4 fit",
    ),
    "approach1": _approach1(),
}

DEFAULT_LAW = "epoch"


def get_law(law: str | Law | None = None) -> Law:
    """The `Law` named `law` (one of `LAWS`), a `Law` as is, or the default (`epoch`) for None."""
    if law is None:
        return LAWS[DEFAULT_LAW]
    if isinstance(law, Law):
        return law
    key = str(law).strip().lower()
    if key not in LAWS:
        raise ScalingError(f"law: unknown {law!r}; choose one of {', '.join(LAWS)}")
    return LAWS[key]
