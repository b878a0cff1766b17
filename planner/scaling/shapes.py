"""A GPT shape for a parameter count: how many layers, how wide.

NOTE [ the aspect-ratio rule ]
Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", section 3.1, Figure 5) found the loss
nearly flat in the aspect ratio d_model / n_layer over roughly 20..200 at fixed parameters, so the
rule only needs to be typical. We use d_model = 128 n_layer with heads of 128 dimensions, which
is the shape of GPT-3's larger models (Brown et al. 2020, Table 2.1: 6.7B is 32 x 4096, 13B is
40 x 5140, 175B is 96 x 12288; Chinchilla's 70B is 80 x 8192, ratio 102). Parameters are counted as
nanoGPT's model.py builds them, embeddings included (Hoffmann et al. count all parameters):

    per block 12 d^2 + 13 d (qkv 3d^2+3d, proj d^2+d, MLP 8d^2+5d, two LayerNorms 4d),
    plus token embedding V d (tied with the head), positions T d and the final LayerNorm 2d.
"""

from __future__ import annotations

from memplan.planner.scaling.errors import ScalingError, check_positive
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GPTShape", "gpt_shape", "shape_for_layers", "ASPECT_RATIO", "HEAD_DIM"]

ASPECT_RATIO = 128  # d_model / n_layer (GPT-3 6.7B..175B)
HEAD_DIM = 128  # d_model / n_head
VOCAB_SIZE = 50304  # GPT-2's 50257 padded to a multiple of 64 (nanoGPT)
MAX_LAYERS = 4096


class GPTShape(BaseModel):
    """A decoder's shape and its parameter count (embeddings included)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_layer: int = Field(ge=1)
    d_model: int = Field(ge=1)
    n_head: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    params: int = Field(ge=1, description="total parameters, tied embedding counted once")


def _count(n_layer: int, d: int, vocab_size: int, seq_len: int) -> int:
    return n_layer * (12 * d * d + 13 * d) + vocab_size * d + seq_len * d + 2 * d


def shape_for_layers(
    n_layer: int,
    *,
    aspect_ratio: int = ASPECT_RATIO,
    head_dim: int = HEAD_DIM,
    vocab_size: int = VOCAB_SIZE,
    seq_len: int = 2048,
) -> GPTShape:
    """The shape with `n_layer` blocks: d_model = aspect_ratio * n_layer rounded to whole heads."""
    if n_layer < 1:
        raise ScalingError(f"n_layer: must be at least 1, got {n_layer}")
    d = max(head_dim, round(aspect_ratio * n_layer / head_dim) * head_dim)
    return GPTShape(n_layer=n_layer, d_model=d, n_head=d // head_dim, vocab_size=vocab_size,
                    seq_len=seq_len, params=_count(n_layer, d, vocab_size, seq_len))


def gpt_shape(params: float, **options) -> GPTShape:
    """The shape (by the aspect-ratio rule) whose parameter count is nearest `params`."""
    target = check_positive("params", params)
    lo, hi = 1, MAX_LAYERS
    if shape_for_layers(hi, **options).params < target:
        raise ScalingError(f"params: {target:.3g} needs more than {MAX_LAYERS} layers")
    while lo < hi:  # least n_layer whose count reaches the target
        mid = (lo + hi) // 2
        if shape_for_layers(mid, **options).params < target:
            lo = mid + 1
        else:
            hi = mid
    cands = [shape_for_layers(n, **options) for n in {max(lo - 1, 1), lo}]
    return min(cands, key=lambda s: abs(s.params - target))
