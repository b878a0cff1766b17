"""Offload in the replay, the drop pass and the exhaustive oracle (docs/chain-model.md section
10.9): the store-all example with a_1 and record 2 moved to the host, worked by hand; one error
per need; drops around transfers; the oracle's frontier with and without a bandwidth.
"""

from __future__ import annotations

import json

import pytest
from memplan.planner._build import finish_plan, insert_drops
from memplan.planner.schema import Plan, PlanError, parse_schedule
from memplan.planner.simulate import replay, simulate, store_all_time
from memplan.planner.timeline import plan_timeline

from tests.planner.chains import chain, worked_example
from tests.planner.oracle import exhaustive_frontier, is_persistent, memo_time

TRANSFERS = ("offload", "fetch", "offload_record", "fetch_record")

# store-all on the worked chain (docs/chain-model.md section 7.1) with a_1 (pinned by record 2)
# and record 2 offloaded on R 3's window and fetched on B 3's, for B 2
COMPUTE = [("R", 1), ("R", 2), ("offload", 1), ("offload_record", 2), ("R", 3), ("R", 4),
           ("loss",), ("B", 4), ("fetch", 1), ("fetch_record", 2), ("B", 3), ("B", 2), ("B", 1)]
SCHEDULE = [("R", 1), ("R", 2), ("offload", 1), ("offload_record", 2), ("R", 3), ("R", 4),
            ("loss",), ("drop", 4), ("B", 4), ("drop", 3), ("fetch", 1), ("fetch_record", 2),
            ("B", 3), ("drop", 2), ("B", 2), ("drop", 1), ("B", 1)]


def test_transfer_ops_parse_and_come_back_from_a_plan():
    raw = [["offload", 1], ["fetch", 1], ["offload_record", 2], ["fetch_record", 2]]
    assert parse_schedule(raw) == [("offload", 1), ("fetch", 1), ("offload_record", 2),
                                   ("fetch_record", 2)]
    plan = Plan(strategy="x", feasible=True, n_stages=4, schedule=SCHEDULE)
    assert json.loads(plan.model_dump_json())["schedule"][2:4] == [["offload", 1],
                                                                  ["offload_record", 2]]
    assert plan.ops() == SCHEDULE
    with pytest.raises(PlanError, match=r"schedule\[0\]: \['fetch', i\] needs one integer"):
        parse_schedule([["fetch"]])
    with pytest.raises(PlanError, match="unknown op 'upload'; use one of .*offload_record"):
        parse_schedule([["upload", 1]])


def test_insert_drops_places_drops_around_transfers():
    assert insert_drops(COMPUTE, 4) == SCHEDULE
    # without the transfers: exactly store-all's drops (section 7.1)
    plain = [op for op in COMPUTE if op[0] not in TRANSFERS]
    assert insert_drops(plain, 4) == [op for op in SCHEDULE if op[0] not in TRANSFERS]


