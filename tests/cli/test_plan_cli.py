"""`memplan plan` and `memplan simulate` as a user meets them: tables, JSON, exit codes, errors."""

from __future__ import annotations

import json
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
    for bad in ("-1", "12 parsecs", "", "nan"):
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
