"""docs/chain-model.md's worked examples, read back from the page and replayed.

Each table of the page that carries a `<!-- doc-test: NAME -->` marker is parsed here and checked
against `memplan.planner.simulate` (bytes live during each op, peak, time), against an
independent ledger of the rules' effects (bytes live after each op), and, where the page says a
schedule is optimal, against the planner and the exhaustive search of tests/planner/oracle.py.
Editing a number on the page without the code agreeing fails here, and so does changing the code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from memplan.planner import _optimal_dp, plan, simulate
from memplan.planner._build import insert_drops
from memplan.planner.checkpoint_dtype import storage_sizes
from memplan.planner.sharding import shard_profile
from memplan.profiler.schema import Profile

from tests.planner.chains import WORKED, chain, worked_example
from tests.planner.oracle import exhaustive_frontier

DOC = Path(__file__).resolve().parents[2] / "docs" / "chain-model.md"


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _marked(name: str) -> tuple[list[dict[str, str]], str]:
    """The table after `<!-- doc-test: name -->` as rows (header -> cell), and the page's text
    after the table."""
    text = _text()
    marker = f"<!-- doc-test: {name} -->"
    assert text.count(marker) == 1, f"docs/chain-model.md must have one {marker!r}"
    lines = text.split(marker, 1)[1].lstrip("\n").splitlines()
    table = []
    for n, line in enumerate(lines):
        if not line.startswith("|"):
            rest = "\n".join(lines[n:])
            break
        table.append([c.strip() for c in line.strip().strip("|").split("|")])
    else:
        rest = ""
    header, body = table[0], table[2:]
    assert body, f"table {name} is empty"
    return [dict(zip(header, row, strict=True)) for row in body], rest


def _summary(rest: str) -> tuple[int, float]:
    """(peak bytes, time s) from the 'Peak N bytes, time M s.' line that follows a table."""
    m = re.match(r"\s*Peak (\d+) bytes, time (\d+) s\.", rest)
    assert m, f"expected 'Peak N bytes, time M s.' after the table, got {rest[:80]!r}"
    return int(m.group(1)), float(m.group(2))


def _op(cell: str) -> list:
    parts = cell.strip("`").split()
    return [parts[0]] if parts[0] == "loss" else [parts[0], int(parts[1])]


def _num(cell: str) -> int:
    return int(cell.replace(",", ""))


def _chain(rows: list[dict[str, str]], **kw) -> Profile:
    """A profile from a chain table (row 0: x_0 only)."""
    assert rows[0]["i"] == "0"
    stages = rows[1:]
    col = {k: [_num(r[k]) for r in stages] for k in ("f_i", "b_i", "s_i", "tf_i", "tb_i")}
    return chain(
        [_num(rows[0]["x_i"])] + [_num(r["x_i"]) for r in stages],
        col["f_i"], col["b_i"], col["s_i"], col["tf_i"], col["tb_i"], **kw,
    )


def _ledger(prof: Profile, ops: list[list]) -> tuple[list[int], list[float]]:
    """Bytes live after each op and cumulative seconds, from the effects and times of the rules
    table (docs/chain-model.md section 5), written apart from the simulator."""
    x = [prof.input_bytes] + [la.output_bytes for la in prof.layers]
    s = [0] + [la.saved_bytes for la in prof.layers]
    f = [0.0] + [la.forward_s for la in prof.layers]
    fn = [0.0] + [la.forward_s if la.forward_nograd_s is None else la.forward_nograd_s
                  for la in prof.layers]
    b = [0.0] + [la.backward_s for la in prof.layers]
    live, t, act = x[0], 0.0, {0}
    after, times = [], []
    for op in ops:
        if op[0] == "loss":
            live += x[-1]
        else:
            i = op[1]
            if op[0] in ("F", "R"):
                if i not in act:
                    live += x[i]
                    act.add(i)
                live += s[i] if op[0] == "R" else 0
                t += f[i] if op[0] == "R" else fn[i]
            elif op[0] == "drop":
                live -= x[i]
                act.discard(i)
            else:
                live += x[i - 1] - x[i] - s[i]
                t += b[i]
        after.append(live)
        times.append(t)
    return after, times


def _check_schedule_table(prof: Profile, name: str) -> list[list]:
    """The table `name` (#, op, during, after, time) and its summary line against a replay."""
    rows, rest = _marked(name)
    ops = [_op(r["op"]) for r in rows]
    assert [_num(r["#"]) for r in rows] == list(range(1, len(rows) + 1))
    sim = simulate(prof, ops)
    assert sim.valid, sim.error
    assert [_num(r["during"]) for r in rows] == sim.timeline
    after, times = _ledger(prof, ops)
    assert [_num(r["after"]) for r in rows] == after
    assert [float(r["time"]) for r in rows] == times
    # the ledger and the replay agree: a drop's "during" is the level before it
    for k in range(len(ops) - 1):
        if ops[k + 1][0] == "drop":
            assert sim.timeline[k + 1] == after[k]
    peak, time_s = _summary(rest)
    assert (sim.peak_bytes, sim.time_s) == (peak, time_s)
    assert times[-1] == time_s
    return ops


def _frontier_table(name: str) -> list[tuple[int, float]]:
    rows, _ = _marked(name)
    return [(_num(r["peak (bytes)"]), float(r["least time (s)"])) for r in rows]


def _pairs(points) -> list[tuple[int, float]]:
    return [(p, t) for p, t, _ in points]


def _check_frontier_table(prof, name: str) -> list[tuple[int, float]]:
    """Check the doc's frontier table `name` against the exhaustive frontier (persistent or not)
    of `prof` and against plan() at each of its peaks; returns its (peak bytes, time s) rows."""
    points = _frontier_table(name)
    assert _pairs(exhaustive_frontier(prof)) == points
    assert _pairs(exhaustive_frontier(prof, persistent=True)) == points
    for peak, time_s in points:
        p = plan(prof, budget_bytes=peak)
        assert (p.predicted.peak_bytes, p.predicted.time_s) == (peak, time_s)
    return points


# section 7


def test_worked_chain_is_the_suites_worked_example():
    rows, _ = _marked("worked-chain")
    prof = _chain(rows)
    assert prof.model_dump(exclude={"name"}) == worked_example().model_dump(exclude={"name"})
    x = [_num(r["x_i"]) for r in rows]
    assert tuple(x) == WORKED["x"]


def test_store_all_table_is_the_replay_of_store_all():
    prof = worked_example()
    ops = _check_schedule_table(prof, "worked-store-all")
    assert ops == plan(prof, strategy="store-all").schedule
    sim = simulate(prof, ops)
    assert sim.overhead == 0 and sim.checkpoints == []
    # section 7.1: keeping a_4 through the backward costs its 4 bytes at B 4
    assert simulate(prof, [op for op in ops if op != ["drop", 4]]).peak_bytes == 34


def test_budget_20_table_is_the_optimal_plan():
    prof = worked_example()
    ops = _check_schedule_table(prof, "worked-budget-20")
    p = plan(prof, budget_bytes=20, strategy="optimal")
    assert p.feasible and p.schedule == ops
    sim = simulate(prof, ops)
    # section 7.2: a_1 the one checkpoint; stages 1-3 run twice; 11 s of recompute
    assert sim.checkpoints == [1] and p.checkpoints == [1]
    assert sim.forward_counts == [2, 2, 2, 1]
    assert sim.recompute_s == 11 and sim.overhead == pytest.approx(11 / 36)


def test_every_budget_table_is_the_exhaustive_frontier():
    prof = worked_example()
    points = _check_frontier_table(prof, "worked-frontier")
    least = points[-1][0]
    p = plan(prof, budget_bytes=least - 1)
    assert not p.feasible and f"the least budget it fits is {least} bytes" in p.message
    # section 7.3's sentence: "the least time within 30 bytes is 39, within 26 it is 43, ..."
    section = _text().split("### 7.3", 1)[1].split("## 8.", 1)[0]
    stated = re.findall(r"within (\d+)(?: bytes)?(?: it)? is (\d+)", section)
    assert len(stated) == 3
    for budget, time_s in stated:
        assert plan(prof, budget_bytes=int(budget)).predicted.time_s == float(time_s)


# section 10.1 and 10.2


def _nograd_chain() -> Profile:
    rows, _ = _marked("nograd-chain")
    assert [_num(r["i"]) for r in rows] == [1, 2, 3, 4]
    prof = chain(**WORKED, tfn=[_num(r["tf'_i"]) for r in rows])
    for layer, r in zip(prof.layers, rows, strict=True):
        layer.forward_nograd_s = float(r["f'_i"])
    return prof


def test_nograd_replay_rows_of_the_budget_20_schedule():
    prof = _nograd_chain()
    base_rows, _ = _marked("worked-budget-20")
    ops = [_op(r["op"]) for r in base_rows]
    base = simulate(worked_example(), ops)
    sim = simulate(prof, ops)
    assert sim.valid
    rows, rest = _marked("nograd-replay")
    _, times = _ledger(prof, ops)
    for r in rows:
        k = _num(r["#"]) - 1
        assert _op(r["op"]) == ops[k] and ops[k][0] == "F"
        assert _num(r["during"]) == sim.timeline[k]
        assert float(r["time"]) == times[k]
    # only the F rows change their bytes; every F op of this schedule is in the table
    shown = {_num(r["#"]) - 1 for r in rows}
    assert shown == {k for k, op in enumerate(ops) if op[0] == "F"}
    for k in range(len(ops)):
        if k not in shown:
            assert sim.timeline[k] == base.timeline[k]
    assert (sim.peak_bytes, sim.time_s) == _summary(rest)
    assert base.time_s - sim.time_s == 3  # section 10.1: 47 -> 44 s


def test_nograd_frontier_and_the_new_20_byte_plan():
    prof = _nograd_chain()
    _check_frontier_table(prof, "nograd-frontier")
    p = plan(prof, budget_bytes=20)
    assert (p.predicted.peak_bytes, p.predicted.time_s) == (20, 46)
    # section 10.2: the reference DP's "F 1, F 2, drop 1, F 3, R 4, loss, ...", a_2 the
    # checkpoint, 46 s (the compiled kernel may keep another split of the same point on a tie)
    ops = insert_drops(_optimal_dp.schedule_ops(_optimal_dp.solve(_optimal_dp.costs_of(prof),
                                                                  cap=20), 20), 4)
    assert [list(op) for op in ops[:6]] == [["F", 1], ["F", 2], ["drop", 1], ["F", 3], ["R", 4],
                                            ["loss"]]
    sim = simulate(prof, ops)
    assert sim.checkpoints == [2] and (sim.peak_bytes, sim.time_s) == (20, 46)


# section 10.3


def test_late_split_tables_and_frontier(monkeypatch):
    rows, _ = _marked("late-chain")
    prof = _chain(rows)
    plain = _check_schedule_table(prof, "late-plain")
    late = _check_schedule_table(prof, "late-split")
    # the plain split is the drops pass over its computations; the late one is the planner's
    compute = [op for op in plain if op[0] != "drop"]
    assert [list(op) for op in insert_drops([tuple(op) for op in compute], 2)] == plain
    p = plan(prof, budget_bytes=11)
    assert p.feasible and p.schedule == late
    store_all = plan(prof, strategy="store-all").predicted
    assert (store_all.peak_bytes, store_all.time_s) == (12, 7)
    assert _pairs(exhaustive_frontier(prof)) == [(12, 7.0), (11, 10.0)]
    c = _optimal_dp.costs_of(prof)
    assert _optimal_dp.late_useful(c) == [False, True, False]
    peaks, times = _optimal_dp.solve(c).top()
    assert (peaks, times) == ([11, 12], [10.0, 7.0])
    # without late splits the recurrence finds nothing below store-all's 12 bytes
    monkeypatch.setattr(_optimal_dp, "late_useful", lambda c: [False] * (c.L + 1))
    assert _optimal_dp.solve(c).top()[0] == [12]


# section 10.8


def _policy_chain() -> Profile:
    """The profile of the `policy-chain` table: rows with policy `all` are the stages, the others
    their policies."""
    rows, _ = _marked("policy-chain")
    assert rows[0]["i"] == "0"
    layers: list[dict] = []
    for r in rows[1:]:
        cost = dict(forward_s=_num(r["f_i"]), backward_s=_num(r["b_i"]), saved_bytes=_num(r["s_i"]),
                    forward_temp_bytes=_num(r["tf_i"]), backward_temp_bytes=_num(r["tb_i"]))
        if r["policy"] == "all":
            assert int(r["i"]) == len(layers) + 1
            layers.append(dict(name=f"s{r['i']}", output_bytes=_num(r["x_i"]), policies=[], **cost))
        else:
            assert int(r["i"]) == len(layers) and _num(r["x_i"]) == layers[-1]["output_bytes"]
            layers[-1]["policies"].append(dict(name=r["policy"], recompute=["aten.gelu"], **cost))
    return Profile(input_bytes=_num(rows[0]["x_i"]), layers=layers)


def test_policy_example_replays_and_is_the_plan():
    prof = _policy_chain()
    rows, rest = _marked("policy-replay")
    ops = [_op(r["op"]) for r in rows]
    policies = {op[1]: r["policy"] for op, r in zip(ops, rows, strict=True)
                if op[0] == "R" and r["policy"] != "all"}
    sim = simulate(prof, ops, policies=policies)
    assert sim.valid, sim.error
    assert [_num(r["during"]) for r in rows] == sim.timeline
    times = []
    for k in range(len(ops)):
        times.append(simulate(prof, ops[:k + 1] + [], policies=policies).time_s)
    assert [float(r["time"]) for r in rows] == times
    for op, r in zip(ops, rows, strict=True):  # the policy column names the record's policy
        if op[0] in ("R", "B"):
            assert r["policy"] == policies.get(op[1], "all")
        else:
            assert r["policy"] == ""
    assert (sim.peak_bytes, sim.time_s) == _summary(rest)
    p = plan(prof, budget_bytes=13)
    assert p.schedule == ops and p.stage_policies == policies
    assert plan(prof.with_policies(None), budget_bytes=13).predicted.time_s == 14


def test_policy_frontier_is_the_exhaustive_one():
    prof = _policy_chain()
    rows, _ = _marked("policy-frontier")

    def col(name):
        return [(_num(r["peak (bytes)"]), float(r[name])) for r in rows if r[name] != "-"]

    without, with_ = col("least time without (s)"), col("least time with (s)")
    assert sorted(_pairs(exhaustive_frontier(prof.with_policies(None), persistent=True))) == without
    from tests.planner.test_policies import oracle_frontier

    assert oracle_frontier(prof) == with_
    c = _optimal_dp.costs_of(prof)
    assert list(zip(*_optimal_dp.solve(c).top(), strict=True)) == with_


# section 10.4


def test_storage_example_replays():
    rows, _ = _marked("storage-chain")
    prof = _chain(rows)
    assert prof.dtype == "float32" and all(la.output_dtype is None for la in prof.layers)
    assert storage_sizes(prof, {1: "bfloat16"}) == ({1: 16}, {1: 0})
    assert storage_sizes(prof, {1: "float8_e4m3fn"}) == ({1: 8}, {1: 32})
    table, rest = _marked("storage-replay")
    ops = [_op(r["op"]) for r in table]
    # the schedule is the drops pass over: F 1..3, loss, F 2, R 3, B 3, R 2, B 2, R 1, B 1
    compute = [("F", 1), ("F", 2), ("F", 3), ("loss",), ("F", 2), ("R", 3), ("B", 3), ("R", 2),
               ("B", 2), ("R", 1), ("B", 1)]
    assert [list(op) for op in insert_drops(compute, 3)] == ops
    peaks, times = {}, set()
    for column, storage in (("as computed", None), ("bfloat16", {1: "bfloat16"}),
                            ("float8_e4m3fn", {1: "float8_e4m3fn"})):
        sim = simulate(prof, ops, storage=storage)
        assert sim.valid, sim.error
        assert [_num(r[column]) for r in table] == sim.timeline, column
        assert sim.converted == ([] if storage is None else [1])
        peaks[column] = sim.peak_bytes
        times.add(sim.time_s)
    m = re.match(r"\s*Peak (\d+) bytes as computed, (\d+) in bfloat16, (\d+) in float8_e4m3fn; "
                 r"time (\d+) s in each\.", rest)
    assert m, rest[:120]
    assert [peaks["as computed"], peaks["bfloat16"], peaks["float8_e4m3fn"]] == [
        int(v) for v in m.groups()[:3]]
    assert times == {float(m.group(4))}


# section 10.5


def test_sharded_fixed_bytes_table():
    # the profile of section 10.5's example: the worked example with 1,000 fp32 AdamW parameters
    # (4,000 + 4,000 + 8,000 bytes, two 4-byte step counters) and 100 bytes of buffers
    prof = worked_example().model_copy(update={
        "fixed_bytes": 16108,
        "meta": {"fixed": {"n_params": 1000, "param_bytes": 4000, "grad_bytes": 4000,
                           "optimizer_bytes": 8008}},
    })
    for layer, pb in zip(prof.layers, (400, 1200, 1600, 800), strict=True):
        layer.param_bytes = pb
    rows, _ = _marked("sharded-fixed")
    assert [_num(r["ZeRO stage"]) for r in rows] == [0, 1, 2, 3]
    for r in rows:
        z = _num(r["ZeRO stage"])
        shard = shard_profile(prof, n_gpus=4, zero_stage=z)
        mem = shard.meta["sharding"]
        assert mem["other_fixed_bytes"] == 108
        assert [mem["weight_bytes"], mem["grad_bytes"], mem["optimizer_bytes"],
                mem["gathered_bytes"], mem["comm_buffer_bytes"], shard.fixed_bytes] == [
            _num(r[k]) for k in ("weights", "gradients", "optimizer", "gathered", "buffers", "F per GPU")]
        p = plan(prof, strategy="store-all", n_gpus=4, zero_stage=z)
        assert p.predicted.peak_bytes == 31
        assert p.predicted.total_peak_bytes == _num(r["total peak (store-all)"])


# section 10.6


def test_macro_stage_costs_table():
    rows, _ = _marked("macro-costs")
    bounds = [tuple(int(v) for v in r["stages"].split("..")) for r in rows]
    g = _optimal_dp.group_costs(_optimal_dp.costs_of(worked_example()), bounds)
    assert g.x[0] == WORKED["x"][0]
    for k, r in enumerate(rows, start=1):
        got = [g.x[k], g.f[k], g.b[k], g.s[k], g.tf_f[k], g.tf_r[k], g.tf_l[k], g.tb[k]]
        want = [_num(r[c]) for c in ("x", "f", "b", "s", "tf_f", "tf_r", "tf_l", "tb")]
        assert got == want, r["stages"]


# cross references


def _headings() -> set[str]:
    """Section numbers of docs/chain-model.md: "7", "7.1", "10.4", ..."""
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[. ]", _text(), flags=re.MULTILINE))


def test_section_references_point_at_existing_sections():
    heads = _headings()
    assert {"5", "9", "10.1", "10.2", "10.3", "10.4", "10.5", "10.6", "12"} <= heads
    refs = []
    for md in sorted(DOC.parent.glob("*.md")):
        text = md.read_text(encoding="utf-8")
        assert "../" + "shared" not in text, f"{md.name} points outside the repository"
        if md == DOC:  # the page's own "section N" and "sections N and M"
            spans = re.findall(r"sections? ((?:\d+(?:\.\d+)?(?:, | and )?)+)", text)
        else:  # "docs/chain-model.md, section 5", "docs/chain-model.md (sections 5 and 9)"
            spans = re.findall(r"chain-model\.md,? \(?sections? ((?:\d+(?:\.\d+)?(?:, | and )?)+)",
                               text)
        for span in spans:
            for num in re.findall(r"\d+(?:\.\d+)?", span):
                refs.append((md.name, num))
    assert any(name != DOC.name for name, _ in refs)
    missing = [(name, num) for name, num in refs if num not in heads]
    assert not missing, f"references to sections docs/chain-model.md does not have: {missing}"


def test_slotted_example():
    prof = worked_example()
    rows, _ = _marked("slotted")
    for r in rows:
        p = plan(prof, budget_bytes=20, mode="slotted", slots=_num(r["slots asked"]),
                 max_gap=float(r["max_gap"]))
        assert p.feasible
        assert p.options["slots"] == _num(r["slots used"])
        assert (p.predicted.time_s, p.predicted.peak_bytes) == (float(r["time (s)"]),
                                                                _num(r["peak (bytes)"]))
        assert p.options["lower_bound_s"] == float(r["lower bound (s)"])
        assert f"{100 * p.options['optimality_gap']:.1f}%".replace(".0%", "%") == r["gap"]


# section 10.9


def _offload_ledger(prof: Profile, ops: list[list], bw: float) -> tuple[list[int], list[float]]:
    """Host bytes at each op and cumulative seconds under the window rule (section 10.9, rules
    1-4), written apart from the simulator: a window op takes max(t, D / bw, H / bw)."""
    x = [prof.input_bytes] + [la.output_bytes for la in prof.layers]
    s = [0] + [la.saved_bytes for la in prof.layers]
    f = [0.0] + [la.forward_s for la in prof.layers]
    b = [0.0] + [la.backward_s for la in prof.layers]
    host, t, D, H, back = 0, 0.0, 0, 0, 0
    hosts, times = [], []
    for op in ops:
        size = {"offload": x, "fetch": x, "offload_record": s, "fetch_record": s}.get(op[0])
        if size is not None:
            if op[0].startswith("offload"):
                host += size[op[1]]
                D += size[op[1]]
            else:
                H += size[op[1]]
                back += size[op[1]]  # leaves the host when its window ends
        elif op[0] in ("R", "B", "F", "loss"):
            t_op = 0.0 if op[0] == "loss" else (b if op[0] == "B" else f)[op[1]]
            t += max(t_op, D / bw, H / bw)
        hosts.append(host)
        if op[0] in ("R", "B", "F", "loss"):
            host -= back
            D = H = back = 0
        times.append(t)
    return hosts, times


def test_offload_replay_table_is_the_plan():
    prof = worked_example()
    rows, rest = _marked("offload-replay")
    ops = [_op(r["op"]) for r in rows]
    assert [_num(r["#"]) for r in rows] == list(range(1, len(rows) + 1))
    p = plan(prof, budget_bytes=20, offload_bandwidth=2.0)
    assert [list(op) for op in p.ops()] == ops  # the optimal plan at 20 bytes and 2 bytes/s
    sim = simulate(prof, ops, offload_bandwidth=2.0)
    assert sim.valid, sim.error
    assert [_num(r["during"]) for r in rows] == sim.timeline
    assert [_num(r["host"]) for r in rows] == sim.host_timeline
    hosts, times = _offload_ledger(prof, ops, 2.0)
    assert [_num(r["host"]) for r in rows] == hosts
    assert [float(r["time"]) for r in rows] == times
    peak, time_s = _summary(rest)
    assert (sim.peak_bytes, sim.time_s, sim.host_peak_bytes) == (peak, time_s, 11)
    assert sim.transfer_wait_s == 0
    slow = simulate(prof, ops, offload_bandwidth=1.0)  # "At 1 byte/s ... 39 s"
    assert (slow.time_s, slow.transfer_wait_s) == (39.0, 3.0)


def test_offload_frontier_table():
    prof = worked_example()
    rows, _ = _marked("offload-frontier")
    columns = {"no offload (s)": None, "host <= 3 bytes (s)": 3, "host <= 6 bytes (s)": 6,
               "host unlimited (s)": -1}
    for name, host in columns.items():
        for r in rows:
            budget, want = _num(r["peak (bytes)"]), float(r[name])
            kw = {} if host is None else {"offload_bandwidth": 2.0}
            if host is not None and host >= 0:
                kw["host_memory_bytes"] = host
            p = plan(prof, budget_bytes=budget, **kw)
            assert p.feasible and p.predicted.time_s == want, (name, budget)
            if host is None:
                continue
            oracle = exhaustive_frontier(prof, persistent=True, offload_bandwidth=2.0,
                                         host_memory_bytes=None if host < 0 else host)
            assert min(t for pk, t, _ in oracle if pk <= budget) == want, (name, budget)
