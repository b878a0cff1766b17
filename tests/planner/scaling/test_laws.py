"""Published laws reproduced: the closed form, Chinchilla's and Epoch's numbers, approach 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
from memplan.planner.scaling import (
    LAWS,
    ScalingError,
    cheapest_for_loss,
    compute_optimal,
    get_law,
    optimal_for_params,
)
from memplan.planner.scaling.laws import CHINCHILLA_TABLE3
from scipy.optimize import minimize_scalar

GOPHER_FLOPS = 5.76e23


def test_hoffmann_at_gopher_compute():
    s = compute_optimal(GOPHER_FLOPS, law="hoffmann")
    assert s.params == pytest.approx(3.22e10, rel=5e-3)
    assert s.tokens == pytest.approx(2.98e12, rel=5e-3)
    assert 6 * s.params * s.tokens == pytest.approx(GOPHER_FLOPS, rel=1e-12)
    assert s.flops == pytest.approx(GOPHER_FLOPS, rel=1e-12)


def test_epoch_at_gopher_compute():
    s = compute_optimal(GOPHER_FLOPS, law="epoch")
    assert s.params == pytest.approx(7.22e10, rel=5e-3)
    assert s.tokens == pytest.approx(1.33e12, rel=5e-3)
    assert s.tokens_per_param == pytest.approx(18.4, abs=0.05)
    assert 6 * s.params * s.tokens == pytest.approx(GOPHER_FLOPS, rel=1e-12)
    assert s.loss == pytest.approx(LAWS["epoch"].loss(s.params, s.tokens), rel=1e-12)


def test_default_law_is_epoch():
    assert compute_optimal(1e22).law == "epoch"


@pytest.mark.parametrize("name", ["hoffmann", "hoffmann-tex", "epoch", "muennighoff"])
def test_doubling_compute_scales_params_by_the_exponent(name):
    law = LAWS[name]
    ratio = compute_optimal(2e22, law=name).params / compute_optimal(1e22, law=name).params
    assert ratio == pytest.approx(2 ** (law.beta / (law.alpha + law.beta)), rel=1e-12)


@pytest.mark.parametrize("name", ["hoffmann", "hoffmann-tex", "epoch"])
@pytest.mark.parametrize("flops", [1e19, 5.76e23, 1e27])
def test_closed_form_is_the_numerical_minimum(name, flops):
    """Brute force: minimise L(N, C/(6N)) over log N numerically; the closed form must agree."""
    law = LAWS[name]
    res = minimize_scalar(lambda t: law.loss(math.exp(t), flops / (6 * math.exp(t))),
                          bounds=(math.log(1e3), math.log(1e16)), method="bounded",
                          options={"xatol": 1e-10})
    s = compute_optimal(flops, law=name)
    assert math.exp(res.x) == pytest.approx(s.params, rel=1e-4)
    assert s.loss <= res.fun + 1e-12


def test_tex_values_differ_from_printed():
    a = compute_optimal(GOPHER_FLOPS, law="hoffmann")
    b = compute_optimal(GOPHER_FLOPS, law="hoffmann-tex")
    assert LAWS["hoffmann-tex"].alpha == 0.33917084
    assert abs(a.params / b.params - 1) > 0.01  # rounding moves N_opt by more than 1%


def test_approach1_through_table3():
    s = compute_optimal(1.21e20, law="approach1")
    assert s.params == pytest.approx(1e9, rel=0.03)
    assert s.tokens == pytest.approx(20.2e9, rel=0.03)
    big = compute_optimal(1.27e26, law="approach1")
    assert big.params == pytest.approx(1e12, rel=0.03)
    assert big.tokens == pytest.approx(21.2e12, rel=0.03)
    assert big.loss is None  # approach 1 has no loss function
    for n, c, _ in CHINCHILLA_TABLE3:
        assert compute_optimal(c, law="approach1").params == pytest.approx(n, rel=0.1)
    assert LAWS["approach1"].n_exp == pytest.approx(0.5, abs=0.01)  # "a = 0.50" in Table 2


def test_params_query_inverts_compute_query():
    for name in ("epoch", "hoffmann", "approach1"):
        s = compute_optimal(3e21, law=name)
        back = optimal_for_params(s.params, law=name)
        assert back.flops == pytest.approx(3e21, rel=1e-9)
        assert back.tokens == pytest.approx(s.tokens, rel=1e-9)
        assert back.query == "params"


def test_cheapest_for_loss_is_on_the_frontier_and_cheapest():
    law = get_law("epoch")
    s = cheapest_for_loss(2.0)
    assert s.loss == pytest.approx(2.0, abs=1e-10)
    # no (N, D) at the same loss costs less: scan N, solve D for the loss
    for N in np.geomspace(s.params / 5, s.params * 5, 41):
        gap = 2.0 - law.E - law.A * N ** -law.alpha
        if gap <= 0:
            continue
        D = (law.B / gap) ** (1 / law.beta)
        assert 6 * N * D >= s.flops * (1 - 1e-9)


def test_cheapest_for_loss_roundtrip():
    s = compute_optimal(1e23, law="hoffmann")
    back = cheapest_for_loss(s.loss, law="hoffmann")
    assert back.flops == pytest.approx(1e23, rel=1e-9)


@pytest.mark.parametrize("bad", [0, -1e20, float("nan"), float("inf"), "lots"])
def test_bad_compute_names_the_field(bad):
    with pytest.raises(ScalingError, match="flops"):
        compute_optimal(bad)


def test_unknown_law_and_unreachable_loss():
    with pytest.raises(ScalingError, match="law: unknown 'chinchila'; choose one of epoch"):
        compute_optimal(1e22, law="chinchila")
    with pytest.raises(ScalingError, match="target_loss.*irreducible"):
        cheapest_for_loss(1.5)
    with pytest.raises(ScalingError, match="approach1"):
        cheapest_for_loss(2.5, law="approach1")


def test_json_keys():
    data = compute_optimal(GOPHER_FLOPS).model_dump()
    for key in ("params", "tokens", "loss", "tokens_per_param", "flops"):
        assert key in data
