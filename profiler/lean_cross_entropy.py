"""The lean cross-entropy: a causal language model's loss that never holds the full log-softmax
or its gradient (`lean_causal_lm_loss`, the same arguments and value as Hugging Face's
`ForCausalLMLoss`). The profiler measures it (`measure_hf_config(lean_loss=True)`) and derives
its bytes (`hf_analytic_profile(lean_loss=True)`; the chunk rule, `rows_per_chunk`, lives in
profiler/hf_config.py, which imports no torch); memplan.lean_loss(model) (executor/lean_loss.py)
installs it into a user's model.

NOTE [ the lean cross-entropy ]
A language model's head can be most of a training step's peak, and no placement of block
recomputes lowers it (NOTE [ the least peak's stage ] in planner/optimal.py). With N tokens and a
vocabulary of V, Hugging Face's `ForCausalLMLoss` upcasts the logits (N x V) to fp32 (a copy unless
they are fp32 already) and calls `cross_entropy`, which saves the log-softmax (N x V, fp32) for the
backward; the backward makes the log-softmax's gradient and then the logits' (each N x V, fp32).
At the head's backward peak that is three N x V fp32 tensors, whatever the logits' dtype.
`LeanCrossEntropy` computes the same loss from the logits themselves:
1. Forward: per chunk of rows, each row's log-sum-exp and its target's logit, upcast to fp32 a
   chunk at a time. It saves the logits (no new bytes: the head made them), the targets and the
   N log-sum-exps (4N bytes).
2. Backward: per chunk, softmax = exp(logit - lse) in fp32, minus 1 at the target, times the
   incoming gradient over the divisor, written into one gradient of the logits' shape and dtype.
   At its peak: the logits, their gradient and one chunk's fp32 temporaries (a chunk: at most
   CHUNK_BYTES and 1/CHUNKS_AT_LEAST of the rows). So the head holds two N x V tensors in the
   logits' dtype plus a chunk: with fp32 logits one N x V tensor of three less, with bf16 logits
   more (no whole fp32 copy is ever made).
3. The loss is the same function as Hugging Face's (the mean over targets that are not
   `ignore_index`, or their sum over `num_items_in_batch` when given; NaN when every target is
   ignored, as there); values and gradients agree to fp32 rounding (the summation order
   differs), not bitwise.
4. With `reuse_logits` the backward writes the logits' gradient over the logits: no layer needs
   the logits after the loss's backward (the LM head's backward reads its input and weight), so
   the head holds one N x V tensor at its peak, not two, as a compiler that reuses the buffer
   does. The tensor is the model's own output: a `logits` kept from the forward and read after
   the backward holds the gradient, so it is opt-in (`memplan.lean_loss(model,
   reuse_logits=True)`), for loops that read the loss only (`model(**batch).loss.backward()`,
   Hugging Face's `Trainer`).
A full-vocabulary GPT-2 at 4 x 256 tokens holds 206 MB per N x V fp32 tensor (docs/apply.md,
"A lean loss").
"""

from __future__ import annotations

from typing import Any

import torch
from memplan.profiler.hf_config import CHUNK_BYTES, CHUNKS_AT_LEAST, rows_per_chunk
from torch import nn

__all__ = ["CHUNK_BYTES", "CHUNKS_AT_LEAST", "LeanCrossEntropy", "lean_causal_lm_loss",
           "lean_causal_lm_loss_reusing_logits", "rows_per_chunk"]


class LeanCrossEntropy(torch.autograd.Function):
    """loss = sum over rows r with target t_r != ignore_index of (lse_r - logit[r, t_r]), divided
    by `divisor` (a positive number, or None: the count of such rows). logits: (N, V) any float
    dtype; targets: (N,) int64. Returns a 0-dim tensor, fp32 (fp64 for fp64 logits), in nats
    per target (NOTE [ the lean cross-entropy ]). `reuse_logits`: the backward writes the logits'
    gradient over the logits themselves (rule 4 of the NOTE)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                divisor: Any, reuse_logits: bool = False) -> torch.Tensor:
        n, vocab = logits.shape
        acc = torch.promote_types(logits.dtype, torch.float32)  # fp32, or fp64 for fp64 logits
        valid = targets != ignore_index  # (N,)
        safe = torch.where(valid, targets, torch.zeros_like(targets))  # (N,) gather-able
        lse = torch.empty(n, dtype=acc, device=logits.device)  # (N,)
        total = torch.zeros((), dtype=acc, device=logits.device)
        step = rows_per_chunk(n, vocab)
        with torch.autocast(logits.device.type, enabled=False):  # the chunks' math in `acc`
            for a in range(0, n, step):
                chunk = logits[a:a + step].to(acc)  # (rows, V)
                lse[a:a + step] = torch.logsumexp(chunk, dim=1)
                picked = chunk.gather(1, safe[a:a + step, None]).squeeze(1)  # (rows,)
                total += ((lse[a:a + step] - picked) * valid[a:a + step]).sum()
                del chunk, picked  # before the next chunk is made: one chunk at a time
        denom = valid.sum().to(acc) if divisor is None else torch.as_tensor(
            divisor, dtype=acc, device=logits.device)
        ctx.save_for_backward(logits, safe, valid, lse, denom)
        ctx.reuse_logits = bool(reuse_logits)
        return total / denom

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, safe, valid, lse, denom = ctx.saved_tensors
        n, vocab = logits.shape
        # (N, V), the logits' dtype; over the logits themselves when reused: each chunk reads its
        # own rows into `p` before they are written
        grad = logits if ctx.reuse_logits else torch.empty_like(logits)
        scale = (grad_out.to(lse.dtype) / denom) * valid  # (N,)
        step = rows_per_chunk(n, vocab)
        with torch.autocast(logits.device.type, enabled=False):
            for a in range(0, n, step):
                p = logits[a:a + step].to(lse.dtype).sub(lse[a:a + step, None]).exp_()  # (rows, V)
                p.scatter_add_(1, safe[a:a + step, None],
                               -torch.ones(p.shape[0], 1, dtype=p.dtype, device=p.device))
                p.mul_(scale[a:a + step, None])
                grad[a:a + step] = p
                del p  # before the next chunk is made: one chunk at a time
        return grad, None, None, None, None


def lean_causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                        num_items_in_batch: Any = None, ignore_index: int = -100,
                        shift_labels: torch.Tensor | None = None, reuse_logits: bool = False,
                        **kwargs: Any) -> torch.Tensor:
    """Hugging Face's `ForCausalLMLoss` (same arguments, same value) by `LeanCrossEntropy`: labels
    shifted so that tokens < n predict n, unless `shift_labels` is given; `reuse_logits` as
    there. Returns the loss (a 0-dim fp32 tensor)."""
    if shift_labels is None:
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    targets = shift_labels.reshape(-1).to(logits.device)  # (N,)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(logits.device)
    return LeanCrossEntropy.apply(logits.reshape(-1, vocab_size), targets, ignore_index,
                                  num_items_in_batch, reuse_logits)


def lean_causal_lm_loss_reusing_logits(*args: Any, **kwargs: Any) -> torch.Tensor:
    """`lean_causal_lm_loss` whose backward writes the logits' gradient over the logits (rule 4 of
    NOTE [ the lean cross-entropy ]): the model's returned `logits`, read after the backward,
    hold that gradient. Returns the loss (a 0-dim fp32 tensor)."""
    return lean_causal_lm_loss(*args, reuse_logits=True, **kwargs)