def test_store_all_with_offload_worked_by_hand():
    # bytes during each op, by hand: R 1 9, R 2 17 (15 after); offload 1 and offload_record 2
    # change nothing on the device (15) and put 3 + 4 on the host; R 3 (their window) runs with
    # them still on the device: 15 + 3 + 1 + 0 = 19, and frees them: 12 after; R 4: 12 + 4 + 4
    # + 2 = 22 (20 after); loss 24; drop 4 24 (20); B 4 20 + 3 = 23 (15); drop 3 15 (12); the
    # fetches 12 and 12; B 3 (their window) 12 + 7 fetched + 4 = 23 (19 after); drop 2 19
    # (15); B 2 18 (10); drop 1 10 (7); B 1 9 (2). Host: 3, then 7 from offload_record 2 until
    # B 3's window ends. Time: R 3's window moves 7 bytes at 1 byte/s while R 3 computes for 4 s:
    # 7 s, 3 s of wait; B 3's window fetches 7 bytes within b_3 = 8 s. 36 + 3 = 39 s.
    sim = simulate(worked_example(), [list(op) for op in SCHEDULE], offload_bandwidth=1)
    assert sim.valid, sim.error
    assert sim.timeline == [9, 17, 15, 15, 19, 22, 24, 24, 23, 15, 12, 12, 23, 19, 18, 10, 9]
    assert sim.host_timeline == [0, 0, 3, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0]
    assert (sim.peak_bytes, sim.host_peak_bytes, sim.offloaded_bytes) == (24, 7, 7)
    assert (sim.time_s, sim.transfer_wait_s) == (39.0, 3.0)
    assert sim.recompute_s == 3.0  # the wait is time over store-all's 36 s
    assert sim.checkpoints == []  # a_1 on the host is pinned by record 2: not a checkpoint
    # at 2 bytes/s both windows hide their copies (3.5 s < f_3 = 4 s, 3.5 s < b_3 = 8 s)
    fast = simulate(worked_example(), [list(op) for op in SCHEDULE], offload_bandwidth=2.0)
    assert (fast.time_s, fast.transfer_wait_s, fast.peak_bytes) == (36.0, 0.0, 24)
    # the fetch waits when the backward is short: b_3 = 1 s, 7 bytes at 2 bytes/s = 3.5 s
    short = worked_example().model_copy(deep=True)
    short.layers[2].backward_s = 1.0
    slow = simulate(short, [list(op) for op in SCHEDULE], offload_bandwidth=2.0)
    assert slow.transfer_wait_s == 2.5 and slow.time_s == store_all_time(short) + 2.5


def test_the_plan_carries_host_peak_and_wait():
    prof = worked_example()
    plan = finish_plan(prof, SCHEDULE, strategy="x", budget_bytes=24, offload_bandwidth=1.0,
                       options={"offload_bandwidth": 1.0})
    assert plan.feasible
    assert (plan.predicted.host_peak_bytes, plan.predicted.transfer_wait_s) == (7, 3.0)
    assert plan.predicted.time_s == 39.0 and plan.predicted.peak_bytes == 24
    tight = finish_plan(prof, SCHEDULE, strategy="x", budget_bytes=24, offload_bandwidth=1.0,
                        host_memory_bytes=6)
    assert not tight.feasible and "host peak 7 bytes exceeds host_memory_bytes 6" in tight.message
    tl = plan_timeline(prof, plan)
    assert tl.ops[2:5] == ["offload 1", "offload_record 2", "R 3"]
    assert tl.predicted_host_bytes == [0, 0, 3, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0]
    assert (tl.host_peak_bytes, tl.transfer_wait_s, tl.peak_bytes) == (7, 3.0, 24)
    # without transfers the old fields stay at their defaults
    sa = finish_plan(prof, [op for op in SCHEDULE if op[0] not in TRANSFERS], strategy="x",
                     budget_bytes=None)
    assert (sa.predicted.host_peak_bytes, sa.predicted.transfer_wait_s) == (0, 0.0)
    assert plan_timeline(prof, sa).predicted_host_bytes is None


def test_a_dropped_host_copy_frees_host_bytes():
    # a_1 is read by F 2 only; offloaded with R 3, never read again: the drop pass drops it
    # right after its window, from the host
    compute = [("F", 1), ("F", 2), ("offload", 1), ("R", 3), ("R", 4), ("loss",), ("B", 4),
               ("B", 3), ("R", 1), ("R", 2), ("B", 2), ("B", 1)]
    ops = insert_drops(compute, 4)
    assert ops[:6] == [("F", 1), ("F", 2), ("offload", 1), ("R", 3), ("drop", 1), ("R", 4)]
    sim = replay(worked_example(), ops, offload_bandwidth=1.0)
    assert sim.valid, sim.error
    # F 1 6 (4 after), F 2 10 (8), offload 1 8, R 3 8 + 3 + 1 = 12 with a_1 still on the
    # device, 9 after it leaves; the drop frees its 3 host bytes, not device bytes
    assert sim.timeline[:6] == [6, 10, 8, 12, 9, 19]
    assert sim.host_timeline[:6] == [0, 0, 3, 3, 3, 0]
    assert sim.host_peak_bytes == 3 and sim.offloaded_bytes == 3


