"""The lean cross-entropy (NOTE [ the lean cross-entropy ] in profiler/lean_cross_entropy.py): the same loss
and gradients as Hugging Face's `ForCausalLMLoss`, two N x V tensors at the head's backward peak
instead of three, and profiles, plans and installed plans that predict the step with it."""

from __future__ import annotations

import copy

import pytest
import torch
from memplan.executor.apply import auto_checkpoint, measure_step, profile_model, remove_checkpoint
from memplan.executor.lean_loss import CHUNK_BYTES, LeanCrossEntropy, lean_causal_lm_loss, lean_loss
from memplan.planner import plan
from memplan.planner._optimal_dp import costs_of
from memplan.planner.optimal import least_peak

from tests.grads import grads, same

transformers = pytest.importorskip("transformers")
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402

VOCAB = 8192


def _logits_and_labels(dtype=torch.float32, *, b=3, t=37, v=1001, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(b, t, v, generator=g)).to(dtype).requires_grad_()
    labels = torch.randint(0, v, (b, t), generator=g)
    labels[0, :5] = -100  # ignored targets
    labels[2, -3:] = -100
    return logits, labels


@pytest.mark.parametrize("extra", [{}, {"num_items_in_batch": torch.tensor(57)},
                                   {"num_items_in_batch": 80}, {"shift_labels": "given"}],
                         ids=["mean", "items-tensor", "items-int", "shift-labels"])
def test_loss_and_gradients_equal_hugging_faces(extra):
    """fp32: the value and the logits' gradient equal ForCausalLMLoss's to fp32 rounding (the rows
    and vocabulary, 111 x 1001, are not multiples of a chunk)."""
    logits, labels = _logits_and_labels()
    if extra.get("shift_labels") == "given":
        extra = {"shift_labels": torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()}
    ref_logits = logits.detach().clone().requires_grad_()
    ours = lean_causal_lm_loss(logits, labels, 1001, **extra)
    ref = ForCausalLMLoss(ref_logits, labels, 1001, **extra)
    ours.backward()
    ref.backward()
    assert ours.dtype == torch.float32 and ours.shape == ()
    assert abs(float(ours) - float(ref)) <= 1e-6 * abs(float(ref))
    assert (logits.grad - ref_logits.grad).abs().max() <= 1e-5 * ref_logits.grad.abs().max()


def test_bf16_logits_give_a_bf16_gradient_within_bf16_rounding():
    logits, labels = _logits_and_labels(torch.bfloat16)
    ref_logits = logits.detach().clone().requires_grad_()
    ours = lean_causal_lm_loss(logits, labels, 1001)
    ref = ForCausalLMLoss(ref_logits, labels, 1001)
    ours.backward()
    ref.backward()
    assert logits.grad.dtype == torch.bfloat16
    assert abs(float(ours) - float(ref)) <= 1e-5 * abs(float(ref))  # both upcast to fp32
    diff = (logits.grad.float() - ref_logits.grad.float()).abs().max()
    assert diff <= 2 ** -8 * ref_logits.grad.float().abs().max()


def test_every_target_ignored_is_nan_as_in_hugging_face():
    logits, labels = _logits_and_labels()
    labels[:] = -100
    assert torch.isnan(lean_causal_lm_loss(logits, labels, 1001))
    assert torch.isnan(ForCausalLMLoss(logits, labels, 1001))


def _gpt2(*, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=4, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  tie_word_embeddings=False, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg).train()


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (4, 64), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def _profiled(lean: bool | str, seed: int):
    """(a fresh GPT-2, with the lean loss when `lean` (reusing the logits when "reuse"); its batch
    from `seed`; its profile)."""
    torch.set_num_threads(1)
    model = _gpt2()
    if lean:
        lean_loss(model, reuse_logits=lean == "reuse")
    b = _batch(seed)
    return model, b, profile_model(model, b, repeats=1, warmup=0)


