"""Structured pruning with Torch-Pruning: feed-forward channels removed for real (the model shrinks).

Each dense MLP's hidden channels (c_fc's outputs, c_proj's inputs) are ranked by the L2 norm of
their c_fc weight rows and the weakest `ratio` of them removed with Torch-Pruning's pruning
functions, so the Linear layers get smaller weight tensors. The caller must then re-profile and
re-plan (the costs changed) and build the optimizer over the new parameters (`run_plan` does).

NOTE [ Heads ]
Removing attention heads needs the attention to keep its inner width apart from the residual width
(profiler.models.gpt's attention splits q, k, v by n_embd and reshapes to the input's C); until it
does, heads are not pruned and the note says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["prune_ffn"]


def _mlps(stages: Sequence[nn.Module]) -> list[nn.Module]:
    out = []
    for s in stages:
        for m in s.modules():
            fc, proj = getattr(m, "c_fc", None), getattr(m, "c_proj", None)
            if isinstance(fc, nn.Linear) and isinstance(proj, nn.Linear) and fc.out_features == proj.in_features:
                out.append(m)
    return out


def prune_ffn(stages: Sequence[nn.Module], *, ratio: float = 0.25) -> tuple[str, dict]:
    """Remove the weakest `ratio` of every MLP's hidden channels in place. Returns a note and the
    parameter counts before and after."""
    try:
        import torch_pruning as tp
    except ImportError:
        raise ValueError("features: prune needs `pip install torch-pruning`") from None
    if not 0 < ratio < 1:
        raise ValueError(f"prune ratio: must be between 0 and 1 (exclusive), got {ratio}")
    before = sum(p.numel() for s in stages for p in s.parameters())
    mlps = _mlps(stages)
    if not mlps:
        raise ValueError("features: prune found no MLP (c_fc, c_proj) to prune; use a dense GPT (no moe)")
    for m in mlps:
        n = m.c_fc.out_features
        k = int(n * ratio)
        score = m.c_fc.weight.detach().float().norm(dim=1)  # (hidden,)
        idxs = sorted(torch.argsort(score)[:k].tolist())
        tp.prune_linear_out_channels(m.c_fc, idxs)
        tp.prune_linear_in_channels(m.c_proj, idxs)
    after = sum(p.numel() for s in stages for p in s.parameters())
    note = (f"prune: Torch-Pruning removed {int(ratio * 100)}% of the hidden channels of {len(mlps)} "
            f"MLPs ({before} -> {after} parameters); heads not pruned (see executor/features/prune.py)")
    return note, {"params_before": before, "params_after": after}