def _run(ops, bw=1.0, prof=None):
    return replay(prof or worked_example(), parse_schedule(ops), offload_bandwidth=bw)


FWD = [["R", 1], ["R", 2]]


@pytest.mark.parametrize(
    ("ops", "bw", "index", "needle"),
    [
        # bandwidth
        (FWD + [["offload", 1], ["R", 3]], None, 2, "offload needs offload_bandwidth > 0"),
        (FWD + [["offload_record", 2], ["R", 3]], 0, 2, "offload_record needs offload_bandwidth > 0"),
        # offload: a_i live on the device, nothing pending
        ([["R", 1], ["offload", 2]], 1.0, 1, "a_2 is not live on the device"),
        ([["R", 1], ["offload", 0]], 1.0, 1, "a_0 (the input) is never offloaded"),
        ([["R", 1], ["offload", 5]], 1.0, 1, "stage index 5 is out of range 1..4"),
        (FWD + [["offload", 1], ["offload", 1]], 1.0, 3, "offload 1 (op 2) is already pending"),
        (FWD + [["offload", 1], ["R", 3], ["offload", 1]], 1.0, 4, "a_1 is already on the host"),
        # offload_record: record i live on the device
        ([["R", 1], ["F", 2], ["offload_record", 2]], 1.0, 2, "stage 2 has no live record"),
        (FWD + [["offload_record", 2], ["R", 3], ["offload_record", 2]], 1.0, 4,
         "the record of stage 2 is already on the host"),
        # fetch: on the host, its offload's window done
        (FWD + [["fetch", 1]], 1.0, 2, "a_1 is not on the host (offload 1 puts it there)"),
        (FWD + [["offload", 1], ["fetch", 1]], 1.0, 3, "offload 1 (op 2) is already pending"),
        (FWD + [["fetch_record", 2]], 1.0, 2, "the record of stage 2 is not on the host"),
        # reading what is on the host
        ([["F", 1], ["offload", 1], ["R", 2], ["R", 3]], 1.0, 2, None),  # valid so far: a window
        ([["R", 1], ["offload", 1], ["F", 2], ["F", 2]], 1.0, 3,
         "a_1 is on the host; fetch it (fetch 1) with the op before"),
        (FWD + [["R", 3], ["R", 4], ["offload", 4], ["R", 4]], 1.0, 5,
         "a_4 has a transfer pending in this op's window (offload 4)"),
        # the loss reads a_L
        (FWD + [["R", 3], ["R", 4], ["offload", 4], ["F", 1], ["loss"]], 1.0, 6,
         "a_4 is on the host; fetch it (fetch 4) with the op before"),
        # B i reads its record and a_{i-1}
        (FWD + [["R", 3], ["offload_record", 3], ["R", 4], ["loss"], ["B", 4], ["B", 3]], 1.0, 7,
         "the record of stage 3 is on the host; fetch it (fetch_record 3) with the op before"),
        (FWD + [["R", 3], ["offload", 2], ["R", 4], ["loss"], ["B", 4], ["B", 3]], 1.0, 7,
         "a_2 is on the host; fetch it (fetch 2) with the op before"),
        # a window op cannot read what its window fetches
        (FWD + [["R", 3], ["offload", 2], ["R", 4], ["loss"], ["B", 4], ["fetch", 2], ["B", 3]],
         1.0, 8, "a_2 is still on the host during this op (fetch 2 rides on it)"),
        (FWD + [["R", 3], ["offload_record", 3], ["R", 4], ["loss"], ["B", 4],
                ["fetch_record", 3], ["B", 3]], 1.0, 8,
         "the record of stage 3 is still on the host during this op (fetch_record 3 rides"),
        # B i cannot carry the offload of the record it frees
        (FWD + [["R", 3], ["R", 4], ["loss"], ["offload_record", 4], ["B", 4]], 1.0, 6,
         "the record of stage 4 is being offloaded in this op's window, but B 4 frees it"),
        # R i with its record on the host; F i with a_i on the host
        (FWD + [["offload_record", 2], ["R", 3], ["R", 2]], 1.0, 4,
         "stage 2 already has a live record"),
        ([["F", 1], ["F", 2], ["offload", 2], ["F", 1], ["F", 2]], 1.0, 4,
         "a_2 is on the host; drop it (drop 2) or fetch it before computing it again"),
        # drop: nothing pending; a host copy pinned by a record stays
        (FWD + [["offload", 1], ["drop", 1]], 1.0, 3, "a_1 has a transfer pending (offload 1"),
        (FWD + [["offload", 1], ["R", 3], ["drop", 1]], 1.0, 4,
         "a_1 is pinned by the live record of stage 2"),
        # a transfer needs a compute op after it
        (FWD + [["R", 3], ["R", 4], ["loss"], ["B", 4], ["B", 3], ["B", 2], ["B", 1],
                ["offload", 1]], 1.0, 9,
         "no compute op follows it to carry it"),
    ],
)
def test_every_need_is_named(ops, bw, index, needle):
    sim = _run(ops, bw)
    assert not sim.valid
    if needle is None:  # the schedule is only short: its transfers were fine
        assert "the schedule ends before it" in sim.error
        return
    assert sim.error_index == index, sim.error
    assert needle in sim.error, sim.error
    assert sim.error.startswith(f"op {index} {ops[index]}: ")


