"""`memplan profile`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from memplan.cli import app

runner = CliRunner()
TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq", "16", "--vocab", "64", "--batch", "2"]


def test_analytic_json(tmp_path):
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["profile", *TINY, "--analytic", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert len(data["layers"]) == 4 and data["layers"][1]["name"] == "block.0"


def test_measured_matches_analytic(tmp_path):
    a, m = tmp_path / "a.json", tmp_path / "m.json"
    assert runner.invoke(app, ["profile", *TINY, "--analytic", "--out", str(a)]).exit_code == 0
    res = runner.invoke(app, ["profile", *TINY, "--repeats", "1", "--warmup", "0", "--out", str(m)])
    assert res.exit_code == 0, res.output
    la, lm = json.loads(a.read_text())["layers"], json.loads(m.read_text())["layers"]
    assert [x["saved_bytes"] for x in la] == [x["saved_bytes"] for x in lm]


def test_bad_input_exit_2():
    res = runner.invoke(app, ["profile", "--n-head", "5", "--analytic"])
    assert res.exit_code == 2 and "n_head" in res.output
    res = runner.invoke(app, ["profile", "--model", "conv", "--n-layer", "3"])
    assert res.exit_code == 2 and "--n-layer" in res.output
    res = runner.invoke(app, ["profile", "--model", "rnn"])
    assert res.exit_code == 2 and "--model" in res.output
