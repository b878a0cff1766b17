"""The simulator against the chain model's rules and its worked example."""

from __future__ import annotations

import pytest
from memplan.planner.simulate import simulate
from memplan.profiler.schema import Profile

from tests.planner.chains import chain, worked_example

STORE_ALL = [["R", 1], ["R", 2], ["R", 3], ["R", 4], ["loss"], ["drop", 4], ["B", 4], ["drop", 3],
             ["B", 3], ["drop", 2], ["B", 2], ["drop", 1], ["B", 1]]


def test_worked_example_store_all():
    sim = simulate(worked_example(), STORE_ALL)
    assert sim.valid, sim.error
    assert sim.time_s == 36
    assert sim.peak_bytes == 31
    assert sim.recompute_s == 0 and sim.overhead == 0
    # bytes live during each op, by hand from the rules
    assert sim.timeline == [9, 17, 19, 29, 31, 31, 30, 22, 23, 19, 18, 10, 9]
    assert sim.forward_counts == [1, 1, 1, 1]


def test_keeping_a_L_through_the_backward_costs_its_bytes():
    ops = [op for op in STORE_ALL if op != ["drop", 4]]
    sim = simulate(worked_example(), ops)
    assert sim.valid
    assert sim.peak_bytes == 27 + 4 + 3  # B 4 with a_4 still live


def test_fixed_bytes_add_to_total_peak_only():
    prof = worked_example().model_copy(update={"fixed_bytes": 100})
    sim = simulate(prof, STORE_ALL)
    assert sim.peak_bytes == 31 and sim.total_peak_bytes == 131


def test_recompute_time_and_overhead():
    ops = [["F", 1], ["F", 2], ["drop", 1], ["R", 3], ["R", 4], ["loss"], ["drop", 4], ["B", 4],
           ["drop", 3], ["B", 3], ["drop", 2], ["R", 1], ["R", 2], ["drop", 2], ["B", 2], ["drop", 1],
           ["B", 1]]
    sim = simulate(worked_example(), ops)
    assert sim.valid, sim.error
    assert sim.time_s == 36 + 3 + 4
    assert sim.recompute_s == 7
    assert sim.overhead == pytest.approx(7 / 36)
    assert sim.forward_counts == [2, 2, 1, 1]
    assert sim.checkpoints == []  # a_2 is pinned by R 3's record: not a checkpoint


@pytest.mark.parametrize(
    ("ops", "index", "needle"),
    [
        ([["R", 2]], 0, "its input a_1 is not live"),
        ([["R", 1], ["R", 1]], 1, "already has a live record"),
        ([["R", 1], ["R", 2], ["drop", 1]], 2, "pinned by the live record of stage 2"),
        ([["drop", 1]], 0, "a_1 is not live"),
        ([["R", 1], ["loss"]], 1, "a_4 is not live"),
        ([["R", 5]], 0, "out of range 1..4"),
        ([["R", 0]], 0, "out of range 1..4"),
        (STORE_ALL[:5] + [["B", 3]], 5, "must run B 4 next"),
        (STORE_ALL[:4] + [["B", 4]], 4, "d_4 is not live"),
        (STORE_ALL[:5] + [["loss"]], 5, "already exists"),
        (STORE_ALL[:9], 9, "ends before it"),
        ([["F", 1], ["F", 2], ["F", 3], ["F", 4], ["loss"], ["B", 4]], 5, "no live record"),
    ],
)
def test_broken_rules_name_the_op(ops, index, needle):
    sim = simulate(worked_example(), ops)
    assert not sim.valid
    assert sim.error_index == index
    assert needle in sim.error
    assert sim.error.startswith(f"op {index} ")


def test_b_needs_a_record_and_drop_0_is_refused():
    prof = chain([1, 1, 1], [1, 1], [1, 1], [0, 0])
    ops = [["R", 1], ["F", 2], ["drop", 1], ["loss"], ["B", 2]]
    sim = simulate(prof, ops)
    assert not sim.valid and "no live record" in sim.error
    ops = [["R", 1], ["R", 2], ["loss"], ["B", 2], ["drop", 0]]
    sim = simulate(prof, ops)
    assert not sim.valid and "out of range" in sim.error


