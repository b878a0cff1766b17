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
])
def test_run_bad_input_exit_2(args, message):
    res = runner.invoke(app, ["run", *TINY, *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