def test_the_window_op_may_read_what_it_offloads():
    sim = _run([["F", 1], ["offload", 1], ["F", 2], ["drop", 1]], 1.0)
    # F 2 reads a_1 while it moves; after the window a_1 is on the host, where drop frees it
    assert "the schedule ends before it" in sim.error  # no earlier rule broken
    assert sim.timeline == [6, 4, 10, 5] and sim.host_timeline == [0, 3, 3, 3]


def test_refusals_raise_plan_errors():
    prof = worked_example()
    ops = parse_schedule([list(op) for op in SCHEDULE])
    with pytest.raises(PlanError, match="offload ops and checkpoint_dtypes are not planned "
                       "together") as err:
        replay(prof, ops, {1: "bfloat16"}, offload_bandwidth=1.0)
    assert err.value.field == "checkpoint_dtypes"
    for bad in (-1.0, float("nan"), "fast", True):
        with pytest.raises(PlanError) as err:
            replay(prof, ops, offload_bandwidth=bad)
        assert err.value.field == "offload_bandwidth"


def _pairs(front):
    return [(pk, tm) for pk, tm, _ in front]


def _check_points(prof, front, bw, host=None):
    """Each oracle schedule replays to its point, within the host budget."""
    for pk, tm, ops in front:
        sim = replay(prof, [tuple(op) for op in ops], offload_bandwidth=bw)
        assert sim.valid, (sim.error, ops)
        assert (sim.peak_bytes, sim.time_s) == (pk, pytest.approx(tm, rel=1e-12, abs=1e-12))
        if host is not None:
            assert sim.host_peak_bytes <= host


SMALL = [
    worked_example(),
    chain([2, 3, 1, 4], [2, 1, 3], [3, 2, 5], [2, 4, 1], [1, 0, 2], [0, 1, 0], name="three"),
    chain([1, 5, 2, 6], [1, 4, 2], [2, 6, 3], [3, 0, 5], name="uneven"),
]


# each chain's frontier as the oracle found it before it searched transfers (the same with and
# without `persistent` on these chains)
BEFORE_OFFLOAD = {
    "three": [(21, 16.0), (17, 17.0), (15, 19.0), (14, 21.0)],
    "uneven": [(28, 18.0), (25, 19.0), (20, 23.0)],
}


