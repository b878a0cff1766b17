"""One line and exit code 2, before any work, for output paths that cannot be written, inputs that
are folders, and `memplan run --hf-config` options that the config run does not use."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memplan.cli import app
from tests.cli_lines import one_error_line

runner = CliRunner()
PROFILE = "examples/gpt24.json"


def _one_error_line(res, message: str) -> None:
    assert one_error_line(res) == message, res.stderr


@pytest.mark.parametrize("args", [
    ["plan", PROFILE, "--budget", "1GiB", "--plot", "{missing}/t.png"],
    ["frontier", PROFILE, "--plot", "{missing}/f.png"],
    ["profile", "--model", "gpt", "--n-layer", "2", "--out", "{missing}/p.json"],
    ["run", "--n-layer", "2", "--plot", "{missing}/r.png"],
    ["sweep", "-", "--plot", "{missing}/s.png"],
])
def test_an_output_in_a_missing_folder_is_refused_before_the_work(tmp_path, args):
    missing = tmp_path / "no-such-folder"
    flag = "--out" if "--out" in args else "--plot"
    res = runner.invoke(app, [a.format(missing=missing) for a in args])
    _one_error_line(res, f"{flag}: the folder {str(missing)!r} does not exist; create it or write "
                         "elsewhere")


def test_an_output_that_is_a_folder_is_refused(tmp_path):
    res = runner.invoke(app, ["profile", "--model", "gpt", "--n-layer", "2", "--out", str(tmp_path)])
    _one_error_line(res, f"--out: {str(tmp_path)!r} is a folder; give a file name")


def test_a_folder_given_as_the_profile_is_named(tmp_path):
    res = runner.invoke(app, ["plan", str(tmp_path), "--budget", "1GiB"])
    _one_error_line(res, f"profile: {str(tmp_path)!r} is a folder; give a JSON file")


@pytest.mark.parametrize(("args", "flag"), [
    (["--plot", "r.png"], "--plot"), (["--device", "cuda"], "--device"),
    (["--autocast", "float16"], "--autocast"), (["--features", "moe"], "--features"),
    (["--model", "conv"], "--model"), (["--dropout", "0.5"], "--dropout"),
    (["--n-layer", "40"], "--n-layer"), (["--server", "http://127.0.0.1:9"], "--server"),
])
def test_run_hf_config_refuses_the_options_it_does_not_use(tmp_path, args, flag):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(model_type="llama", hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=2, vocab_size=64)))
    res = runner.invoke(app, ["run", "--hf-config", str(cfg), *args])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip().splitlines()
    assert len(line) == 1 and line[0].startswith(f"error: {flag}: not an option with --hf-config")


@pytest.mark.parametrize("flag", ["--batch", "--seq", "--steps"])
def test_run_hf_config_names_its_own_options(tmp_path, flag):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(model_type="llama", hidden_size=32, num_hidden_layers=2)))
    res = runner.invoke(app, ["run", "--hf-config", str(cfg), flag, "0"])
    _one_error_line(res, f"{flag}: an integer >= 1, got 0")


def test_a_sweep_whose_every_cell_failed_exits_1(tmp_path):
    """It exited 0 ("answered") with no answer in it."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"models": [{"label": "g", "config": {
        "n_layer": 2, "n_embd": 33, "n_head": 2, "block_size": 16, "vocab_size": 64,
        "batch_size": 4, "dropout": 0.0}}], "budgets_bytes": [None], "run": False}))
    res = runner.invoke(app, ["sweep", str(spec), "--json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert report["failed"] == 1 and report["succeeded"] == 0
    assert "every cell failed" in res.stderr


def test_run_takes_the_short_autocast_names():
    """--autocast bf16 was refused ("use bfloat16 or float16"), where --checkpoint-dtype bf16
    and --precision bf16-mixed are the names everywhere else."""
    res = runner.invoke(app, ["run", "--n-layer", "2", "--d-model", "32", "--n-head", "2",
                              "--seq", "8", "--batch", "2", "--vocab", "64", "--steps", "2",
                              "--autocast", "bf16", "--json"])
    assert res.exit_code == 0, res.output
    assert "bfloat16" in json.dumps(json.loads(res.stdout))
