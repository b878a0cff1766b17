"""Cut common models into stages for `profile_chain` and the executor: one tensor in, one out, the
last stage returning the scalar loss.

- `cut_sequential(seq, loss_fn=..., targets=...)`: an `nn.Sequential`, one stage per child (or per
  group of `group` children), the loss appended to the last.
- `cut_blocks(embedding, blocks, head, loss_fn=..., targets=...)`: the GPT shape.
- `cut_decoder(model, targets=...)`: a Hugging Face-style decoder-only LM (GPT-2's
  `transformer.{wte, wpe, drop, h, ln_f}` + `lm_head`, or Llama's `model.{embed_tokens, layers,
  norm, rotary_emb}` + `lm_head`): embedding, one stage per decoder layer, final norm + head + loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from memplan.profiler.schema import ProfileError

__all__ = ["cut_sequential", "cut_blocks", "cut_decoder", "WithLoss"]


class WithLoss(nn.Module):
    """`loss_fn(module(x), targets)`: a head that ends the chain with the scalar loss."""

    def __init__(self, module: nn.Module, loss_fn: Callable, targets: torch.Tensor):
        super().__init__()
        self.module = module
        self.loss_fn = loss_fn
        self.register_buffer("targets", targets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.module(x), self.targets)


def _named(stages: list[nn.Module], names: list[str], kinds: list[str]) -> list[nn.Module]:
    for stage, name, kind in zip(stages, names, kinds, strict=True):
        stage.memplan_name = name
        stage.memplan_kind = kind
    return stages


def cut_sequential(
    seq: nn.Sequential, *, loss_fn: Callable, targets: torch.Tensor, group: int = 1
) -> list[nn.Module]:
    """Stages of `seq`: each `group` consecutive children form one stage; the last stage is wrapped
    so that it returns `loss_fn(output, targets)`."""
    if not isinstance(seq, nn.Sequential):
        raise ProfileError(f"seq: expected an nn.Sequential, got {type(seq).__name__}")
    children = list(seq.named_children())
    if not children:
        raise ProfileError("seq: the Sequential is empty")
    if not isinstance(group, int) or group < 1:
        raise ProfileError(f"group: must be an integer >= 1, got {group!r}")
    stages, names = [], []
    for k in range(0, len(children), group):
        part = children[k : k + group]
        mod = part[0][1] if len(part) == 1 else nn.Sequential(*(m for _, m in part))
        stages.append(mod)
        names.append(part[0][0] if len(part) == 1 else f"{part[0][0]}-{part[-1][0]}")
    stages[-1] = WithLoss(stages[-1], loss_fn, targets)
    return _named(stages, names, ["layer"] * (len(stages) - 1) + ["head"])


def cut_blocks(
    embedding: nn.Module,
    blocks: Sequence[nn.Module],
    head: nn.Module,
    *,
    loss_fn: Callable | None = None,
    targets: torch.Tensor | None = None,
) -> list[nn.Module]:
    """[embedding, *blocks, head]; with `loss_fn` and `targets` the head is wrapped to return the
    loss (otherwise it must return the loss itself)."""
    if (loss_fn is None) != (targets is None):
        raise ProfileError("loss_fn, targets: give both (to wrap the head) or neither")
    blocks = list(blocks)
    if not blocks:
        raise ProfileError("blocks: empty; give at least one block")
    last = WithLoss(head, loss_fn, targets) if loss_fn is not None else head
    stages = [embedding, *blocks, last]
    names = ["embed", *(f"block.{i}" for i in range(len(blocks))), "head"]
    return _named(stages, names, ["embed", *["block"] * len(blocks), "head"])


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class _DecoderEmbed(nn.Module):
    def __init__(self, wte: nn.Module, wpe: nn.Module | None, drop: nn.Module | None):
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.size(1), device=idx.device))
        return self.drop(x) if self.drop is not None else x


class _DecoderLayer(nn.Module):
    """One decoder layer as a stage: first element of a tuple output; Llama-style layers get their
    rotary position embeddings from the model's `rotary_emb`."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None):
        super().__init__()
        self.layer = layer
        self._rotary = [rotary]  # not a submodule: shared by all layers, owned by no stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rotary = self._rotary[0]
        if rotary is not None:
            pos = torch.arange(x.size(1), device=x.device).unsqueeze(0)  # (1, T)
            out = self.layer(x, position_embeddings=rotary(x, pos), position_ids=pos)
        else:
            out = self.layer(x)
        return out[0] if isinstance(out, (tuple, list)) else out


class _DecoderHead(nn.Module):
    def __init__(self, norm: nn.Module, lm_head: nn.Module, targets: torch.Tensor):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head
        self.register_buffer("targets", targets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _lm_loss(self.lm_head(self.norm(x)), self.targets)


def cut_decoder(model: nn.Module, *, targets: torch.Tensor) -> list[nn.Module]:
    """Stages of a Hugging Face-style decoder-only LM (GPT-2 or Llama layout), the head scoring
    `targets` (B, T). Attention masks are left to the layers' causal default."""
    lm_head = getattr(model, "lm_head", None)
    if lm_head is None:
        raise ProfileError("model: no lm_head; expected a decoder-only LM (e.g. GPT2LMHeadModel)")
    if hasattr(model, "transformer") and hasattr(model.transformer, "h"):
        t = model.transformer
        embed = _DecoderEmbed(t.wte, getattr(t, "wpe", None), getattr(t, "drop", None))
        layers, norm, rotary = list(t.h), t.ln_f, None
    elif hasattr(model, "model") and hasattr(model.model, "layers"):
        m = model.model
        embed = _DecoderEmbed(m.embed_tokens, None, None)
        layers, norm, rotary = list(m.layers), m.norm, getattr(m, "rotary_emb", None)
    else:
        raise ProfileError(
            "model: unknown layout; expected transformer.{wte, h, ln_f} (GPT-2) or "
            "model.{embed_tokens, layers, norm} (Llama); cut it with cut_blocks instead"
        )
    blocks = [_DecoderLayer(layer, rotary) for layer in layers]
    return cut_blocks(embed, blocks, _DecoderHead(norm, lm_head, targets))