@pytest.mark.parametrize("prof", SMALL[1:], ids=lambda p: p.name)
def test_without_bandwidth_the_oracle_is_todays(prof):
    # with no bandwidth (or no host memory) no transfer is searched: the frontier found before,
    # the persistent one matching the independent memoised recursion at every point
    for persistent in (False, True):
        plain = exhaustive_frontier(prof, persistent=persistent)
        assert _pairs(plain) == BEFORE_OFFLOAD[prof.name]
        assert not any(op[0] in TRANSFERS for _, _, ops in plain for op in ops)
        assert exhaustive_frontier(prof, persistent=persistent, offload_bandwidth=None) == plain
        assert exhaustive_frontier(prof, persistent=persistent, offload_bandwidth=0.0) == plain
        assert _pairs(exhaustive_frontier(prof, persistent=persistent, offload_bandwidth=3.0,
                                          host_memory_bytes=0)) == _pairs(plain)
    for pk, tm, ops in exhaustive_frontier(prof, persistent=True):
        assert memo_time(prof, pk) == tm
        assert is_persistent(ops)


@pytest.mark.parametrize("prof", SMALL[1:], ids=lambda p: p.name)
@pytest.mark.parametrize("bw", [0.5, 4.0])
def test_oracle_schedules_replay_to_their_points(prof, bw):
    front = exhaustive_frontier(prof, persistent=True, offload_bandwidth=bw)
    _check_points(prof, front, bw)
    capped = exhaustive_frontier(prof, persistent=True, offload_bandwidth=bw, host_memory_bytes=2)
    _check_points(prof, capped, bw, host=2)
    # more memory on the host never makes a budget slower
    for pk, tm in _pairs(capped):
        assert min(t for p, t in _pairs(front) if p <= pk) <= tm


def test_free_transfers_lower_the_peak_at_store_all_time():
    # at an unbounded bandwidth every copy hides behind compute: store-all time (36 s) at a far
    # lower peak than the 31 bytes of storing everything on the device (section 7.1)
    prof = worked_example()
    plain = exhaustive_frontier(prof, persistent=True)
    fast = exhaustive_frontier(prof, persistent=True, offload_bandwidth=1e12)
    assert plain[0][:2] == (31, 36.0)
    assert fast[0][:2] == (20, 36.0)
    _check_points(prof, fast, 1e12)
    assert any(op[0] in TRANSFERS for op in fast[0][2])


def test_offloading_a_kept_input_on_the_forward_that_reads_it():
    # a_1 made by F 1, moved to the host while R 2 runs (it reads and pins a_1), back with B 3
    # beside record 2: 19 bytes in 24 s, where recompute alone needs 26 s within 19 bytes. By
    # hand: R 2's window moves 2 bytes in 4 s (f_2 = 4 s), R 3's 2 bytes in 4 s (f_3), B 3's
    # fetches 4 bytes in 8 s against b_3 = 6 s: 2 s of wait; 22 s of compute + 2 = 24 s.
    # (An offload riding on the forward that reads the tensor is outside the DP's class,
    # docs/chain-model.md section 10.9: the replay prices it all the same.)
    prof = chain([4, 2, 1, 4], [1, 4, 4], [5, 1, 6], [3, 2, 5], [1, 0, 2], [0, 0, 0], name="pin")
    assert _pairs(exhaustive_frontier(prof, persistent=True)) == [(25, 21.0), (22, 22.0),
                                                                   (18, 26.0)]
    ops = parse_schedule([["F", 1], ["offload", 1], ["R", 2], ["offload_record", 2], ["R", 3],
                          ["loss"], ["drop", 3], ["fetch", 1], ["fetch_record", 2], ["B", 3],
                          ["drop", 2], ["B", 2], ["drop", 1], ["R", 1], ["drop", 1], ["B", 1]])
    sim = replay(prof, ops, offload_bandwidth=0.5)
    assert sim.valid, sim.error
    assert (sim.peak_bytes, sim.time_s, sim.host_peak_bytes, sim.transfer_wait_s) == (19, 24.0, 4,
                                                                                     2.0)
    assert sim.timeline == [7, 6, 9, 7, 18, 18, 18, 14, 14, 19, 10, 11, 8, 12, 11, 13]
    assert sim.host_timeline == [0, 2, 2, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0]
