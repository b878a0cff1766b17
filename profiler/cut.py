"""Cut common models into stages for `profile_chain` and the executor, the last stage returning the
scalar loss.

- `cut_sequential(seq, loss_fn=..., targets=...)`: an `nn.Sequential`, one stage per child (or per
  group of `group` children), the loss appended to the last.
- `cut_blocks(embedding, blocks, head, loss_fn=..., targets=...)`: the GPT shape.
- `cut_decoder(model)`: a Hugging Face decoder-only LM (GPT-2's `transformer.{h, ln_f}` or the
  Llama family's `model.{layers, norm}`, with `lm_head`): the model's own embedding and masks, one
  stage per decoder layer, final norm + head + the model's own loss. Its chain takes the batch as
  the model takes it (NOTE [ A decoder cut takes the batch ]).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from memplan.profiler.schema import ProfileError

__all__ = ["cut_sequential", "cut_blocks", "cut_decoder", "WithLoss", "DecoderBatch"]


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


# ---------------------------------------------------------------------------------------------
# Hugging Face decoder-only LMs

# NOTE [ A decoder cut takes the batch ]
# The chain's input a_0 is the batch exactly as the model takes it: a dict with "input_ids" and
# "labels" (and, optionally, "attention_mask", "position_ids" or any other keyword of the model's
# backbone). Every value a_i after it is the pair (hidden states, DecoderBatch): the hidden states
# carry the gradient; the DecoderBatch, a plain object (so the runner passes it on untouched, with
# no alias and no gradient), carries the labels and each layer's other arguments. Nothing is baked
# into a stage: a runner step takes a fresh batch each call.
# The embedding stage computes the layers' arguments by running the model's own backbone forward
# with every decoder layer replaced by a pass-through that records what it was called with. So the
# causal mask (eager or sdpa, sliding windows, padding), the position ids and the rotary position
# embeddings are exactly the ones the model's forward builds, in whichever transformers version is
# installed: memplan does not rebuild them. The backbone also applies its final norm to the
# embedding output there (its result is discarded: a transient of stage 1); the head stage applies
# the final norm, the LM head and the model's own `loss_function`, which shifts the labels as the
# model does.


class DecoderBatch:
    """What a decoder chain carries beside the hidden states: the batch's `labels` (B, T) and, per
    decoder layer, the positional and keyword arguments the model's forward called it with (the
    hidden states left out)."""

    __slots__ = ("labels", "layer_args")

    def __init__(self, labels: torch.Tensor, layer_args: list[tuple[tuple, dict]]):
        self.labels = labels
        self.layer_args = layer_args


def _first_tensor(out) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


class _DecoderEmbed(nn.Module):
    """Stage 1: the backbone's forward up to its layers (NOTE [ A decoder cut takes the batch ]);
    returns (hidden states, DecoderBatch)."""

    def __init__(self, backbone: nn.Module, layers: nn.ModuleList, norm: nn.Module, tuple_out: bool):
        super().__init__()
        # the backbone's own modules before its layers (embeddings, dropout, rotary embedding):
        # registered here so that their parameters and buffers belong to this stage
        self.parts = nn.ModuleDict({name: child for name, child in backbone.named_children()
                                    if child is not layers and child is not norm})
        self._backbone = [backbone]  # not a submodule: the layers belong to their own stages
        self._layers = [layers]
        self._tuple_out = tuple_out

    def forward(self, batch: dict) -> tuple[torch.Tensor, DecoderBatch]:
        if not isinstance(batch, dict) or "input_ids" not in batch or "labels" not in batch:
            got = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise ProfileError(
                f"batch: a decoder chain takes the model's batch, a dict with 'input_ids' and "
                f"'labels' (and optionally 'attention_mask'), got {got}"
            )
        kwargs = {k: v for k, v in batch.items() if k != "labels"}
        calls: list[tuple[tuple, dict]] = []
        tuple_out = self._tuple_out

        def passthrough(*args, **kw):
            calls.append((args, kw))
            hidden = args[0] if args else kw["hidden_states"]
            return (hidden,) if tuple_out else hidden

        layers = list(self._layers[0])
        own = [layer.__dict__.get("forward") for layer in layers]  # a forward set on the instance
        for layer in layers:
            layer.forward = passthrough  # an instance attribute shadows the class's forward
        try:
            self._backbone[0](**kwargs, use_cache=False)
        finally:
            for layer, fwd in zip(layers, own, strict=True):
                del layer.forward
                if fwd is not None:
                    layer.forward = fwd
        if len(calls) != len(layers):
            raise ProfileError(
                f"model: its forward called {len(calls)} of its {len(layers)} decoder layers; "
                "cut_decoder needs a forward that calls each layer once"
            )
        args0, kw0 = calls[0]
        hidden = args0[0] if args0 else kw0["hidden_states"]
        layer_args = [
            (args[1:], kw) if args else (args, {k: v for k, v in kw.items() if k != "hidden_states"})
            for args, kw in calls
        ]
        return hidden, DecoderBatch(batch["labels"], layer_args)


class _DecoderLayer(nn.Module):
    """One decoder layer as a stage: (hidden, DecoderBatch) in, the same pair out."""

    def __init__(self, layer: nn.Module, index: int):
        super().__init__()
        self.layer = layer
        self.index = index

    def forward(self, value: tuple[torch.Tensor, DecoderBatch]) -> tuple[torch.Tensor, DecoderBatch]:
        hidden, batch = value
        args, kw = batch.layer_args[self.index]
        return _first_tensor(self.layer(hidden, *args, **kw)), batch


def _causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Next-token cross entropy as Hugging Face's ForCausalLMLoss computes it (labels shifted left,
    -100 ignored, logits in float32)."""
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    return F.cross_entropy(logits.float().view(-1, vocab_size), shifted.view(-1).to(logits.device),
                           ignore_index=-100)


