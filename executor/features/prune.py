"""Structured pruning with Torch-Pruning: attention heads and feed-forward channels removed for real
(the weight tensors shrink, the model gets faster and smaller; nothing is masked).

- Heads: in every attention (a module with Linear `c_attn` C -> 3D, Linear `c_proj` D -> C and an
  int `head_dim`, D = n_head x head_dim: profiler.models.gpt's CausalSelfAttention), each head is
  scored by the L2 norm of all the weights it owns: its head_dim rows in each of the q, k and v
  thirds of c_attn (weights and biases) and its head_dim columns of c_proj. The weakest
  floor(ratio x n_head) heads (ties: the lower index) are removed, at least one head is kept:
  Torch-Pruning's `prune_linear_out_channels` drops their 3 x head_dim rows of c_attn and
  `prune_linear_in_channels` their columns of c_proj, and the module's `n_head` (which its
  view/reshape read) is set to the heads left. Removing a head is exact: the model computes
  what the unpruned one computes with that head's output zeroed before c_proj (tested).
- Feed-forward channels: each dense MLP's hidden channels (c_fc's outputs, c_proj's inputs) are
  ranked by the L2 norm of their c_fc weight rows and the weakest floor(ratio x hidden) removed.

Every block loses the same number of heads and channels, so the pruned model is again a member of
its family: the model's `memplan_config` (stages[0]) is updated (n_head, head_dim, ffn_hidden) and
`memplan.profiler.analytic.gpt_analytic_profile` of it equals the pruned model's measured profile.

NOTE [ After pruning ]
The saved bytes, parameters and FLOPs changed but the stages' output sizes did not (a block still
maps (B, T, C) to (B, T, C)); the profile fingerprint includes each stage's parameter bytes, so
`run_plan` refuses a plan of the unpruned model against the pruned model's profile: re-profile and
re-plan after pruning (`memplan.executor.pipeline.run_builtin` does). The parameters
are new `nn.Parameter` objects: an optimizer built before pruning holds the old tensors and would
step nothing the model uses, so build the optimizer after pruning (`run_plan` builds its own from
the stages' current parameters at every call).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["prune_ffn", "prune_heads", "prune_model", "head_scores"]

log = logging.getLogger(__name__)


def _tp():
    try:
        import torch_pruning as tp
    except ImportError:
        raise ValueError("features: prune needs `pip install torch-pruning`") from None
    return tp


def _check_ratio(name: str, ratio: float, *, allow_zero: bool) -> None:
    lo_ok = ratio >= 0 if allow_zero else ratio > 0
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (lo_ok and ratio < 1):
        lo = "[0" if allow_zero else "(0"
        raise ValueError(f"{name}: must be in {lo}, 1) (the fraction removed), got {ratio!r}")


def _n_params(stages: Sequence[nn.Module]) -> int:
    from memplan.profiler.tensors import unique_params

    return sum(p.numel() for p in unique_params(stages))


def _mlps(stages: Sequence[nn.Module]) -> list[nn.Module]:
    out = []
    for s in stages:
        for m in s.modules():
            fc, proj = getattr(m, "c_fc", None), getattr(m, "c_proj", None)
            if isinstance(fc, nn.Linear) and isinstance(proj, nn.Linear) and fc.out_features == proj.in_features:
                out.append(m)
    return out


def _attentions(stages: Sequence[nn.Module]) -> list[nn.Module]:
    out = []
    for s in stages:
        for m in s.modules():
            qkv, proj, hd = getattr(m, "c_attn", None), getattr(m, "c_proj", None), getattr(m, "head_dim", None)
            if (isinstance(qkv, nn.Linear) and isinstance(proj, nn.Linear) and isinstance(hd, int)
                    and qkv.weight.shape[0] == 3 * proj.weight.shape[1] and proj.weight.shape[1] % hd == 0):
                out.append(m)
    return out


def head_scores(attn: nn.Module) -> torch.Tensor:
    """(n_head,) float64: each head's L2 norm over its q, k, v rows of c_attn (weight and bias)
    and its columns of c_proj (the importance prune_heads ranks by; lowest is removed first)."""
    hd = attn.head_dim
    W = attn.c_attn.weight.detach().double()  # (3D, C)
    D = W.shape[0] // 3
    H = D // hd
    sq = W.square().sum(1)  # (3D,)
    if attn.c_attn.bias is not None:
        sq = sq + attn.c_attn.bias.detach().double().square()
    per_head = sq.view(3, H, hd).sum((0, 2))  # (H,) q, k and v thirds together
    P = attn.c_proj.weight.detach().double()  # (C, D)
    per_head = per_head + P.square().sum(0).view(H, hd).sum(1)  # (H,)
    return per_head.sqrt()


def prune_heads(stages: Sequence[nn.Module], *, ratio: float = 0.25) -> dict:
    """Remove the weakest floor(`ratio` x n_head) heads (at least one kept) of every attention in
    place. Returns {"heads_before", "heads_after", "heads_removed": total, "removed": {module
    name: sorted head indices}} (head counts per attention)."""
    tp = _tp()
    _check_ratio("prune head ratio", ratio, allow_zero=True)
    attns = _attentions(stages)
    if not attns:
        raise ValueError("features: prune found no attention (c_attn, c_proj, head_dim) to prune heads of")
    names = {id(m): f"{getattr(s, 'memplan_name', f'stage{i}')}.{n}".rstrip(".")
             for i, s in enumerate(stages) for n, m in s.named_modules()}
    removed: dict[str, list[int]] = {}
    before = after = None
    total = 0
    for m in attns:
        hd = m.head_dim
        D = m.c_proj.weight.shape[1]
        H = D // hd
        n = min(math.floor(H * ratio), H - 1)
        heads = sorted(torch.argsort(head_scores(m), stable=True)[:n].tolist())
        if heads:
            rows = [third * D + h * hd + j for third in range(3) for h in heads for j in range(hd)]
            cols = [h * hd + j for h in heads for j in range(hd)]
            tp.prune_linear_out_channels(m.c_attn, rows)  # (3D, C) -> (3D', C)
            tp.prune_linear_in_channels(m.c_proj, cols)  # (C, D) -> (C, D')
            if hasattr(m, "n_head"):
                m.n_head = H - len(heads)  # the attention's view/reshape read it
        removed[names.get(id(m), type(m).__name__)] = heads
        total += len(heads)
        before, after = H, H - len(heads)
    return {"heads_before": before, "heads_after": after, "heads_removed": total, "removed": removed}


def prune_ffn(stages: Sequence[nn.Module], *, ratio: float = 0.25) -> tuple[str, dict]:
    """Remove the weakest `ratio` of every MLP's hidden channels in place. Returns a note and the
    metrics: parameter counts before and after, hidden channels per MLP before and after, and
    channels removed in all."""
    tp = _tp()
    _check_ratio("prune ratio", ratio, allow_zero=False)
    before = _n_params(stages)
    mlps = _mlps(stages)
    if not mlps:
        raise ValueError("features: prune found no MLP (c_fc, c_proj) to prune; use a dense GPT (no moe)")
    hidden_before = hidden_after = None
    total = 0
    for m in mlps:
        n = m.c_fc.out_features
        k = int(n * ratio)
        score = m.c_fc.weight.detach().float().norm(dim=1)  # (hidden,)
        idxs = sorted(torch.argsort(score, stable=True)[:k].tolist())
        tp.prune_linear_out_channels(m.c_fc, idxs)
        tp.prune_linear_in_channels(m.c_proj, idxs)
        hidden_before, hidden_after = n, n - k
        total += k
    _update_config(stages, ffn_hidden=hidden_after)
    after = _n_params(stages)
    note = (f"prune: Torch-Pruning removed {total} feed-forward channels ({int(ratio * 100)}% of "
            f"{len(mlps)} MLPs' hidden channels; {before} -> {after} parameters)")
    return note, {"params_before": before, "params_after": after, "ffn_hidden_before": hidden_before,
                  "ffn_hidden_after": hidden_after, "channels_removed": total}


def prune_model(stages: Sequence[nn.Module], *, head_ratio: float = 0.25, ffn_ratio: float = 0.25
                ) -> tuple[str, dict]:
    """Remove the weakest heads (`head_ratio` of each attention's, floor, one kept) and feed-forward
    channels (`ffn_ratio` of each MLP's hidden channels) in place; a ratio of 0 skips that part.

    Returns (note, metrics): params_before/params_after (counts), heads_before/heads_after (per
    attention) and heads_removed (all blocks), ffn_hidden_before/after and channels_removed, and
    the head indices removed per attention. Re-profile, re-plan and build a new optimizer after
    this (see NOTE [ After pruning ])."""
    _tp()
    _check_ratio("prune head ratio", head_ratio, allow_zero=True)
    _check_ratio("prune ffn ratio", ffn_ratio, allow_zero=True)
    if head_ratio == 0 and ffn_ratio == 0:
        raise ValueError("prune: head_ratio and ffn_ratio are both 0; set one above 0 to prune")
    before = _n_params(stages)
    metrics: dict = {"params_before": before}
    parts = []
    if head_ratio > 0:
        heads = prune_heads(stages, ratio=head_ratio)
        metrics.update(heads)
        if heads["heads_removed"]:
            _update_config(stages, n_head=heads["heads_after"])
        parts.append(f"{heads['heads_removed']} heads in all ({heads['heads_before']} -> {heads['heads_after']} "
                     f"per attention, {int(head_ratio * 100)}% floored)")
    if ffn_ratio > 0:
        _, ffn = prune_ffn(stages, ratio=ffn_ratio)
        metrics.update({k: v for k, v in ffn.items() if k not in ("params_before", "params_after")})
        parts.append(f"{ffn['channels_removed']} feed-forward channels in all ({ffn['ffn_hidden_before']} -> "
                     f"{ffn['ffn_hidden_after']} per MLP)")
    after = _n_params(stages)
    metrics["params_after"] = after
    note = f"prune: Torch-Pruning removed {' and '.join(parts)}; {before} -> {after} parameters"
    log.info(note)
    return note, metrics


def _update_config(stages: Sequence[nn.Module], **changes: int | None) -> None:
    """Keep the model's config (stages[0].memplan_config, read into profiles' meta) describing the
    pruned model: heads keep their width, so head_dim becomes explicit."""
    if not stages:
        return
    cfg = getattr(stages[0], "memplan_config", None)
    if not isinstance(cfg, dict) or cfg.get("family") != "gpt":
        return
    cfg = dict(cfg)
    if "n_head" in changes and not cfg.get("head_dim"):
        cfg["head_dim"] = cfg["n_embd"] // cfg["n_head"]
    cfg.update({k: v for k, v in changes.items() if v is not None})
    stages[0].memplan_config = cfg
