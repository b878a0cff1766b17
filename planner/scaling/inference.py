"""Inference-aware sizing (Sardana and Frankle 2023, "Beyond Chinchilla-Optimal: Accounting for
Inference in Language Model Scaling Laws", arXiv 2401.00448, section 2):

    minimise   6 N D_train + 2 N D_inference   subject to   L(N, D_train) = target loss.

At fixed loss, D_train(N) = (B / (target - E - A N^-alpha))^(1/beta) for N above
N_min = (A / (target - E))^(1/alpha); the total cost goes to infinity at both ends of that range,
so a log-spaced scan followed by a bounded 1-D refinement finds the minimum. With no inference
tokens the answer is the compute-optimal model for that loss.
"""

from __future__ import annotations

import math

import numpy as np
from memplan.planner.scaling.errors import ScalingError, check_positive
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN, Law, get_law
from memplan.planner.scaling.queries import Sizing, cheapest_for_loss, compute_optimal, sizing
from pydantic import Field

__all__ = ["InferenceSizing", "inference_aware"]

INFERENCE_FLOPS_PER_PARAM_TOKEN = 2.0  # forward only: 2 N FLOPs per token (Kaplan et al. 2020)


class InferenceSizing(Sizing):
    """`Sizing` of the training run plus the inference it serves and the Chinchilla comparison."""

    inference_tokens: float = Field(ge=0, description="tokens the model will generate or read")
    inference_flops: float = Field(ge=0, description="2 N D_inference")
    total_flops: float = Field(gt=0, description="training plus inference FLOPs")
    chinchilla_params: float = Field(gt=0, description="N of the compute-optimal model at that loss")
    chinchilla_tokens: float = Field(gt=0, description="its training tokens")
    chinchilla_total_flops: float = Field(gt=0, description="its training plus inference FLOPs")
    saving: float = Field(description="1 - total_flops / chinchilla_total_flops")


def _tokens_at_loss(lw: Law, logN: np.ndarray, target: float) -> np.ndarray:
    gap = target - lw.E - lw.A * np.exp(-lw.alpha * logN)  # type: ignore[operator]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(gap > 0, (lw.B / gap) ** (1.0 / lw.beta), np.inf)  # type: ignore[operator]


def inference_aware(
    inference_tokens: float,
    *,
    target_loss: float | None = None,
    flops: float | None = None,
    law: str | Law | None = None,
) -> InferenceSizing:
    """The (N, D_train) that reach a loss with the least training plus inference FLOPs.

    The loss is `target_loss`, or the loss the compute-optimal model of `flops` FLOPs reaches
    (give one). Returns an `InferenceSizing` (FLOPs, tokens, nats per token); `flops` in it is the
    training compute 6 N D_train.
    """
    d_inf = check_positive("inference_tokens", inference_tokens, allow_zero=True)
    lw = get_law(law)
    lw._need_loss("an inference-aware size")
    if (target_loss is None) == (flops is None):
        raise ScalingError("target_loss, flops: give exactly one (the loss to reach, or a compute "
                           "whose compute-optimal loss to reach)")
    if flops is not None:
        target = compute_optimal(flops, law=lw).loss
    else:
        target = check_positive("target_loss", target_loss)
    chin = cheapest_for_loss(target, law=lw)  # also rejects target <= E
    chin_total = chin.flops + INFERENCE_FLOPS_PER_PARAM_TOKEN * chin.params * d_inf

    log_nmin = math.log(lw.A / (target - lw.E)) / lw.alpha  # type: ignore[operator]

    def cost(logN: np.ndarray) -> np.ndarray:
        N = np.exp(logN)
        return N * (FLOPS_PER_PARAM_TOKEN * _tokens_at_loss(lw, logN, target)
                    + INFERENCE_FLOPS_PER_PARAM_TOKEN * d_inf)

    # The optimum lies between N_min and the compute-optimal N (inference only pushes N down).
    hi = max(math.log(chin.params) + 1e-6, log_nmin + 1e-6)
    grid = log_nmin + (hi - log_nmin) * np.linspace(0, 1, 513)[1:] ** 2  # dense near N_min
    costs = cost(grid)
    k = int(np.argmin(costs))
    lo_b, hi_b = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    if k == 0:
        lo_b = log_nmin + 1e-12
    from scipy.optimize import minimize_scalar

    res = minimize_scalar(lambda t: float(cost(np.array([t]))[0]), bounds=(lo_b, hi_b),
                          method="bounded", options={"xatol": 1e-12})
    logN = float(res.x) if res.fun <= costs[k] else float(grid[k])
    N = math.exp(logN)
    D = float(_tokens_at_loss(lw, np.array([logN]), target)[0])
    if not math.isfinite(D):  # pragma: no cover - the scan never picks an infinite cost
        raise ScalingError("target_loss: no finite training run reaches it")
    inf_flops = INFERENCE_FLOPS_PER_PARAM_TOKEN * N * d_inf
    base = sizing(lw, "inference", N, D)
    base["loss"] = float(target)  # on the constraint by construction; avoids round-off drift
    total = base["flops"] + inf_flops
    return InferenceSizing(
        **base,
        inference_tokens=d_inf,
        inference_flops=inf_flops,
        total_flops=total,
        chinchilla_params=chin.params,
        chinchilla_tokens=chin.tokens,
        chinchilla_total_flops=chin_total,
        saving=1.0 - total / chin_total,
    )
