"""Exit codes of `memplan run` (issue 19, item 6): 0 ok, 1 infeasible (a budget nothing meets) or
a mismatch, 2 bad input, each with one line on stderr."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from memplan.cli import app

runner = CliRunner()
TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "2", "--seq", "8", "--vocab", "64",
        "--batch", "2", "--dropout", "0", "--steps", "1"]


@pytest.mark.parametrize("strategy", ["optimal", "sqrt", "store-all"])
def test_run_at_a_budget_nothing_meets_is_infeasible_exit_1(strategy):
    res = runner.invoke(app, ["run", *TINY, "--budget", "10", "--strategy", strategy])
    assert isinstance(res.exception, (SystemExit, type(None))), repr(res.exception)
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infeasible: --budget: ")
    assert "Traceback" not in res.output


@pytest.mark.parametrize(("args", "message"), [
    (["--budget", "lots"], "--budget: cannot read 'lots' as a size"),
    (["--budget", "-1"], "--budget: must be non-negative (at least 0 bytes), got '-1'"),
    (["--strategy", "fastest"], "--strategy"),
    (["--d-model", "0"], "--d-model: must be a positive integer, got 0"),
    (["--seq", "0"], "--seq: must be a positive integer, got 0"),
    (["--batch", "0"], "--batch: must be a positive integer, got 0"),
    (["--n-head", "3", "--d-model", "32"], "--n-head: n_embd (32) must be divisible by n_head (3)"),
    (["--steps", "0"], "--steps: expected an integer of at least 1, got 0"),
])
def test_run_bad_input_exit_2(args, message):
    res = runner.invoke(app, ["run", *TINY, *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_one_step_is_not_timed_and_says_so():
    """With --steps 1 the one step measures memory (the accounting slows it): its time is not
    measured, so the report says none (null, "-") rather than 0 s."""
    import json

    res = runner.invoke(app, ["run", *TINY, "--strategy", "sqrt", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["measured_time_s"] is None and report["time_error_pct"] is None
    assert [r["schedule_s"] for r in report["step_records"]] == [None]
    res = runner.invoke(app, ["run", *TINY[:-1], "3", "--strategy", "sqrt", "--json"])
    report = json.loads(res.stdout)
    assert report["measured_time_s"] > 0 and report["step_records"][-1]["schedule_s"] is None


def test_the_early_exit_record_is_printed_in_words():
    """`memplan run --features exit` says how many sequences left at each exit and what they ran,
    not the raw record (a dict of lists)."""
    from memplan.cli.run import _exit_summary

    record = {"decisions": {"2": [True, False, True, False], "4": [False, True, False, False]},
              "per_sample_blocks": [2, 4, 2, 6], "per_sample_block_flops": [20.0, 40.0, 20.0, 60.0],
              "full_block_flops": 60.0}
    assert _exit_summary(record) == ("sequences exited: 2 of 4 after block 2, 1 of 4 after block 4; "
                                     "blocks run per sequence 2-6 (58% of the full blocks' FLOPs)")
