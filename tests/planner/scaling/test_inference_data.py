"""Inference-aware (Sardana and Frankle 2023) and data-constrained (Muennighoff et al. 2023) sizing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from memplan.planner.scaling import (
    LAWS,
    ScalingError,
    compute_optimal,
    data_constrained_loss,
    data_constrained_optimal,
    inference_aware,
)


def test_muennighoff_check_value():
    # datablations README, "Parametric Fit": the two models of Figure 1 (right)
    assert data_constrained_loss(6.34e9, 242e9, 25e9).loss == pytest.approx(2.2256440889984477, abs=1e-5)
    assert data_constrained_loss(8.67e9, 178e9, 25e9).loss == pytest.approx(2.2269634075087867, abs=1e-5)


def test_muennighoff_optimal_allocation():
    # datablations README: at the compute of 8.67B x 178B with 25B unique tokens, the optimum is
    # "227B tokens, 9.1 epochs, 6.8B parameters" (their grid search)
    s = data_constrained_optimal(6 * 8.67e9 * 178e9, 25e9)
    assert s.tokens == pytest.approx(227e9, rel=0.01)
    assert s.epochs == pytest.approx(9.1, abs=0.05)
    assert s.params == pytest.approx(6.8e9, rel=0.01)
    assert s.flops == pytest.approx(6 * s.params * s.tokens, rel=1e-12)
    # repetition makes it worse than with unlimited data, and it shifts toward fewer parameters
    assert s.loss > s.unconstrained_loss
    assert s.params < s.unconstrained_params


def test_no_repetition_is_the_plain_law():
    law = LAWS["muennighoff"]
    s = data_constrained_loss(1e9, 20e9, 1e12)  # far more unique tokens than used
    assert s.loss == pytest.approx(law.loss(1e9, 20e9), rel=1e-12)
    assert s.effective_tokens == pytest.approx(20e9)


def test_repeated_tokens_are_worth_less():
    one = data_constrained_loss(1e9, 20e9, 20e9)
    four = data_constrained_loss(1e9, 80e9, 20e9)
    assert four.effective_tokens == pytest.approx(20e9 * (1 + 15.387756 * (1 - math.exp(-3 / 15.387756))))
    assert four.effective_tokens / four.tokens == pytest.approx(0.93, abs=0.01)  # "93% of fresh"
    assert four.loss < one.loss


def test_inference_free_is_chinchilla():
    s = inference_aware(0, flops=5.76e23, law="hoffmann")
    c = compute_optimal(5.76e23, law="hoffmann")
    assert s.params == pytest.approx(c.params, rel=1e-5)
    assert s.tokens == pytest.approx(c.tokens, rel=1e-5)


@pytest.mark.parametrize("d_inf", [1e11, 2e12, 1e14])
def test_inference_aware_minimises_total_at_equal_loss(d_inf):
    law = LAWS["hoffmann"]
    target = compute_optimal(5.76e23, law="hoffmann").loss
    s = inference_aware(d_inf, target_loss=target, law="hoffmann")
    assert law.loss(s.params, s.tokens) == pytest.approx(target, abs=1e-9)
    assert s.params < s.chinchilla_params and s.tokens > s.chinchilla_tokens
    assert s.total_flops <= s.chinchilla_total_flops
    assert s.total_flops == pytest.approx(6 * s.params * s.tokens + 2 * s.params * d_inf, rel=1e-12)
    # brute force over N on the iso-loss curve
    best = math.inf
    for N in np.geomspace(s.params / 3, s.params * 3, 4001):
        gap = target - law.E - law.A * N ** -law.alpha
        if gap > 0:
            best = min(best, 6 * N * (law.B / gap) ** (1 / law.beta) + 2 * N * d_inf)
    assert s.total_flops <= best * (1 + 1e-7)


def test_more_inference_means_smaller_models():
    sizes = [inference_aware(d, flops=1e23).params for d in (0, 1e12, 1e13, 1e14)]
    assert sizes == sorted(sizes, reverse=True)


def test_bad_inputs():
    with pytest.raises(ScalingError, match="unique_tokens"):
        data_constrained_loss(1e9, 1e10, -5)
    with pytest.raises(ScalingError, match="inference_tokens"):
        inference_aware(float("nan"), flops=1e22)
    with pytest.raises(ScalingError, match="target_loss, flops: give exactly one"):
        inference_aware(1e12)


def test_plenty_of_unique_tokens_is_the_unconstrained_optimum():
    s = data_constrained_optimal(1e21, 1e15)
    assert s.params == pytest.approx(s.unconstrained_params, rel=1e-4)
    assert s.loss == pytest.approx(s.unconstrained_loss, abs=1e-9)
    assert s.epochs < 1
