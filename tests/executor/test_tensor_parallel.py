"""Tensor and sequence parallelism on 2 gloo processes: each rank's saved and output bytes per
decoder layer of a tiny Llama (built from its config, random weights), split with torch's
ColwiseParallel / RowwiseParallel / SequenceParallel, equal the analytic per-rank bytes
(NOTE [ Tensor, sequence and context parallel bytes per rank ] in profiler/hf_config.py), and each
rank's output and input gradient equal the unsplit layer's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from memplan.executor.report import ExecutorError  # noqa: E402
from memplan.executor.tensor_parallel import TPSpec, case_name, measure_tensor_parallel  # noqa: E402
from memplan.profiler.hf_config import hf_analytic_profile  # noqa: E402

CONFIGS = Path(__file__).parents[1] / "profiler" / "hf_configs"
# 4 heads, 2 KV heads, F = 64; one layer (each layer is split and measured alike)
TINY = {**json.loads((CONFIGS / "tiny-llama.json").read_text()), "num_hidden_layers": 1}

CASES = [(False, "sdpa", "fp32"), (False, "eager", "bf16-mixed"), (False, "sdpa", "bf16"),
         (True, "sdpa", "fp32"), (True, "eager", "bf16-mixed"), (True, "sdpa", "bf16")]


def test_per_rank_bytes_equal_the_analytic_split():
    spec = TPSpec(config=TINY, tp=2, seq_len=12, batch_size=3, cases=CASES)
    got = measure_tensor_parallel(spec)
    for case in CASES:
        sp, attention, precision = case
        ranks = got[case_name(case)]
        assert len(ranks) == 2
        want = hf_analytic_profile(TINY, seq_len=12, batch_size=3, precision=precision, attention=attention,
                                   tp=2, sp=sp)
        whole = hf_analytic_profile(TINY, seq_len=12, batch_size=3, precision=precision, attention=attention)
        blocks = [ly for ly in want.layers if ly.kind == "block"]
        for rank in ranks:
            assert [(r["saved_bytes"], r["output_bytes"]) for r in rank] == [
                (ly.saved_bytes, ly.output_bytes) for ly in blocks], case
            # the rank's shards of the weights: half of each projection, the norms whole
            assert [r["param_bytes"] for r in rank] == [ly.param_bytes for ly in blocks], case
            # the split keeps less than the whole layer, and SP halves the output (T / 2 tokens)
            assert all(r["saved_bytes"] < whole.layers[1].saved_bytes for r in rank), case
            assert all(r["output_bytes"] == whole.layers[1].output_bytes // (2 if sp else 1) for r in rank)
            assert all(r["output_shape"] == [3, 6 if sp else 12, 32] for r in rank)
            tol = 1e-5 if precision == "fp32" else 5e-2
            assert all(r["output_max_abs_diff"] < tol and r["input_grad_max_abs_diff"] < tol
                       for r in rank), case


def test_bad_splits_name_the_field():
    with pytest.raises(ExecutorError, match="^tp: 3 ranks must divide config.num_attention_heads"):
        measure_tensor_parallel(TPSpec(config=TINY, tp=3))
    with pytest.raises(ExecutorError, match="^seq_len: 13 tokens must be divisible by tp"):
        measure_tensor_parallel(TPSpec(config=TINY, tp=2, seq_len=13, cases=[(True, "sdpa", "fp32")]))
