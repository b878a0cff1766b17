"""Tables at 80 columns (issue 19, item 7): every table of `memplan profile`, `plan`, `size` and
`frontier` fits the terminal and never cuts a number (rich cut them with an ellipsis: `108.1…`)."""

from __future__ import annotations

import re

import pytest
from memplan.profiler.analytic import gpt_analytic_profile
from typer.testing import CliRunner

from memplan.cli import app

runner = CliRunner()


@pytest.fixture
def narrow(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture
def profile_path(tmp_path):
    prof = gpt_analytic_profile(dict(n_layer=8, n_embd=4096, n_head=32, block_size=4096,
                                     batch_size=1), precision="bf16-mixed")
    path = tmp_path / "p.json"
    path.write_text(prof.model_dump_json())
    return path


def _check(res, *whole, strict=True):
    """Fits 80 columns, no number cut (strict: nothing cut at all), `whole` shown on one line."""
    assert res.exit_code in (0, 1), res.output
    assert not re.search(r"[0-9.]…", res.output), res.output
    if strict:
        assert "…" not in res.output, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    for number in whole:  # shown whole on one line
        assert any(number in line for line in lines), number


def test_profile(narrow):
    res = runner.invoke(app, ["profile", "--analytic", "--n-layer", "32", "--d-model", "4096",
                              "--n-head", "32", "--seq", "4096", "--batch", "1", "--precision",
                              "bf16-mixed"])
    _check(res, "896.56 MiB", "1924")


@pytest.mark.parametrize("extra", [[], ["--strategy", "sqrt", "--checkpoint-dtype", "fp8",
                                        "--tolerance", "0.5"]])
def test_plan(narrow, profile_path, extra):
    res = runner.invoke(app, ["plan", str(profile_path), "--budget", "4GB", *extra])
    _check(res, "1924.145 ms", "896.56 MiB", strict=False)  # a long dtype name may be cut


def test_frontier(narrow, profile_path):
    res = runner.invoke(app, ["frontier", str(profile_path)])
    _check(res, strict=False)
    # every byte count of the frontier table whole: a run of digits at least 9 long
    assert re.search(r"\b\d{9,}\b", res.output)


def test_size(narrow):
    res = runner.invoke(app, ["size", "--memory", "141GB", "--devices", "8", "--device", "H200",
                              "--strategy", "uniform"])
    _check(res, "141000000000", "size against recompute overhead")
    fit = runner.invoke(app, ["size", "--memory", "80GB", "--params", "7B"])
    _check(fit, "116615313408")
    res = runner.invoke(app, ["size", "--compute", "5.76e23"])
    _check(res, "72.2B")
