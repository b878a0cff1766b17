"""A causal language model's cross-entropy that never holds the full log-softmax or its gradient,
installed into a Hugging Face model in one call (`lean_loss(model)`).

The loss itself (NOTE [ the lean cross-entropy ]) lives in profiler/lean_cross_entropy.py, which
the profiles measure and derive; this module installs it.
"""

from __future__ import annotations

from memplan.profiler.lean_cross_entropy import (
    CHUNK_BYTES,
    LeanCrossEntropy,
    lean_causal_lm_loss,
    lean_causal_lm_loss_reusing_logits,
)
from torch import nn

__all__ = ["CHUNK_BYTES", "LeanCrossEntropy", "lean_causal_lm_loss", "lean_loss"]

_LEAN = (lean_causal_lm_loss, lean_causal_lm_loss_reusing_logits)


def lean_loss(model: nn.Module, *, on: bool = True, reuse_logits: bool = False) -> nn.Module:
    """Install (`on`) or remove the lean cross-entropy as a Hugging Face causal language model's
    `loss_function` (NOTE [ the lean cross-entropy ]); call it before `auto_checkpoint`, which then
    profiles and plans the model with it. `reuse_logits`: its backward writes the logits' gradient
    over the logits, one N x V tensor less at the head's peak; the model's returned `logits`, read
    after the backward, then hold that gradient (rule 4 of the NOTE). Returns the model. Raises
    TypeError naming `model` where the model has no Hugging Face `loss_function` of a causal
    language model."""
    if not isinstance(reuse_logits, bool):
        raise TypeError(f"reuse_logits: expected True or False, got {reuse_logits!r}")
    if not isinstance(model, nn.Module) or not hasattr(type(model), "loss_function"):
        raise TypeError("model: lean_loss needs a Hugging Face model whose loss is its "
                        "`loss_function` (a PreTrainedModel); for your own loss, compute it with "
                        "memplan.executor.lean_loss.LeanCrossEntropy")
    if not on:
        if getattr(model, "_loss_function", None) in _LEAN:
            del model._loss_function
        return model
    loss_type = getattr(model, "loss_type", None)
    current = model.__dict__.get("_loss_function")
    if current is not None and current not in _LEAN:
        raise TypeError("model: it already has its own loss_function; remove it first, or "
                        "compute your loss with memplan.executor.lean_loss.LeanCrossEntropy")
    causal = loss_type == "ForCausalLM" or (
        loss_type is None and type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")))
    if not causal:
        raise TypeError(f"model: lean_loss replaces a causal language model's loss, and "
                        f"{type(model).__name__} (loss_type {loss_type!r}) is not one")
    model.loss_function = lean_causal_lm_loss_reusing_logits if reuse_logits else lean_causal_lm_loss
    return model
