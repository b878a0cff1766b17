"""Profiles and plans are strict: finite, non-negative, no unknown fields, errors name the field."""

from __future__ import annotations

import json

import pytest
from memplan.planner.schema import Plan, PlanError, parse_schedule
from memplan.profiler.schema import SCHEMA_VERSION, ProfileError, load_profile

from tests.planner.chains import worked_example


def _dict() -> dict:
    return worked_example().model_dump()


def test_profile_round_trips_through_json():
    prof = worked_example()
    again = load_profile(prof.model_dump_json())
    assert again == prof
    assert again.schema_version == SCHEMA_VERSION
    assert again.n_stages == 4


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("layers", 0, "forward_s"), float("nan"), "layers.0.forward_s: must be a finite number"),
        (("layers", 1, "backward_s"), float("inf"), "layers.1.backward_s: must be a finite number"),
        (("layers", 2, "saved_bytes"), -1, "layers.2.saved_bytes"),
        (("input_bytes",), -5, "input_bytes"),
        (("layers",), [], "layers"),
        (("layers", 0, "bogus"), 1, "layers.0.bogus: unknown field"),
        (("surprise",), 1, "surprise: unknown field"),
        (("layers", 3, "output_bytes"), 1.5, "layers.3.output_bytes"),
        (("layers", 0, "saved_bytes"), True, "layers.0.saved_bytes: a number, not true"),
        (("layers", 1, "forward_s"), False, "layers.1.forward_s: a number, not false"),
    ],
)
def test_bad_profiles_name_the_field(path, value, needle):
    data = _dict()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ProfileError) as err:
        load_profile(data)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_nan_in_json_text_is_refused():
    text = worked_example().model_dump_json().replace('"forward_s":3.0', '"forward_s":NaN', 1)
    assert "NaN" in text
    with pytest.raises(ProfileError, match="forward_s"):
        load_profile(text)


def test_duplicate_stage_names_are_refused():
    data = _dict()
    data["layers"][1]["name"] = data["layers"][0]["name"]
    with pytest.raises(ProfileError, match="repeats the name"):
        load_profile(data)


def test_malformed_json_is_a_profile_error():
    with pytest.raises(ProfileError):
        load_profile('{"input_bytes": 1, "layers": [')


def test_a_path_loads_and_a_path_as_text_is_named(tmp_path):
    """A pathlib.Path is read; a file name passed as a string is not taken for JSON text."""
    f = tmp_path / "p.json"
    f.write_text(worked_example().model_dump_json())
    assert load_profile(f) == worked_example()
    with pytest.raises(ProfileError, match=r"^profile: '.*p.json' is not a profile's JSON text .* "
                                           r"pass a pathlib.Path$"):
        load_profile(str(f))
    with pytest.raises(ProfileError, match=r"^profile: cannot read '.*nope.json' \(No such file"):
        load_profile(tmp_path / "nope.json")


def test_fingerprint_tracks_the_model_not_the_timings():
    a = worked_example()
    b = a.model_copy(deep=True)
    b.layers[0].forward_s = 99.0
    assert a.fingerprint() == b.fingerprint()
    c = a.model_copy(deep=True)
    c.layers[0].output_bytes += 1
    assert a.fingerprint() != c.fingerprint()
    pruned = a.model_copy(deep=True)
    pruned.layers[2].param_bytes += 4
    assert a.fingerprint() != pruned.fingerprint()


def test_schedule_ops_parse_and_refuse_malformed():
    assert parse_schedule([["F", 1], ["loss"], ["B", 2]]) == [("F", 1), ("loss",), ("B", 2)]
    for bad, needle in [
        ([["X", 1]], "unknown op 'X'"),
        ([["F"]], "needs one integer stage index"),
        ([["F", "1"]], "needs one integer stage index"),
        ([["F", True]], "needs one integer stage index"),
        ([["loss", 1]], "takes no stage index"),
        ([[]], "expected an op"),
        ("F1", "expected a list of ops"),
    ]:
        with pytest.raises(PlanError, match="schedule"):
            parse_schedule(bad)
        try:
            parse_schedule(bad)
        except PlanError as err:
            assert needle in str(err)


def test_plan_json_encodes_ops_as_arrays():
    plan = Plan(strategy="x", feasible=True, n_stages=1, schedule=[("R", 1), ("loss",), ("B", 1)])
    data = json.loads(plan.model_dump_json())
    assert data["schedule"] == [["R", 1], ["loss"], ["B", 1]]
    assert plan.ops() == [("R", 1), ("loss",), ("B", 1)]
    with pytest.raises(ValueError):
        Plan.model_validate({**data, "extra": 1})


def test_times_and_sizes_have_ceilings():
    # NOTE [ ceilings ] in profiler/schema.py: a time at most 1e9 s, a size at most 2^53 bytes,
    # all sizes together at most 2^58 (so every sum the planner forms fits int64)
    data = _dict()
    data["layers"][0]["forward_s"] = 1e308
    with pytest.raises(ProfileError, match="layers.0.forward_s: Input should be less than or equal to 1000000000"):
        load_profile(data)
    data = _dict()
    data["layers"][1]["saved_bytes"] = 2**53
    assert load_profile(data).layers[1].saved_bytes == 2**53  # the ceiling itself is valid
    data["layers"][1]["saved_bytes"] = 2**53 + 1
    with pytest.raises(ProfileError, match="layers.1.saved_bytes"):
        load_profile(data)
    data = _dict()
    for layer in data["layers"]:  # each under the ceiling, together over 2^58
        layer["output_bytes"] = layer["saved_bytes"] = 2**53
    data["layers"] *= 9
    for i, layer in enumerate(data["layers"]):
        data["layers"][i] = {**layer, "name": f"s{i}"}
    assert 36 * 2**53 > 2**58 > 31 * 2**53
    with pytest.raises(ProfileError, match="add up to .* over the ceiling of 2\\^58"):
        load_profile(data)
    del data["layers"][15:]  # 30 x 2^53 and the small input: under 2^58, valid
    assert load_profile(data).n_stages == 15


def test_plan_error_carries_its_field():
    err = PlanError("must be at least 0, got -1", field="budget_bytes")
    assert err.field == "budget_bytes" and err.reason == "must be at least 0, got -1"
    assert str(err) == "budget_bytes: must be at least 0, got -1"
    legacy = PlanError("schedule[3]: unknown op 'Z'")  # the strategies' "field: reason" form
    assert (legacy.field, legacy.reason) == ("schedule[3]", "unknown op 'Z'")
    plain = PlanError("no schedule fits")
    assert plain.field is None and str(plain) == "no schedule fits"
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert again.field == "budget_bytes" and str(again) == str(err)