def test_b_needs_its_input():
    prof = chain([1, 1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0])
    ops = [["R", 1], ["F", 2], ["drop", 1], ["R", 3], ["loss"], ["B", 3], ["R", 2], ["B", 2]]
    sim = simulate(prof, ops)
    assert not sim.valid and sim.error_index == 6 and "a_1 is not live" in sim.error


def test_dict_profile_and_tuple_ops_are_accepted():
    sim = simulate(worked_example().model_dump(), [tuple(op) for op in STORE_ALL])
    assert sim.valid and sim.peak_bytes == 31


def test_nograd_forward_time_is_charged_to_F_only():
    """NOTE [ no-grad forward time ]: `F i` costs forward_nograd_s, `R i` forward_s."""
    d = worked_example().model_dump()
    for la, fn in zip(d["layers"], (1.5, 2.0, 0.5, 0.25), strict=True):
        la["forward_nograd_s"] = fn
    prof = Profile.model_validate(d)
    ops = [["F", 1], ["F", 2], ["R", 3], ["R", 4], ["loss"], ["B", 4], ["B", 3], ["drop", 2],
           ["R", 1], ["R", 2], ["B", 2], ["B", 1]]
    sim = simulate(prof, ops)
    assert sim.valid, sim.error
    # store-all is 36; the recorded forwards add f (3 + 4 + 4 + 1), the F ops f' (1.5 + 2.0)
    assert sim.time_s == 3 + 4 + 4 + 1 + 6 + 8 + 8 + 2 + 1.5 + 2.0
    assert sim.recompute_s == 3.5
    bad = d["layers"][0] | {"forward_nograd_s": -1.0}
    with pytest.raises(ValueError, match="forward_nograd_s"):
        Profile.model_validate(d | {"layers": [bad, *d["layers"][1:]]})


def test_nograd_forward_bytes_are_charged_to_F_only():
    """NOTE [ no-grad forward bytes ]: `F i` costs forward_nograd_temp_bytes, `R i` tf_i."""
    d = worked_example().model_dump()
    ops = [["F", 1], ["F", 2], ["R", 3], ["R", 4], ["loss"], ["B", 4], ["B", 3], ["drop", 2],
           ["R", 1], ["R", 2], ["B", 2], ["B", 1]]
    before = simulate(Profile.model_validate(d), ops).timeline
    for la, tfn in zip(d["layers"], (9, 7, 5, 3), strict=True):
        la["forward_nograd_temp_bytes"] = tfn
    after = simulate(Profile.model_validate(d), ops).timeline
    tf = [la["forward_temp_bytes"] for la in d["layers"]]
    # F 1 and F 2 (ops 0 and 1) now carry their no-grad transients; every other op is unchanged
    assert [after[0] - before[0], after[1] - before[1]] == [9 - tf[0], 7 - tf[1]]
    assert after[2:] == before[2:]
    bad = d["layers"][0] | {"forward_nograd_temp_bytes": -1}
    with pytest.raises(ValueError, match="forward_nograd_temp_bytes"):
        Profile.model_validate(d | {"layers": [bad, *d["layers"][1:]]})


def test_nothing_but_drops_runs_after_b1():
    """A schedule that recomputes after the step's last backward was scored valid, with its
    records still held: it is invalid at the first such op (docs/chain-model.md section 5)."""
    from memplan.planner._build import one_level_ops
    from memplan.planner.simulate import simulate
    from memplan.profiler.schema import Profile

    prof = Profile(input_bytes=4, layers=[
        dict(name=f"l{i}", forward_s=1.0, backward_s=2.0, output_bytes=4, saved_bytes=4)
        for i in range(3)])
    ops = one_level_ops([(1, 3, False)], 3)
    assert simulate(prof, ops).valid
    bad = simulate(prof, [*ops, ["R", 1]])
    assert not bad.valid and bad.error_index == len(ops)
    assert "the step has ended with B 1" in bad.error
