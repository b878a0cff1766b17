"""The CLI as a test drives it: `run_cli(*args)`, and `one_error_line(result)`, the check that bad
input got one clear line on stderr, exit code 2 and no traceback."""

from __future__ import annotations

from typing import Any


def run_cli(*args: str) -> Any:
    """`memplan ARGS` in-process (typer's CliRunner); returns its result (exit_code, output,
    stderr)."""
    from typer.testing import CliRunner

    from memplan.cli import app

    return CliRunner().invoke(app, list(args))


def one_error_line(res: Any) -> str:
    """Asserts that `res` exited 2 with exactly one stderr line, "error: ...", and no traceback;
    returns that line's message (after "error: ")."""
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0].removeprefix("error: ")