def test_a_gpt2_step_holds_one_logits_less_and_its_profile_predicts_it():
    """On a GPT-2 (4 x 64 tokens, vocabulary 8,192: 8 MiB per N x V fp32 tensor) the plain step's
    peak falls by one N x V tensor less one chunk and a few small tensors (NOTE [ the lean
    cross-entropy ] rule 2), and with either loss the profile's store-all prediction is the
    measured peak within 128 bytes (NOTE [ Measured in context ], the head)."""
    nv = 4 * 64 * VOCAB * 4
    rows = max(1, min(CHUNK_BYTES // (4 * VOCAB), -(-4 * 64 // 8)))
    peaks = {}
    for lean in (False, True, "reuse"):
        model, b, prof = _profiled(lean, 1)
        predicted = plan(prof, strategy="store-all").predicted.peak_bytes
        m = measure_step(model, b, time_steps=0)
        assert abs(m.measured_peak_bytes - predicted) <= 128, (lean, m.measured_peak_bytes, predicted)
        peaks[lean] = m.measured_peak_bytes
    saved = peaks[False] - peaks[True]
    assert nv - rows * VOCAB * 4 - 16_384 <= saved <= nv
    # reusing the logits for their gradient: the head holds one N x V tensor less again (rule 4);
    # the step's peak falls by that less what the next phase holds (here 1.06 MiB: a chunk more)
    assert nv - 2 * rows * VOCAB * 4 <= peaks[True] - peaks["reuse"] <= nv


def test_installed_plans_with_the_lean_loss_keep_gradients_and_predictions():
    """auto_checkpoint on the model with the lean loss: gradients bitwise equal to the same model
    unplanned, the installed step's peak as predicted (within 0.5%), and the least feasible peak
    below the Hugging Face loss's by at least one N x V tensor less a chunk."""
    nv = 4 * 64 * VOCAB * 4
    least = {}
    for lean in (False, True, "reuse"):
        model, b, prof = _profiled(lean, 2)
        least[lean] = least_peak(costs_of(prof))
        if not lean:
            continue
        ref = copy.deepcopy(model)
        p = auto_checkpoint(model, b, profile=prof, budget=int(1.05 * least[lean]))
        try:
            assert p.recomputed
            step = _batch(3)
            for m in (model, ref):
                m.zero_grad()
                m(**step).loss.backward()
            assert same(grads(model), grads(ref))
            measured = measure_step(model, step, time_steps=0)
            assert abs(measured.peak_error_pct) <= 0.5, measured.message
        finally:
            remove_checkpoint(model)
    assert least[False] - least[True] >= nv - CHUNK_BYTES
    chunk = max(1, min(CHUNK_BYTES // (4 * VOCAB), -(-4 * 64 // 8))) * VOCAB * 4
    assert least[True] - least["reuse"] >= nv - 2 * chunk


def test_reused_logits_give_the_same_loss_and_gradients_and_hold_the_gradient_after():
    """reuse_logits (NOTE [ the lean cross-entropy ] rule 4): the same loss and parameter
    gradients, bitwise, as the lean loss that allocates; the model's returned logits, read after
    the backward, hold the logits' gradient (why it is opt-in)."""
    torch.set_num_threads(1)
    b = _batch(5)
    runs = {}
    for reuse in (False, True):
        model = lean_loss(_gpt2(), reuse_logits=reuse)
        out = model(**b)
        logits = out.logits.detach().clone()
        out.loss.backward()
        runs[reuse] = (float(out.loss), grads(model), logits, out.logits.detach())
    assert runs[False][0] == runs[True][0]
    assert same(runs[False][1], runs[True][1])
    assert torch.equal(runs[False][3], runs[False][2])  # allocating: the logits untouched
    assert not torch.equal(runs[True][3], runs[True][2])  # reused: overwritten by the gradient
    with pytest.raises(TypeError, match=r"^reuse_logits: expected True or False"):
        lean_loss(_gpt2(), reuse_logits="yes")


def test_removed_it_gives_back_hugging_faces_loss():
    model = _gpt2()
    b = _batch(4)
    before = float(model(**b).loss)
    lean_loss(model)
    assert model.loss_function is lean_causal_lm_loss
    lean_loss(model, on=False)
    assert model.loss_function is not lean_causal_lm_loss
    assert float(model(**b).loss) == before
    lean_loss(model, reuse_logits=True)
    lean_loss(model, on=False)
    assert float(model(**b).loss) == before


def test_models_it_cannot_serve_are_refused_in_one_line():
    with pytest.raises(TypeError, match=r"^model: lean_loss needs a Hugging Face model"):
        lean_loss(torch.nn.Linear(2, 2))
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=16, n_embd=32, n_layer=1, n_head=4)
    with pytest.raises(TypeError, match=r"^model: lean_loss replaces a causal language model's loss"):
        lean_loss(transformers.GPT2ForSequenceClassification(cfg))
    model = _gpt2()
    model.loss_function = ForCausalLMLoss
    with pytest.raises(TypeError, match=r"^model: it already has its own loss_function"):
        lean_loss(model)


def test_the_function_alone_checks_as_autograd_expects():
    """torch.autograd.gradcheck in float64 on a small problem (several chunks)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(20, 7, dtype=torch.float64, generator=g).requires_grad_()
    targets = torch.randint(0, 7, (20,), generator=g)
    targets[3] = -100
    assert torch.autograd.gradcheck(lambda x: LeanCrossEntropy.apply(x, targets, -100, None), (logits,))
