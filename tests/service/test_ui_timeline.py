"""Memory timelines: the replay op by op (`memplan.planner.timeline`), its PNG
(`memplan.planner.timeline_plot`, `memplan plan --plot`), and a run's measured bytes per op
(`memplan.executor.timeline`, `memplan run --plot`), with the CUDA allocator snapshot on a GPU."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from memplan.executor.timeline import builtin_timeline, measure_timeline, save_timeline
from memplan.planner.schema import PlanError
from memplan.planner.timeline import PlanTimeline, plan_timeline
from memplan.planner.timeline_plot import plot_timeline
from typer.testing import CliRunner

from memplan import planner
from tests.executor.synth import synth_chain, worked_chain

X = [400, 800, 1200, 4]  # a_0, a_1, a_2, a_3 (the loss)
S = [1600, 2000, 40]
TF = [80, 120, 0]
TB = [40, 200, 8]


def three_stage():
    return synth_chain(X, S, TF, TB)


def test_store_all_timeline_by_hand():
    _, _, prof = three_stage()
    plan = planner.plan(prof, strategy="store-all")
    tl = plan_timeline(prof, plan)
    ops = [(op, b) for op, b in zip(tl.ops, tl.predicted_bytes, strict=True) if not op.startswith("drop")]
    x0, x1, x2, x3 = X
    s1, s2, s3 = S
    live_r = [x0, x0 + x1 + s1, x0 + x1 + s1 + x2 + s2]  # live before R 1, R 2, R 3
    want = [
        ("R 1", live_r[0] + x1 + s1 + TF[0]),
        ("R 2", live_r[1] + x2 + s2 + TF[1]),
        ("R 3", live_r[2] + x3 + s3 + TF[2]),
    ]
    assert ops[:3] == want
    assert ops[3][0] == "loss"
    assert [o for o, _ in ops[4:]] == ["B 3", "B 2", "B 1"]
    assert tl.peak_bytes == max(tl.predicted_bytes) == plan.predicted.peak_bytes
    assert [s.role for s in tl.stages] == ["stored"] * 3 and tl.fixed_bytes == prof.fixed_bytes


def test_roles_follow_the_schedule():
    _, _, prof = worked_chain()
    plan = planner.plan(prof, strategy="uniform", k=2)
    tl = plan_timeline(prof, plan)
    counts = [sum(1 for op in plan.schedule if op[0] in ("F", "R") and op[1] == i) for i in range(1, 5)]
    assert [s.forwards for s in tl.stages] == counts
    for s in tl.stages:
        assert s.role == ("recomputed" if s.forwards > 1 else "checkpoint" if s.checkpoint else "stored")
    assert any(s.role == "recomputed" for s in tl.stages)


def test_no_timeline_without_a_schedule():
    _, _, prof = worked_chain()
    plan = planner.plan(prof, strategy="heuristic", budget_bytes=1)
    assert not plan.feasible
    with pytest.raises(PlanError, match="plan: it has no schedule"):
        plan_timeline(prof, plan)


def test_timeline_json_round_trips(tmp_path):
    _, _, prof = worked_chain()
    tl = plan_timeline(prof, planner.plan(prof, strategy="sqrt"))
    path = save_timeline(tl, tmp_path / "t.json")
    raw = json.loads(path.read_text())
    assert raw["format"] == "memplan-timeline/1"
    assert PlanTimeline.model_validate(raw) == tl


def test_plot_is_a_png(tmp_path):
    import matplotlib.image

    _, _, prof = worked_chain()
    tl = plan_timeline(prof, planner.plan(prof, strategy="sqrt"))
    path = plot_timeline(tl.model_copy(update={"measured_bytes": tl.predicted_bytes}), tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(path).shape[:2] == (540, 1080)


@pytest.mark.parametrize(("strategy", "budget", "options"), [
    ("store-all", None, {}), ("sqrt", None, {}), ("uniform", None, {"k": 2}),
    ("heuristic", 24 * 1024, {}),
])
def test_measured_timeline_is_the_replay_to_the_byte(strategy, budget, options):
    # synthetic stages allocate exactly their profile's bytes: every op must match the replay
    stages, a0, prof = worked_chain()
    plan = planner.plan(prof, strategy=strategy, budget_bytes=budget, **options)
    assert plan.feasible, plan.message
    tl = measure_timeline(stages, a0, plan, prof)
    assert tl.measured_device == "cpu" and tl.snapshot is None
    assert len(tl.measured_bytes) == len(plan.schedule)
    assert tl.measured_bytes == tl.predicted_bytes


def test_measured_timeline_refuses_another_models_plan():
    from memplan.executor.report import ExecutorError

    stages, a0, _ = three_stage()
    _, _, other = worked_chain()
    with pytest.raises(ExecutorError, match="plan.n_stages"):
        measure_timeline(stages, a0, planner.plan(other, strategy="sqrt"), other)


def test_plan_cli_plot(tmp_path):
    from memplan.cli import app

    _, _, prof = worked_chain()
    src = tmp_path / "p.json"
    src.write_text(prof.model_dump_json())
    png = tmp_path / "timeline.png"
    r = CliRunner().invoke(app, ["plan", str(src), "--strategy", "sqrt", "--plot", str(png), "--json"])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert f"timeline: {png}" in r.stderr
    json.loads(r.stdout)  # --json stays JSON: the path goes to stderr
    bad = tmp_path / "none.png"
    r = CliRunner().invoke(app, ["plan", str(src), "--strategy", "heuristic", "--budget", "1B",
                                 "--plot", str(bad)])
    assert r.exit_code == 1 and not bad.exists()
    r = CliRunner().invoke(app, ["plan", str(src), "--strategy", "sqrt", "--plot", str(tmp_path / "no" / "t.png")])
    assert r.exit_code == 2 and "--plot: the folder" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.slow
def test_run_cli_plot_keeps_the_measured_timeline(tmp_path):
    from memplan.cli import app

    png = tmp_path / "run.png"
    r = CliRunner().invoke(app, ["run", "--n-layer", "2", "--d-model", "32", "--n-head", "2", "--seq", "16",
                                 "--vocab", "64", "--batch", "2", "--dropout", "0", "--steps", "2",
                                 "--strategy", "sqrt", "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    tl = PlanTimeline.model_validate_json((tmp_path / "run.timeline.json").read_text())
    assert png.read_bytes()[:4] == b"\x89PNG" and f"kept: {png}" in r.stderr
    assert len(tl.measured_bytes) == len(tl.ops) and tl.measured_device == "cpu"
    # the same plan on the same (seeded) model: its largest op is the run's measured peak
    assert report["measured_peak_bytes"] == max(tl.measured_bytes)
    assert tl.peak_bytes == report["predicted_peak_bytes"]


def test_run_cli_plot_is_local_only():
    from memplan.cli import app

    r = CliRunner().invoke(app, ["run", "--server", "http://127.0.0.1:9", "--plot", "x.png"])
    assert r.exit_code == 2 and "--plot" in r.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the allocator snapshot is CUDA's")
def test_cuda_run_keeps_an_allocator_snapshot(tmp_path):
    from memplan.executor.pipeline import RunSpec, run_builtin

    spec = RunSpec(n_layer=2, n_embd=64, n_head=2, block_size=32, vocab_size=128, batch_size=2,
                   dropout=0.0, strategy="sqrt", steps=2, device="cuda")
    report, prof, plan = run_builtin(spec)
    snap = tmp_path / "run.snapshot.pickle"
    tl = builtin_timeline(spec, prof, plan, snapshot=snap)
    assert tl.snapshot == snap.name and tl.measured_device.startswith("cuda")
    data = pickle.loads(snap.read_bytes())
    assert {"segments", "device_traces"} <= set(data)
    assert any(trace for trace in data["device_traces"])  # the step's allocations were recorded
    assert max(tl.measured_bytes) == pytest.approx(report.measured_peak_bytes, rel=0.01)
