"""Storage precision of checkpoints in the planner: the replay's rules by hand, the choice never over
its tolerance, and the optimal planner choosing storage (no torch here)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memplan.planner.checkpoint_dtype import (
    KAPPA,
    STORAGE_DTYPES,
    apply_storage,
    choose_storage,
    default_tolerance,
    parse_checkpoint_dtype,
    predicted_error,
    storage_error,
    storage_sizes,
)
from memplan.planner.schema import Plan, PlanError
from memplan.planner.simulate import simulate
from memplan.profiler.schema import Profile

from memplan import planner

from .chains import chain, random_chains

HAND_OPS = [["F", 1], ["F", 2], ["R", 3], ["loss"], ["B", 3], ["drop", 2], ["R", 2], ["B", 2],
            ["drop", 1], ["R", 1], ["B", 1]]


def _hand() -> Profile:
    # x = (8, 40, 40, 4) bytes of fp32, s = 10, no transients
    return chain((8, 40, 40, 4), (1, 1, 1), (1, 1, 1), (10, 10, 10))


def test_replay_by_hand_bf16_checkpoint():
    # F 2 reads a_1 as computed, then a_1 is stored (20 B, the cast live beside it); R 2 restores it
    sim = simulate(_hand(), HAND_OPS, storage={1: "bfloat16"})
    assert sim.valid
    assert sim.timeline == [48, 108, 82, 86, 126, 112, 142, 182, 132, 142, 150]
    assert sim.converted == [1]
    plain = simulate(_hand(), HAND_OPS)
    assert plain.timeline == [48, 88, 102, 106, 146, 132, 142, 182, 132, 142, 150]
    assert plain.converted == []


def test_replay_fp8_charges_the_scaled_copy_and_drop_frees_stored_bytes():
    ops = [["F", 1], ["F", 2], ["drop", 1], ["R", 3], ["loss"], ["B", 3], ["drop", 2], ["R", 1],
           ["R", 2], ["B", 2], ["drop", 1], ["B", 1]]
    # a_1 is dropped right after its first reader: never converted
    assert simulate(_hand(), ops, storage={1: "float8_e4m3fn"}).converted == []
    ops2 = [["F", 1], ["F", 2], ["F", 3], ["drop", 2], ["drop", 3], ["R", 2], ["R", 3], ["loss"],
            ["B", 3], ["B", 2], ["drop", 1], ["R", 1], ["B", 1]]
    sim = simulate(_hand(), ops2, storage={1: "float8_e4m3fn"})
    # F 2: live 48 + a_2 40 = 88, then fp8 a_1 (10 B) beside its scaled copy (40 B): 138
    assert sim.valid and sim.timeline[1] == 138 and sim.converted == [1]
    # F 3 (+4), drop 2 (-40), drop 3 (-4): 18 live; R 2 restores a_1 (18 + 40 during the
    # copy, then 18 - 10 + 40 = 48) and adds a_2 and its record (+40 +10)
    assert sim.timeline[5] == max(18 + 40, 48 + 40 + 10) == 98


@settings(max_examples=60, deadline=None)
@given(random_chains(min_stages=2, max_stages=6))
def test_empty_storage_replays_exactly_as_before(prof):
    plan = planner.plan(prof, strategy="sqrt")
    a, b = simulate(prof, plan.schedule), simulate(prof, plan.schedule, storage={})
    assert (a.timeline, a.peak_bytes, a.time_s) == (b.timeline, b.peak_bytes, b.time_s)


def _gpt_like(L: int = 8, sens: dict | None = None, dtype: str = "bfloat16") -> Profile:
    """A chain shaped like a GPT under bf16 autocast: fp32 residual stream (4096 B), records 11x."""
    layers = [dict(name=f"b{i}", forward_s=1.0, backward_s=2.0, output_bytes=4096,
                   saved_bytes=45056, output_dtype="float32") for i in range(1, L)]
    layers.append(dict(name="head", forward_s=1.0, backward_s=2.0, output_bytes=4, saved_bytes=9000,
                       output_dtype="float32"))
    meta = {"storage_sensitivity": sens} if sens else {}
    return Profile(input_bytes=512, dtype=dtype, layers=layers, meta=meta)


@settings(max_examples=80, deadline=None)
@given(tol=st.floats(0, 0.3), mode=st.sampled_from(["auto", "bf16", "fp8"]),
       sens=st.lists(st.floats(1e-4, 0.1), min_size=7, max_size=7), measured=st.booleans())
def test_never_a_lossy_storage_beyond_the_tolerance(tol, mode, sens, measured):
    prof = _gpt_like(sens={"bfloat16": sens, "float8_e4m3fn": [4 * v for v in sens]} if measured else None)
    plan = planner.plan(prof, strategy="uniform", k=2)
    choice = choose_storage(prof, plan.ops(), checkpoint_dtype=mode, tolerance=tol)
    assert choice.error <= tol * (1 + 1e-9)
    assert predicted_error(prof, choice.storage) == pytest.approx(choice.error)
    if tol == 0:
        assert choice.storage == {}
    sim = simulate(prof, plan.schedule, storage=choice.storage)
    assert sim.peak_bytes == choice.peak_bytes <= plan.predicted.peak_bytes


def test_sensitivity_from_profile_or_kappa_and_lossless_cases():
    prof = _gpt_like()
    u = STORAGE_DTYPES["bfloat16"].unit_roundoff
    assert storage_error(prof, 3, "bfloat16") == KAPPA * u
    assert storage_error(prof, 3, "float32") == 0.0
    prof = _gpt_like(sens={"bfloat16": [0.002] * 7})
    assert storage_error(prof, 3, "bfloat16") == 0.002
    # a bf16 output stored in fp32 is exact (and larger: auto never picks it)
    bf = Profile(input_bytes=8, dtype="bfloat16", layers=[
        dict(name="a", forward_s=1, backward_s=1, output_bytes=64, saved_bytes=8),
        dict(name="b", forward_s=1, backward_s=1, output_bytes=4, saved_bytes=8)])
    assert storage_error(bf, 1, "float32") == 0.0
    assert storage_sizes(bf, {1: "float32"})[0] == {1: 128}
    assert storage_sizes(bf, {1: "float8_e4m3fn"}) == ({1: 32}, {1: 64})


def test_default_tolerance_follows_the_policy():
    assert default_tolerance(_gpt_like(dtype="float32")) == 0.0
    assert default_tolerance(_gpt_like(dtype="bfloat16")) == 4 * 2.0**-8
    # under fp32 nothing lossy is chosen unless a tolerance is given
    prof = _gpt_like(dtype="float32")
    ops = planner.plan(prof, strategy="uniform", k=2).ops()
    assert choose_storage(prof, ops, checkpoint_dtype="auto").storage == {}
    assert choose_storage(prof, ops, checkpoint_dtype="auto", tolerance=1.0).storage


def test_optimal_chooses_storage_to_fit_or_go_faster():
    prof = _gpt_like(sens={"bfloat16": [0.001] * 7, "float8_e4m3fn": [0.004] * 7})
    least = planner.plan(prof, strategy="optimal", budget_bytes=0).message
    assert "least budget" in least
    store_all = planner.plan(prof, strategy="optimal").predicted
    found_faster = False
    for budget in range(store_all.peak_bytes // 4, store_all.peak_bytes, 2048):
        plain = planner.plan(prof, strategy="optimal", budget_bytes=budget)
        stored = planner.plan(prof, strategy="optimal", budget_bytes=budget,
                              checkpoint_dtype="auto", tolerance=0.01)
        if plain.feasible:
            assert stored.feasible and stored.predicted.time_s <= plain.predicted.time_s
        if stored.feasible:
            sim = simulate(prof, stored.schedule, storage=stored.checkpoint_dtypes)
            assert sim.peak_bytes == stored.predicted.peak_bytes <= budget
            assert predicted_error(prof, stored.checkpoint_dtypes) <= 0.01
            assert stored.options["checkpoint_dtype"] == "auto"
            found_faster |= (not plain.feasible) or stored.predicted.time_s < plain.predicted.time_s
    assert found_faster  # storage buys time (or feasibility) at some budget


def test_plan_json_round_trip_keeps_storage():
    prof = _gpt_like()
    plan = apply_storage(planner.plan(prof, strategy="uniform", k=2), prof, checkpoint_dtype="bf16",
                         tolerance=1.0)
    assert plan.checkpoint_dtypes and set(plan.checkpoint_dtypes.values()) == {"bfloat16"}
    again = Plan.model_validate_json(plan.model_dump_json())
    assert again.checkpoint_dtypes == plan.checkpoint_dtypes


@pytest.mark.parametrize("bad, field", [
    (dict(checkpoint_dtype="int8"), "checkpoint_dtype"),
    (dict(tolerance=-1.0), "tolerance"),
    (dict(tolerance=float("nan")), "tolerance"),
])
def test_bad_options_name_the_field(bad, field):
    prof = _gpt_like()
    with pytest.raises(PlanError, match=field):
        planner.plan(prof, strategy="optimal", **{"checkpoint_dtype": "auto", **bad})


def test_bad_storage_maps_name_the_stage():
    prof = _gpt_like()
    with pytest.raises(PlanError, match="stages 1..7"):
        simulate(prof, [["R", 1]], storage={8: "bfloat16"})
    with pytest.raises(PlanError, match=r"checkpoint_dtypes\[2\]: unknown dtype"):
        simulate(prof, [["R", 1]], storage={2: "bf17"})
    assert parse_checkpoint_dtype("BF16") == "bfloat16" and parse_checkpoint_dtype("fp8") == "float8_e4m3fn"


def test_storage_error_is_at_least_the_compute_dtypes():
    """fp16 storage under bf16 autocast was priced at KAPPA x fp16's roundoff (0.0039) and chosen
    at a tolerance of 0.005, then measured 0.0062-0.0077: a recompute's perturbed input flips bf16
    roundings downstream. The price is now at least KAPPA x the compute dtype's roundoff."""
    from memplan.planner.checkpoint_dtype import KAPPA, storage_error
    from memplan.profiler.analytic import gpt_analytic_profile

    cfg = dict(n_layer=4, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4,
               dropout=0.0, attention="flash")
    fp32 = gpt_analytic_profile(cfg, precision="fp32", cpu_threads=1)
    mixed = gpt_analytic_profile(cfg, precision="bf16-mixed", cpu_threads=1)
    assert storage_error(fp32, 2, "float16") == KAPPA * 2**-11  # fp32 compute: the dtype's own
    assert storage_error(mixed, 2, "float16") == KAPPA * 2**-8  # bf16 compute: bf16's
