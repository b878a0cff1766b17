"""`memplan profile`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


# the 7B GPT (issue 19, item 1): 32 layers, d 4096, seq 4096
GPT_7B = ["--n-layer", "32", "--d-model", "4096", "--n-head", "32", "--seq", "4096", "--batch", "1",
          "--analytic"]


def test_analytic_precision_is_recorded_and_printed(tmp_path):
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["profile", *GPT_7B, "--precision", "bf16-mixed", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["meta"]["precision"]["policy"] == "bf16-mixed"
    assert data["meta"]["precision"]["optimizer"] == "adamw"
    assert data["dtype"] == "bfloat16" and data["meta"]["fixed"]["param_bytes"] == \
        4 * data["meta"]["fixed"]["n_params"]
    assert "precision bf16-mixed (compute bfloat16), optimizer adamw: 16 bytes a parameter" \
        in " ".join(res.output.split())
    pure = runner.invoke(app, ["profile", *GPT_7B, "--dtype", "bfloat16"])
    assert "precision bf16 (compute bfloat16), optimizer adamw: 8 bytes a parameter" \
        in " ".join(pure.output.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--precision", "bf16-mixed", "--dtype", "bfloat16"],
     "--dtype: bf16-mixed keeps parameters in float32, not bfloat16; leave out --dtype"),
    (["--precision", "fp8"], "--precision: unknown policy 'fp8'"),
    (["--precision", "bf16", "--autocast", "bfloat16"],
     "--autocast: bf16 computes in bfloat16 without autocast"),
    (["--precision", "bf16-mixed", "--attention", "math"],
     "precision: the analytic profile prices bf16-mixed (autocast) for flash attention"),
])
def test_precision_conflicts_exit_2(args, message):
    res = runner.invoke(app, ["profile", *GPT_7B, *args])
    assert res.exit_code == 2, res.output
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_measured_under_a_policy(tmp_path):
    out = tmp_path / "m.json"
    res = runner.invoke(app, ["profile", *TINY, "--precision", "bf16-mixed", "--repeats", "1",
                              "--warmup", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["dtype"] == "bfloat16" and data["meta"]["autocast_dtype"] == "bfloat16"
    assert "precision bf16-mixed" in res.output


def test_table_fits_80_columns_and_never_cuts_a_number(monkeypatch):
    """At COLUMNS=80 the 7B profile's table cut its numbers (`108.1…`)."""
    monkeypatch.setenv("COLUMNS", "80")
    res = runner.invoke(app, ["profile", *GPT_7B, "--precision", "bf16-mixed"])
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    assert "896.56 MiB" in res.output  # a block's saved bytes, whole
    assert "not shown at 80 columns" in res.output  # the columns that did not fit are named


def test_hf_config_parallel_share_is_the_librarys(tmp_path):
    from memplan.profiler.hf_config import hf_analytic_profile

    cfg = Path(__file__).parent / "hf_configs" / "llama-2-7b.json"
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["profile", "--hf-config", str(cfg), "--analytic", "--seq", "4096",
                              "--tp", "2", "--sp", "--cp", "2", "--precision", "bf16-mixed",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    lib = hf_analytic_profile(str(cfg), seq_len=4096, precision="bf16-mixed", tp=2, sp=True, cp=2)
    got = json.loads(out.read_text())
    assert [la["saved_bytes"] for la in got["layers"]] == [la.saved_bytes for la in lib.layers]
    whole = hf_analytic_profile(str(cfg), seq_len=4096, precision="bf16-mixed")
    assert got["layers"][1]["saved_bytes"] < whole.layers[1].saved_bytes
    for args, field in ((["--seq", "4095", "--cp", "2"], "--seq"),
                        (["--seq", "4096", "--tp", "3"], "--tp")):
        res = runner.invoke(app, ["profile", "--hf-config", str(cfg), "--analytic", *args])
        assert res.exit_code == 2 and field in res.output, res.output
    res = runner.invoke(app, ["profile", "--tp", "2"])
    assert res.exit_code == 2 and "--hf-config" in res.output


def test_hf_config_lean_loss_derived_and_measured_alike(tmp_path):
    """`--lean-loss` gives the head memplan.lean_loss's bytes, derived (--analytic) and measured
    alike; a Llama 2 7B's head saves 0.98 GiB less at 4 x 4,096 tokens in bf16-mixed (the fp32
    log-softmax, N x V of 32,000 words, against the 16-bit logits the lean head keeps)."""
    cfg = Path(__file__).parent / "hf_configs" / "tiny-llama.json"
    heads = {}
    for extra in ([], ["--analytic"]):
        out = tmp_path / f"p{len(extra)}.json"
        res = runner.invoke(app, ["profile", "--hf-config", str(cfg), "--seq", "12", "--batch", "2",
                                  "--precision", "bf16-mixed", "--lean-loss", "--repeats", "1",
                                  "--warmup", "0", *extra, "--out", str(out)])
        assert res.exit_code == 0, res.output
        got = json.loads(out.read_text())
        assert got["meta"]["loss"] == "lean"
        heads[bool(extra)] = got["layers"][-1]["saved_bytes"]
    assert heads[True] == heads[False]
    big = Path(__file__).parent / "hf_configs" / "llama-2-7b.json"
    saved = {}
    for extra in ([], ["--lean-loss"]):
        out = tmp_path / f"big{len(extra)}.json"
        res = runner.invoke(app, ["profile", "--hf-config", str(big), "--analytic", "--seq", "4096",
                                  "--batch", "4", "--precision", "bf16-mixed", *extra, "--out", str(out)])
        assert res.exit_code == 0, res.output
        saved[bool(extra)] = json.loads(out.read_text())["layers"][-1]["saved_bytes"]
    N, V = 4 * 4096, 32000
    assert saved[False] - saved[True] == (4 - 2) * N * V + 8 * N - (8 + 1 + 4) * N
    res = runner.invoke(app, ["profile", "--hf-config", str(big), "--analytic", "--seq", "4096",
                              "--tp", "2", "--lean-loss"])
    assert res.exit_code == 2 and "--lean-loss: the lean loss is not vocabulary-parallel" in res.output
    res = runner.invoke(app, ["profile", *TINY, "--lean-loss"])
    assert res.exit_code == 2 and "--lean-loss: only with --hf-config" in res.output
    res = runner.invoke(app, ["profile", *TINY, "--reuse-logits"])
    assert res.exit_code == 2 and "--reuse-logits: only with --hf-config" in res.output
    res = runner.invoke(app, ["profile", "--hf-config", str(big), "--analytic", "--seq", "4096",
                              "--reuse-logits"])
    assert res.exit_code == 2 and "--reuse-logits: it is an option of the lean loss" in res.output


def test_policies_flag_measures_save_policies(tmp_path):
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["profile", *TINY, "--repeats", "1", "--warmup", "0", "--policies",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = json.loads(out.read_text())
    blocks = [la for la in prof["layers"] if la["kind"] == "block"]
    assert blocks and all(la["policies"] for la in blocks)
    assert all(p["saved_bytes"] < la["saved_bytes"] for la in blocks for p in la["policies"])
    res = runner.invoke(app, ["profile", *TINY, "--analytic", "--policies"])
    assert res.exit_code == 2 and "--policies" in res.output
