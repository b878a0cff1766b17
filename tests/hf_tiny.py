"""Tiny Hugging Face decoder LMs built from configs (random weights; nothing is downloaded)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

KINDS = ("gpt2", "llama", "mistral", "qwen2")
ATTENTIONS = ("eager", "sdpa")
VOCAB = 97


def tiny_lm(kind: str, attn: str = "eager", *, n_layer: int = 2, width: int = 32, dropout: float = 0.0,
            seed: int = 0):
    """A tiny `kind` causal LM (fp32) with `attn` attention; Mistral and Qwen2 with a sliding
    window of 4 tokens (Qwen2's on its second layer only, so its layers get different masks)."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=width, n_layer=n_layer,
                                      n_head=4, resid_pdrop=dropout, embd_pdrop=dropout,
                                      attn_pdrop=dropout)
        cls = transformers.GPT2LMHeadModel
    else:
        common = dict(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=n_layer, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, attention_dropout=dropout)
        if kind == "llama":
            cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
        elif kind == "mistral":
            cfg, cls = transformers.MistralConfig(sliding_window=4, **common), transformers.MistralForCausalLM
        elif kind == "qwen2":
            cfg = transformers.Qwen2Config(use_sliding_window=True, sliding_window=4,
                                           max_window_layers=1, **common)
            cls = transformers.Qwen2ForCausalLM
        else:
            raise ValueError(f"kind: one of {KINDS}, not {kind!r}")
    cfg._attn_implementation = attn
    model = cls(cfg)
    model.config._attn_implementation = attn
    return model


def lm_batch(batch_size: int = 2, seq: int = 12, *, seed: int = 1) -> dict:
    """{"input_ids", "labels"}: random tokens, labels equal to the inputs (the model shifts them)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch_size, seq), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}