class _DecoderHead(nn.Module):
    """Last stage: final norm, LM head and the model's own loss (its `loss_function`)."""

    def __init__(self, model: nn.Module, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head
        self._model = [model]

    def forward(self, value: tuple[torch.Tensor, DecoderBatch]) -> torch.Tensor:
        hidden, batch = value
        model = self._model[0]
        logits = self.lm_head(self.norm(hidden))
        vocab = model.config.vocab_size
        loss_fn = getattr(model, "loss_function", None)
        if loss_fn is not None:
            return loss_fn(logits=logits, labels=batch.labels, vocab_size=vocab)
        return _causal_lm_loss(logits, batch.labels, vocab)


def _layout(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """(backbone, its decoder layers, its final norm) of a GPT-2 or Llama-family layout."""
    t = getattr(model, "transformer", None)
    if t is not None and isinstance(getattr(t, "h", None), nn.ModuleList) and hasattr(t, "ln_f"):
        return t, t.h, t.ln_f
    m = getattr(model, "model", None)
    if m is not None and isinstance(getattr(m, "layers", None), nn.ModuleList) and hasattr(m, "norm"):
        return m, m.layers, m.norm
    raise ProfileError(
        "model: unknown layout; expected transformer.{h, ln_f} (GPT-2) or model.{layers, norm} "
        "(Llama, Mistral, Qwen2); cut it with cut_blocks instead"
    )


def _layers_return_tuples(backbone: nn.Module, layers: nn.ModuleList) -> bool:
    """Whether the backbone's layers return tuples (GPT-2 under transformers 4.x) or a tensor: one
    forward of a single token, outside autograd, the random streams left as they were."""
    seen: list[bool] = []
    handle = layers[0].register_forward_hook(lambda m, a, out: seen.append(isinstance(out, tuple)))
    param = next(backbone.parameters())
    devices = [param.device] if param.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            backbone(input_ids=torch.zeros(1, 1, dtype=torch.long, device=param.device), use_cache=False)
    finally:
        handle.remove()
    return bool(seen and seen[0])


def cut_decoder(model: nn.Module) -> list[nn.Module]:
    """Stages of a Hugging Face decoder-only LM (GPT-2, Llama, Mistral, Qwen2 layouts): the
    embedding (the model's own backbone forward up to its layers), one stage per decoder layer, and
    the head (final norm, LM head, the model's own loss).

    Returns the stages; their chain takes the model's batch dict {"input_ids", "labels"[,
    "attention_mask", ...]} as a_0 and its last stage returns exactly `model(**batch).loss`
    (NOTE [ A decoder cut takes the batch ]). Raises `ProfileError` for another layout."""
    lm_head = getattr(model, "lm_head", None)
    if lm_head is None:
        raise ProfileError("model: no lm_head; expected a decoder-only LM (e.g. GPT2LMHeadModel)")
    if getattr(model, "config", None) is None:
        raise ProfileError("model: no config; expected a Hugging Face PreTrainedModel")
    backbone, layers, norm = _layout(model)
    embed = _DecoderEmbed(backbone, layers, norm, _layers_return_tuples(backbone, layers))
    blocks = [_DecoderLayer(layer, i) for i, layer in enumerate(layers)]
    return cut_blocks(embed, blocks, _DecoderHead(model, norm, lm_head))
