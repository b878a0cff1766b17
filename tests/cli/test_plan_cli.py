"""`memplan plan` and `memplan simulate` as a user meets them: tables, JSON, exit codes, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from memplan.planner.units import format_bytes, parse_bytes
from typer.testing import CliRunner

from memplan.cli import app
from tests.planner.chains import worked_example

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    path = tmp_path / "worked.json"
    path.write_text(worked_example().model_dump_json())
    return path


def test_plan_table_and_json(profile_path):
    res = runner.invoke(app, ["plan", str(profile_path), "--budget", "30", "--strategy", "uniform"])
    assert res.exit_code == 0, res.output
    assert "recomputed (x2)" in res.output and "feasible" in res.output
    res = runner.invoke(app, ["plan", str(profile_path), "--budget", "30", "--strategy", "uniform",
                              "--json"])
    data = json.loads(res.stdout)
    assert data["feasible"] is True and data["predicted"]["peak_bytes"] == 21
    assert data["schedule"][0] == ["F", 1]


def test_infeasible_plan_exits_1_with_the_reason(profile_path):
    res = runner.invoke(app, ["plan", str(profile_path), "--budget", "16", "--strategy", "sqrt"])
    assert res.exit_code == 1
    assert "exceeds the budget of 16 bytes" in res.output


def test_memory_option_subtracts_fixed_bytes(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(worked_example().model_copy(update={"fixed_bytes": 100}).model_dump_json())
    res = runner.invoke(app, ["plan", str(path), "--memory", "131", "--strategy", "store-all",
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["budget_bytes"] == 31
    res = runner.invoke(app, ["plan", str(path), "--memory", "50"])  # infeasible: exit code 1
    assert res.exit_code == 1 and "model states alone need 100 bytes" in res.stdout


@pytest.mark.parametrize(
    ("content", "args", "needle"),
    [
        ("{not json", [], "is not valid JSON (line 1"),
        ('{"input_bytes": 1, "layers": []}', [], "layers"),
        (None, ["--budget", "lots"], "--budget: cannot read 'lots' as a size"),
        (None, ["--strategy", "magic"], "strategy: unknown 'magic'"),
        (None, ["--budget", "-5"], "--budget: must be non-negative"),
        (None, ["--max-overhead", "twenty"], "--max-overhead: expected a fraction or a percentage"),
        (None, ["--max-overhead", "-20%"], "--max-overhead: expected a finite fraction"),
        (None, ["--budget", str(2**62)], "--budget: at most 2^60 bytes"),
        (None, ["--strategy", "sqrt", "--k", "2"], "--k: strategy 'sqrt' takes no such option"),
        (None, ["--strategy", "uniform", "--k", "9"], "--k: the segment length must be an integer in 1..4"),
        (None, ["--gpus", "0"], "--gpus: expected an integer from 1"),
        (None, ["--mode", "fast"], "--mode: expected one of auto, exact, memo, banded, slotted or "
                                   "grouped, got 'fast'"),
        (None, ["--max-gap", "tiny"], "--max-gap: expected a fraction or a percentage"),
        (None, ["--max-gap", "-1%"], "--max-gap: expected a finite fraction from 0 to 10"),
        (None, ["--strategy", "sqrt", "--mode", "exact"], "--mode: strategy 'sqrt' takes no such option"),
        (None, ["--budget", "30", "--mode", "banded", "--max-overhead", "0.2"], "--mode: 'banded' needs"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, profile_path, content, args, needle):
    path = profile_path
    if content is not None:
        path = tmp_path / "bad.json"
        path.write_text(content)
    res = runner.invoke(app, ["plan", str(path), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.stderr
    assert "Traceback" not in res.output and res.stderr.count("\n") == 1


def test_missing_file_is_named():
    res = runner.invoke(app, ["plan", "/nonexistent/p.json"])
    assert res.exit_code == 2 and "no such file '/nonexistent/p.json'" in res.stderr


def test_simulate_refuses_a_plan_made_for_another_model(tmp_path, profile_path):
    """A Plan carries its profile's fingerprint: replayed over another model's profile (same stage
    count, other sizes) it is refused in one line; its schedule list alone replays anywhere."""
    plan_json = tmp_path / "p.json"
    res = runner.invoke(app, ["plan", str(profile_path), "--strategy", "sqrt", "--json"])
    plan_json.write_text(res.stdout)
    other = tmp_path / "other.json"
    data = json.loads(profile_path.read_text())
    data["layers"][0]["output_bytes"] += 1
    other.write_text(json.dumps(data))
    assert runner.invoke(app, ["simulate", str(profile_path), str(plan_json)]).exit_code == 0
    res = runner.invoke(app, ["simulate", str(other), str(plan_json)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert res.stderr.startswith("error: schedule: the plan was made for another model")
    ops = tmp_path / "ops.json"
    ops.write_text(json.dumps(json.loads(plan_json.read_text())["schedule"]))
    assert runner.invoke(app, ["simulate", str(other), str(ops)]).exit_code == 0


def test_simulate_reports_validity(tmp_path, profile_path):
    sched = tmp_path / "s.json"
    sched.write_text(json.dumps([["R", 1], ["R", 2], ["R", 3], ["R", 4], ["loss"], ["drop", 4],
                                 ["B", 4], ["B", 3], ["B", 2], ["B", 1]]))
    res = runner.invoke(app, ["simulate", str(profile_path), str(sched), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    # without the drops, B 3 runs with a_3 still live: 22 + x_2 = 26 instead of 23
    assert data["peak_bytes"] == 31 and data["timeline"][7] == 26
    sched.write_text(json.dumps([["B", 4]]))
    res = runner.invoke(app, ["simulate", str(profile_path), str(sched)])
    assert res.exit_code == 1 and "invalid: op 0" in res.output
    sched.write_text(json.dumps([["Z", 4]]))
    res = runner.invoke(app, ["simulate", str(profile_path), str(sched)])
    assert res.exit_code == 2 and "unknown op 'Z'" in res.stderr


def test_plan_command_does_not_import_torch(profile_path):
    code = (
        "import sys; from memplan.cli import app\n"
        f"app(['plan', {str(profile_path)!r}, '--budget', '30', '--json'], standalone_mode=False)\n"
        "assert 'torch' not in sys.modules, 'memplan plan imported torch'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_help_does_not_import_torch():
    code = (
        "import sys; from memplan.cli import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "plan" in res.stdout


def test_byte_units():
    assert parse_bytes("24GiB") == 24 * 2**30
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("1.5e9") == 1_500_000_000
    assert parse_bytes(" 512 MiB ") == 512 * 2**20
    assert parse_bytes(7) == 7
    # exact past a float's 53 bits: what is typed is what is planned (and what a refusal quotes)
    assert parse_bytes("9007199254740993") == 2**53 + 1
    assert parse_bytes("1152921504606846977") == 2**60 + 1
    assert parse_bytes("9223372036854775807") == 2**63 - 1
    assert parse_bytes("1EiB") == 2**60 and parse_bytes("1PiB") == 2**50 and parse_bytes("2PB") == 2 * 10**15
    for bad in ("-1", "12 parsecs", "", "nan", "1e400"):
        with pytest.raises(ValueError, match="budget"):
            parse_bytes(bad)
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(12) == "12 B"


def test_max_overhead_takes_a_percentage(profile_path):
    as_fraction = runner.invoke(app, ["plan", str(profile_path), "--max-overhead", "0.2", "--json"])
    as_percent = runner.invoke(app, ["plan", str(profile_path), "--max-overhead", "20%", "--json"])
    assert as_fraction.exit_code == as_percent.exit_code == 0, as_percent.output
    percent, fraction = json.loads(as_percent.stdout), json.loads(as_fraction.stdout)
    assert percent["predicted"] == fraction["predicted"] and percent["schedule"] == fraction["schedule"]
    assert percent["predicted"]["peak_bytes"] == 21  # chain model: 43 s within +20%


def test_frontier_points_are_validated_in_one_line(profile_path):
    res = runner.invoke(app, ["frontier", str(profile_path), "--points", "1"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "--points: expected an integer >= 2" in res.stderr


def test_plan_with_offload_table_json_and_simulate(profile_path, tmp_path):
    # the chain model's worked example at budget 20 (docs/chain-model.md section 10.9): 47 s by
    # recompute alone, 36 s (the store-all time) when records ride to the host at 2 bytes/s
    res = runner.invoke(app, ["plan", str(profile_path), "--budget", "20", "--offload-bandwidth",
                              "2B/s", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["predicted"]["time_s"] == 36 and data["predicted"]["peak_bytes"] == 20
    assert data["predicted"]["host_peak_bytes"] == 11 and data["predicted"]["transfer_wait_s"] == 0
    assert data["options"]["offload_bandwidth"] == 2.0
    moved = {(op[0], op[1]) for op in data["schedule"] if op[0].startswith(("offload", "fetch"))}
    assert {("offload", 1), ("fetch", 1), ("offload_record", 2), ("fetch_record", 2)} <= moved
    from memplan import planner

    assert data["schedule"] == [list(op) for op in planner.plan(
        worked_example(), budget_bytes=20, offload_bandwidth=2.0).schedule]
    # the table: what each stage sends to the host, the host peak and the transfer wait
    res = runner.invoke(app, ["plan", str(profile_path), "--budget", "20", "--offload-bandwidth",
                              "2"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    assert "offloaded" in res.output and "output, record" in res.output
    assert "offload at 2 B/s each way: 4 tensors moved to host memory" in res.output
    assert "host peak: 11 B (11 B)" in res.output and "transfer wait: 0 s" in res.output
    # a host budget of 6 bytes: 43 s
    res = runner.invoke(app, ["plan", str(profile_path), "--budget", "20", "--offload-bandwidth",
                              "2", "--host-memory", "6", "--json"])
    data6 = json.loads(res.stdout)
    assert data6["predicted"]["time_s"] == 43 and data6["predicted"]["host_peak_bytes"] <= 6
    # simulate takes the bandwidth from the Plan, or from --offload-bandwidth for a bare list
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(data))
    res = runner.invoke(app, ["simulate", str(profile_path), str(plan_path), "--json"])
    assert res.exit_code == 0, res.output
    sim = json.loads(res.stdout)
    assert sim["time_s"] == 36 and sim["host_peak_bytes"] == 11 and sim["offload_bandwidth"] == 2.0
    ops_path = tmp_path / "ops.json"
    ops_path.write_text(json.dumps(data["schedule"]))
    res = runner.invoke(app, ["simulate", str(profile_path), str(ops_path)])
    assert res.exit_code == 1 and "needs offload_bandwidth > 0" in res.output
    res = runner.invoke(app, ["simulate", str(profile_path), str(ops_path), "--offload-bandwidth",
                              "1", "--json"])
    slow = json.loads(res.stdout)  # half the bandwidth: 3 s of the step wait for copies
    assert res.exit_code == 0 and slow["time_s"] == 39 and slow["transfer_wait_s"] == 3


def test_offload_bandwidth_units_and_errors(profile_path):
    from memplan.cli.plan import parse_bandwidth

    assert parse_bandwidth("25GB/s", "--x") == 25e9
    assert parse_bandwidth("25GiB/s", "--x") == 25 * 2**30
    assert parse_bandwidth(" 12e9 ", "--x") == 12e9 and parse_bandwidth("64 GB", "--x") == 64e9
    for args, needle in [
        (["--offload-bandwidth", "fast"], "--offload-bandwidth: cannot read 'fast' as bytes per second"),
        (["--offload-bandwidth", "-1GB/s"], "--offload-bandwidth: "),
        (["--host-memory", "6"], "--host-memory: bounds the host memory of offloaded activations, "
         "and nothing is offloaded without --offload-bandwidth; give --offload-bandwidth"),
        (["--offload-bandwidth", "2", "--host-memory", "lots"], "--host-memory: cannot read 'lots'"),
        (["--offload-bandwidth", "2", "--strategy", "uniform"],
         "--offload-bandwidth: strategy 'uniform' takes no such option"),
        (["--offload-bandwidth", "2", "--checkpoint-dtype", "bf16"],
         "--checkpoint-dtype: 'bf16' with --offload-bandwidth"),
    ]:
        res = runner.invoke(app, ["plan", str(profile_path), "--budget", "20", *args])
        assert res.exit_code == 2 and res.stderr.count("\n") == 1, (args, res.output)
        assert needle in res.stderr, res.stderr
    # 0 is no offload: today's plan
    zero = runner.invoke(app, ["plan", str(profile_path), "--budget", "20", "--offload-bandwidth",
                               "0", "--json"])
    plain = runner.invoke(app, ["plan", str(profile_path), "--budget", "20", "--json"])
    assert json.loads(zero.stdout)["schedule"] == json.loads(plain.stdout)["schedule"]
    assert json.loads(plain.stdout)["predicted"]["time_s"] == 47


def test_offload_plans_without_torch_or_a_device(profile_path):
    # planning offload is arithmetic: no torch, no CUDA (only running the plan needs a device)
    code = (
        "import sys; from memplan.cli import app\n"
        f"app(['plan', {str(profile_path)!r}, '--budget', '20', '--offload-bandwidth', '2B/s', "
        "'--json'], standalone_mode=False)\n"
        "assert 'torch' not in sys.modules, 'memplan plan imported torch'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["predicted"]["host_peak_bytes"] == 11



def test_mode_and_max_gap_reach_the_optimal_planner(tmp_path):
    """`--mode` and `--max-gap` are the planner's `mode` and `max_gap`: a 300-stage random chain
    planned banded says its mode and a certified gap within the one asked for, and its frontier
    asked for banded is banded down to where that mode reaches."""
    import random

    from tests.planner.chains import chain

    r, L = random.Random(3), 300
    prof = chain([r.randint(1, 6) for _ in range(L + 1)], [r.randint(1, 6) for _ in range(L)],
                 [r.randint(1, 6) for _ in range(L)], [r.randint(0, 6) for _ in range(L)])
    path = tmp_path / "long.json"
    path.write_text(prof.model_dump_json())
    store = runner.invoke(app, ["plan", str(path), "--strategy", "store-all", "--json"])
    budget = str(json.loads(store.stdout)["predicted"]["peak_bytes"] // 4)
    res = runner.invoke(app, ["plan", str(path), "--budget", budget, "--mode", "banded",
                              "--max-gap", "0.5%", "--json"])
    assert res.exit_code == 0, res.output
    options = json.loads(res.stdout)["options"]
    assert options["mode"] == "banded" and 0 <= options["optimality_gap"] <= 0.005
    frontier = runner.invoke(app, ["frontier", str(path), "--mode", "banded", "--points", "3",
                                   "--json"])
    assert frontier.exit_code == 0, frontier.output
    points = json.loads(frontier.stdout)["points"]
    # banded where its upper run reaches, grouped below it (NOTE [ the frontier's modes ])
    assert points[-1]["mode"] == "banded" and {p["mode"] for p in points} <= {"banded", "grouped"}
    assert all(0 <= p["lower_bound_s"] <= p["time_s"] for p in points)
    assert all(p["optimality_gap"] < 0.01 for p in points if p["mode"] == "banded")


def test_simulate_replays_a_plans_checkpoint_storage(tmp_path):
    """A Plan that stores a checkpoint in bf16 replays at its own peak (it replayed at the
    unconverted one, over its budget), and a bad storage map is one line naming the entry."""
    prof = tmp_path / "p.json"
    res = runner.invoke(app, ["profile", "--model", "gpt", "--n-layer", "4", "--d-model", "32",
                              "--n-head", "2", "--seq", "16", "--vocab", "64", "--batch", "4",
                              "--dropout", "0", "--attention", "flash", "--precision", "fp32",
                              "--analytic", "--out", str(prof)])
    assert res.exit_code == 0, res.output
    budget = 195_000  # below the fp32 plan's 198,788 bytes: one checkpoint goes to bf16
    out = runner.invoke(app, ["plan", str(prof), "--budget", str(budget), "--checkpoint-dtype", "bf16",
                              "--tolerance", "0.05", "--json"])
    plan = json.loads(out.stdout)
    assert plan["checkpoint_dtypes"], "the plan stores no checkpoint in bf16 at this budget"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    sim = json.loads(runner.invoke(app, ["simulate", str(prof), str(tmp_path / "plan.json"),
                                         "--json"]).stdout)
    assert sim["valid"] and sim["peak_bytes"] == plan["predicted"]["peak_bytes"] <= budget
    (tmp_path / "bad.json").write_text(json.dumps({**plan, "checkpoint_dtypes": {"1": "int8"}}))
    bad = runner.invoke(app, ["simulate", str(prof), str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "checkpoint_dtypes[1]: unknown dtype 'int8'" in bad.stderr
