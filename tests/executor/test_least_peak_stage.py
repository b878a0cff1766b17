"""An infeasible budget on a Hugging Face language model whose head sets the least peak: the
message names the head (NOTE [ the least peak's stage ] in planner/optimal.py)."""

from __future__ import annotations

import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from memplan.executor.apply import InfeasiblePlanError  # noqa: E402

import memplan  # noqa: E402


def test_a_large_vocabulary_head_is_named_with_its_backward_bytes():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=8192, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 8192, (2, 48))
    with pytest.raises(InfeasiblePlanError) as info:
        memplan.auto_checkpoint(model, {"input_ids": ids, "labels": ids}, budget=1)
    msg = str(info.value)
    least = int(re.search(r"the least budget it fits is (\d+) bytes", msg).group(1))
    held = int(re.search(r"stage 4 \('head'\) alone holds (\d+) bytes in its backward", msg).group(1))
    # the head's backward holds the logits' gradients: two of 2 x 48 x 8192 fp32 at least
    assert 2 * (2 * 48 * 8192 * 4) <= held <= least
    assert "fused or chunked cross-entropy" in msg
