"""Hugging Face configs: bad input is one line naming the config key or the CLI option, never a
traceback or a silently wrong count; and a tied embedding's pending gradient is counted in the
analytic profile's fixed bytes as the measured profile counts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memplan.profiler.hf_config import (
    MAX_LAYERS,
    decoder_shape,
    hf_analytic_profile,
    measure_hf_config,
    n_params,
    param_counts,
)
from memplan.profiler.schema import ProfileError

from tests.cli_lines import one_error_line, run_cli

CONFIGS = Path(__file__).parent / "hf_configs"


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def _one_error_line(res, start: str) -> None:
    assert one_error_line(res).startswith(start), res.stderr


# -- tied embeddings: the head's pending gradient of the shared matrix ---------------------------

@pytest.mark.parametrize(("precision", "grad_bytes"), [("fp32", 4), ("bf16-mixed", 4), ("bf16", 2)])
def test_tied_embedding_pending_gradient_is_in_the_fixed_bytes(precision, grad_bytes):
    cfg = _config("qwen2-0.5b")  # tied: V 151,936 x C 896
    tied = hf_analytic_profile(cfg, seq_len=16, precision=precision)
    V, C = cfg["vocab_size"], cfg["hidden_size"]
    fixed = tied.meta["fixed"]
    assert fixed["pending_shared_grad_bytes"] == V * C * grad_bytes
    assert tied.fixed_bytes == fixed["total_bytes"] == (fixed["param_bytes"] + fixed["grad_bytes"]
                                                        + fixed["optimizer_bytes"] + V * C * grad_bytes)
    untied = hf_analytic_profile(_config("llama-2-7b"), seq_len=16, precision=precision)
    assert untied.meta["fixed"]["pending_shared_grad_bytes"] == 0
    # one tensor-parallel rank holds its V / t rows of the head's gradient
    half = hf_analytic_profile(cfg, seq_len=16, precision=precision, tp=2)
    assert half.meta["fixed"]["pending_shared_grad_bytes"] == -(-V // 2) * C * grad_bytes


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tied_analytic_fixed_bytes_equal_the_measured_ones(precision):
    pytest.importorskip("transformers")
    cfg = _config("tiny-qwen2")  # tied
    assert decoder_shape(cfg).tie_embeddings
    got = measure_hf_config(cfg, seq_len=8, batch_size=2, precision=precision, repeats=1, warmup=0)
    want = hf_analytic_profile(cfg, seq_len=8, batch_size=2, precision=precision)
    pending = got.meta["fixed"]["pending_shared_grad_bytes"]
    assert pending > 0 and want.meta["fixed"]["pending_shared_grad_bytes"] == pending
    # the measured profile also holds the rotary table's buffer (inv_freq), a few bytes
    assert want.fixed_bytes == got.fixed_bytes - got.meta["fixed"]["buffer_bytes"]


# -- booleans, model_type, top-k, n_inner, layers ------------------------------------------------

@pytest.mark.parametrize("key", ["tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window"])
@pytest.mark.parametrize("value", ["false", "true", 0, 1, None])
def test_boolean_keys_refuse_anything_but_true_or_false(key, value):
    cfg = {**_config("llama-2-7b"), key: value}
    with pytest.raises(ProfileError, match=rf"^config\.{key}: expected true or false"):
        decoder_shape(cfg)
    # the JSON booleans still work, and "false" is no longer read as true
    assert n_params({**_config("llama-2-7b"), "tie_word_embeddings": False}) == 6_738_415_616


def test_gpt2_and_neox_booleans_are_checked_too():
    with pytest.raises(ProfileError, match=r"^config\.tie_word_embeddings: expected true or false"):
        decoder_shape({**_config("gpt2"), "tie_word_embeddings": "false"})
    with pytest.raises(ProfileError, match=r"^config\.attention_bias: expected true or false"):
        decoder_shape({**_config("pythia-160m"), "attention_bias": "no"})


@pytest.mark.parametrize("mt", [["llama"], 5, {"a": 1}, True])
def test_model_type_not_a_string_is_refused(mt):
    with pytest.raises(ProfileError, match=r"^config\.model_type: .* is not a decoder memplan knows"):
        decoder_shape({**_config("tiny-llama"), "model_type": mt})


@pytest.mark.parametrize("cfg", [{}, {"num_layers": 2, "d_model": 64}, {"model_type": None},
                                 {"model_type": ""}, {**_config("tiny-llama"), "model_type": None}])
def test_a_config_without_model_type_is_refused_naming_it(cfg):
    with pytest.raises(ProfileError, match=r"^config\.model_type: missing"):
        decoder_shape(cfg)
    with pytest.raises(ProfileError, match=r"^config\.model_type: missing"):
        hf_analytic_profile(cfg, seq_len=8)
    from memplan.planner.capacity import capacity

    with pytest.raises(ProfileError, match=r"^config\.model_type: missing"):
        capacity({"config": cfg, "memory_bytes": 80 * 10**9})


def test_top_k_above_the_experts_is_refused():
    with pytest.raises(ProfileError, match=r"^config\.num_experts_per_tok: 8 .* 4 experts of "
                                           r"config\.num_local_experts"):
        decoder_shape({**_config("tiny-mixtral"), "num_local_experts": 4, "num_experts_per_tok": 8})
    with pytest.raises(ProfileError, match=r"^config\.num_experts_per_tok: .* config\.num_experts;"):
        decoder_shape({**_config("qwen1.5-moe-a2.7b"), "num_experts_per_tok": 61})
    # k equal to E is allowed
    shape = decoder_shape({**_config("tiny-mixtral"), "num_experts_per_tok": _config("tiny-mixtral")["num_local_experts"]})
    assert shape.top_k == shape.n_experts


@pytest.mark.parametrize("value", ["100", 100.5, -5, 0, True])
def test_gpt2_n_inner_is_validated(value):
    with pytest.raises(ProfileError, match=r"^config\.n_inner: expected an integer >= 1"):
        param_counts({**_config("gpt2"), "n_inner": value})


def test_gpt2_n_inner_null_is_four_times_n_embd():
    base = _config("gpt2")
    C = base["n_embd"]
    assert n_params({**base, "n_inner": None}) == n_params({**base, "n_inner": 4 * C}) == 124_439_808
    assert decoder_shape({**base, "n_inner": 100}).intermediate_size == 100


@pytest.mark.parametrize(("name", "key"), [("tiny-llama", "num_hidden_layers"), ("gpt2", "n_layer")])
def test_layers_have_a_ceiling(name, key):
    with pytest.raises(ProfileError, match=rf"^config\.{key}: at most 10,000 .*got 1,000,000,000"):
        decoder_shape({**_config(name), key: 10**9})
    assert decoder_shape({**_config(name), key: MAX_LAYERS}).n_layer == MAX_LAYERS


def test_flops_per_s_must_be_finite():
    for bad in (float("inf"), float("nan"), 0, -1.0):
        with pytest.raises(ProfileError, match=r"^flops_per_s: must be a finite number > 0"):
            hf_analytic_profile(_config("tiny-llama"), seq_len=8, flops_per_s=bad)


def test_measured_sizes_are_checked_before_building():
    with pytest.raises(ProfileError, match=r"^batch_size: expected an integer >= 1, got 0"):
        measure_hf_config(_config("tiny-llama"), seq_len=8, batch_size=0)
    gpt2 = {**_config("gpt2"), "n_positions": 64}
    with pytest.raises(ProfileError, match=r"^seq_len: 128 tokens exceed config\.n_positions \(64\)"):
        measure_hf_config(gpt2, seq_len=128)


# -- the CLI: one line naming the option ---------------------------------------------------------

def test_cli_refuses_batch_zero_with_hf_config():
    res = run_cli("profile", "--hf-config", str(CONFIGS / "tiny-llama.json"), "--analytic", "--seq", "8",
               "--batch", "0")
    _one_error_line(res, "--batch: expected an integer >= 1, got 0")


def test_cli_gpt2_seq_beyond_positions_is_one_line(tmp_path):
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps({**_config("gpt2"), "n_positions": 64, "n_layer": 1, "n_embd": 32,
                                "n_head": 2, "vocab_size": 64}))
    res = run_cli("profile", "--hf-config", str(path), "--seq", "128", "--repeats", "1", "--warmup", "0")
    _one_error_line(res, "--seq: 128 tokens exceed config.n_positions (64)")


@pytest.mark.parametrize(("patch", "start"), [
    ({"tie_word_embeddings": "false"}, "--hf-config.tie_word_embeddings: expected true or false"),
    ({"model_type": ["llama"]}, "--hf-config.model_type: ['llama'] is not a decoder"),
    ({"num_hidden_layers": 10**9}, "--hf-config.num_hidden_layers: at most 10,000"),
])
def test_cli_profile_bad_config_is_one_line(tmp_path, patch, start):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**_config("tiny-llama"), **patch}))
    _one_error_line(run_cli("profile", "--hf-config", str(path), "--analytic", "--seq", "8"), start)


def test_cli_profile_hf_names_options_not_fields():
    path = str(CONFIGS / "tiny-llama.json")
    _one_error_line(run_cli("profile", "--hf-config", path, "--analytic", "--seq", "8", "--optimizer", "lion"),
                    "--optimizer:")
    _one_error_line(run_cli("profile", "--hf-config", path, "--analytic", "--seq", "8", "--flops-per-s", "inf"),
                    "--flops-per-s: must be a finite number > 0")


@pytest.mark.parametrize("change, saved_exact", [
    ({}, True),
    ({"model_type": "qwen3", "head_dim": 16}, False),  # q/k norms save more than derived
    ({"model_type": "mistral", "sliding_window": 8}, False),  # a window shorter than the sequence
    ({"model_type": "mistral", "sliding_window": 64}, True),
])
def test_the_profile_claims_exact_saved_bytes_only_where_they_were_checked(change, saved_exact):
    from memplan.profiler.hf_config import hf_analytic_profile

    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 128, **change}
    prof = hf_analytic_profile(cfg, seq_len=16)
    assert ("saved_bytes" in prof.meta["exact"]) is saved_exact
    assert "input_bytes" not in prof.meta["exact"]  # labels apart or the ids themselves


def test_gpt_neox_is_sent_where_it_can_be_profiled():
    """The analytic refusal said to measure it with `memplan profile --hf-config`, whose decoder
    cut refuses GPT-NeoX too: it points at profiling the model itself."""
    from memplan.profiler.hf_config import hf_analytic_profile
    from memplan.profiler.schema import ProfileError

    cfg = {"model_type": "gpt_neox", "hidden_size": 64, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}
    with pytest.raises(ProfileError, match="memplan.profile_model or memplan.auto_checkpoint"):
        hf_analytic_profile(cfg, seq_len=16)


def test_an_attention_transformers_does_not_build_is_named():
    """Gemma2 with sdpa: transformers' own multi-line advice (attn_implementation=...) becomes one
    line naming the attention option."""
    pytest.importorskip("transformers")
    from memplan.profiler.hf_config import hf_model
    from memplan.profiler.schema import ProfileError

    cfg = {"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128, "head_dim": 16,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 128}
    try:
        hf_model(cfg, attention="sdpa")
    except ProfileError as err:
        assert str(err).startswith("attention: transformers ") and "use eager" in str(err)
    hf_model(cfg, attention="eager")  # builds
