"""Cutting models into stages: Sequential, embedding + blocks + head, HF-style decoders."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from memplan.planner.store_all import plan_store_all
from memplan.profiler import ProfileError, profile_chain
from memplan.profiler.cut import cut_blocks, cut_decoder, cut_sequential

from tests.profiler.conftest import step_peak_bytes


def test_cut_sequential_mlp_profiles_and_predicts():
    torch.manual_seed(0)
    seq = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)], nn.Linear(16, 3))
    targets = torch.randint(0, 3, (8,))
    stages = cut_sequential(seq, loss_fn=F.cross_entropy, targets=targets)
    assert len(stages) == 5 and stages[-1].memplan_kind == "head"
    x = torch.randn(8, 16)
    prof = profile_chain(stages, x, repeats=1, warmup=0)
    assert [ly.name for ly in prof.layers] == ["0", "1", "2", "3", "4"]
    assert all(ly.output_bytes == 8 * 16 * 4 for ly in prof.layers[:-1])
    # Linear saves its input (a_0), Tanh its output (a_1): neither counts as the stage's record
    assert prof.layers[1].saved_bytes == 0
    assert abs(plan_store_all(prof).predicted.peak_bytes - step_peak_bytes(stages, x)) <= 0.01 * step_peak_bytes(stages, x)
    grouped = cut_sequential(seq, loss_fn=F.cross_entropy, targets=targets, group=2)
    assert [s.memplan_name for s in grouped] == ["0-1", "2-3", "4"]


def test_cut_sequential_errors():
    with pytest.raises(ProfileError, match="seq"):
        cut_sequential(nn.Linear(2, 2), loss_fn=F.mse_loss, targets=torch.zeros(1))
    with pytest.raises(ProfileError, match="group"):
        cut_sequential(nn.Sequential(nn.Linear(2, 2)), loss_fn=F.mse_loss, targets=torch.zeros(1), group=0)


class _GPT2Block(nn.Module):  # the HF layout: returns a tuple
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.mlp = nn.LayerNorm(c), nn.Linear(c, c)

    def forward(self, x):
        return (x + self.mlp(self.ln_1(x)), None)


class _FakeGPT2(nn.Module):
    def __init__(self, v=32, c=16, t=8, n=3):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte, self.transformer.wpe = nn.Embedding(v, c), nn.Embedding(t, c)
        self.transformer.drop = nn.Dropout(0.0)
        self.transformer.h = nn.ModuleList(_GPT2Block(c) for _ in range(n))
        self.transformer.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, v, bias=False)


def test_cut_decoder_gpt2_layout_matches_the_model():
    torch.manual_seed(0)
    model = _FakeGPT2()
    idx = torch.randint(0, 32, (2, 8))
    targets = torch.randint(0, 32, (2, 8))
    stages = cut_decoder(model, targets=targets)
    assert [s.memplan_name for s in stages] == ["embed", "block.0", "block.1", "block.2", "head"]
    x = idx
    for s in stages:
        x = s(x)
    t = model.transformer
    h = t.wte(idx) + t.wpe(torch.arange(8))
    for b in t.h:
        h = b(h)[0]
    ref = F.cross_entropy(model.lm_head(t.ln_f(h)).view(-1, 32), targets.view(-1))
    assert torch.allclose(x, ref)
    prof = profile_chain(stages, idx, repeats=1, warmup=0)
    assert prof.n_stages == 5


def test_cut_decoder_unknown_layout():
    m = nn.Module()
    m.lm_head = nn.Linear(2, 2)
    with pytest.raises(ProfileError, match="unknown layout"):
        cut_decoder(m, targets=torch.zeros(1, 1, dtype=torch.long))


def test_cut_blocks_wraps_head():
    emb, blocks, head = nn.Embedding(10, 4), [nn.Linear(4, 4)], nn.Linear(4, 10)
    stages = cut_blocks(emb, blocks, head, loss_fn=lambda y, t: F.cross_entropy(y.view(-1, 10), t.view(-1)),
                        targets=torch.zeros(2, 3, dtype=torch.long))
    x = torch.zeros(2, 3, dtype=torch.long)
    for s in stages:
        x = s(x)
    assert x.dim() == 0
    with pytest.raises(ProfileError, match="loss_fn, targets"):
        cut_blocks(emb, blocks, head, loss_fn=F.mse_loss)
