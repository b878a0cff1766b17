"""Cutting models into stages: Sequential, embedding + blocks + head, HF-style decoders."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from memplan.planner.store_all import plan_store_all
from memplan.profiler import ProfileError, profile_chain
from memplan.profiler.cut import cut_blocks, cut_decoder, cut_sequential

from tests.hf_tiny import ATTENTIONS, KINDS, VOCAB, lm_batch, tiny_lm
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


def _chain(stages, batch):
    """The stages run in order on `batch`: (the last layer's hidden states, the loss)."""
    x = batch
    for s in stages[:-1]:
        x = s(x)
    return x[0], stages[-1](x)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attn", ATTENTIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_cut_decoder_loss_and_gradients_are_the_models(kind, attn):
    """Issue 19.4: the chain's loss is model(**batch).loss (1e-5 relative) and its gradients the
    model's, dropout on (the chain draws the random stream as the model does)."""
    model = tiny_lm(kind, attn, dropout=0.1 if kind == "gpt2" else 0.0)
    model.train()
    batch = lm_batch()
    stages = cut_decoder(model)
    assert [s.memplan_name for s in stages] == ["embed", "block.0", "block.1", "head"]
    torch.manual_seed(5)
    ref = model(**batch).loss
    ref.backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    _, loss = _chain(stages, batch)
    assert abs(loss.item() - ref.item()) <= 1e-5 * abs(ref.item())
    loss.backward()
    got = _grads(model)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("attn", ATTENTIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_cut_decoder_is_causal(kind, attn):
    """A position's output does not change when a later token changes (the reported bug: the cut
    Llama attended to later tokens under eager attention)."""
    model = tiny_lm(kind, attn).eval()
    stages = cut_decoder(model)
    batch = lm_batch(seq=10)
    later = {k: v.clone() for k, v in batch.items()}
    later["input_ids"][:, -1] = (later["input_ids"][:, -1] + 1) % VOCAB
    with torch.no_grad():
        h, _ = _chain(stages, batch)
        h2, _ = _chain(stages, later)
        own = model(input_ids=batch["input_ids"], output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(h[:, :-1], h2[:, :-1], rtol=0, atol=1e-6)
    assert not torch.allclose(h[:, -1], h2[:, -1])
    # the model's last hidden state is its final norm of the last layer's output
    norm = stages[-1].norm
    torch.testing.assert_close(norm(h), own, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("attn", ATTENTIONS)
def test_cut_decoder_padding_mask(kind, attn, side):
    """An attention mask with padding gives the model's loss (its own mask is used)."""
    model = tiny_lm(kind, attn).eval()
    batch = lm_batch(seq=10)
    mask = torch.ones_like(batch["input_ids"])
    pad = slice(-3, None) if side == "right" else slice(0, 3)
    mask[1, pad] = 0
    batch["attention_mask"] = mask
    batch["labels"] = batch["labels"].masked_fill(mask == 0, -100)
    stages = cut_decoder(model)
    with torch.no_grad():
        ref = model(**batch).loss
        _, loss = _chain(stages, batch)
        unpadded = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    assert abs(float(loss) - float(ref)) <= 1e-5 * abs(float(ref))
    if side == "left":  # the mask matters here: padding comes before the scored tokens
        assert abs(float(unpadded) - float(ref)) > 1e-4


def test_cut_decoder_runner_takes_a_fresh_batch_each_step():
    """A recomputing schedule run by the executor's runner: each step's loss and gradients are the
    model's on that step's batch (nothing baked into the head)."""
    from memplan.executor.runner import ScheduleRunner
    from memplan.planner import plan
    from memplan.profiler.schema import Profile

    model = tiny_lm("llama", "sdpa", n_layer=4)
    stages = cut_decoder(model)
    L = len(stages)
    layers = [dict(name=f"s{i}", forward_s=1.0, backward_s=2.0, output_bytes=10, saved_bytes=40)
              for i in range(L)]
    sched = plan(Profile(input_bytes=1, layers=layers), strategy="sqrt")
    assert sched.recomputed  # the schedule recomputes stages
    runner = ScheduleRunner(stages, sched.ops(), device=torch.device("cpu"))
    for seed in (1, 2):
        batch = lm_batch(seed=seed)
        model.zero_grad(set_to_none=True)
        ref = model(**batch).loss
        ref.backward()
        want = _grads(model)
        model.zero_grad(set_to_none=True)
        runner.prepare()
        loss = runner.step(batch)
        assert abs(float(loss) - float(ref)) <= 1e-6 * abs(float(ref))
        for name, g in _grads(model).items():
            torch.testing.assert_close(g, want[name], rtol=1e-5, atol=1e-7, msg=name)


def test_cut_decoder_refuses_other_input_and_layouts():
    model = tiny_lm("gpt2")
    stages = cut_decoder(model)
    with pytest.raises(ProfileError, match="batch: .*'labels'"):
        stages[0](torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ProfileError, match="batch: .*'labels'"):
        stages[0]({"input_ids": torch.zeros(1, 4, dtype=torch.long)})
    m = nn.Module()
    m.lm_head = nn.Linear(2, 2)
    m.config = object()
    with pytest.raises(ProfileError, match="unknown layout"):
        cut_decoder(m)


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
