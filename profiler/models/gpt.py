"""A GPT-style decoder cut into stages: embedding, blocks, head + loss (nanoGPT's model.py is the
model for the layers), with its optional features: flash or math attention, a mixture-of-experts
feed-forward and early-exit heads.

    >>> from profiler.models.gpt import GPTConfig, build_gpt
    >>> stages, idx = build_gpt(GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16,
    ...                                   vocab_size=64, batch_size=2))
    >>> loss = idx
    >>> for stage in stages: loss = stage(loss)

Stage 1 (`GPTEmbed`) takes the integer tokens (B, T); each `Block` maps (B, T, C) to (B, T, C) and
ends with its residual add (so its output is never among its saved tensors); the last stage
(`GPTHead`) returns the scalar loss. The head holds the batch's targets (a buffer, see
`set_targets`), so that every stage has one tensor in and one tensor out.

NOTE [ Auxiliary losses through the chain ]
The MoE load-balancing and router z-losses and the early-exit heads' losses are computed inside
the blocks, but the chain carries one tensor between stages. Their gradient reaches the step
through the block's own output: `_AddAux.apply(branch, aux)` returns `branch` unchanged and, in the
backward, gives `aux` the gradient the loss has (1, or the loss scale under a gradient scaler,
read from the head's backward), exactly as if `aux` had been added to the final loss. Because it
is part of the block's graph, a recompute rebuilds it with the block: nothing lives outside the
stage. Their values are also added to the head's loss value (as constants, so that the reported
loss is ce + aux) from `GPTShared.aux_values`, which each block overwrites (never appends) under
its own key, so a recompute cannot count them twice.

NOTE [ Tied embeddings ]
GPT-2 shares the token embedding with the head's projection. In a chain that shared parameter
spans the first and the last stage: autograd holds the head's gradient for it in a buffer until the
embedding's backward adds its own, so V x C gradient bytes stay allocated through the whole
backward, whatever the plan. `tie_weights` is therefore off by default; when on, the profilers
count that buffer in `fixed_bytes` (`pending_shared_grad_bytes`), which keeps predictions safe.

NOTE [ Early exit as a chain ]
An exit head after block j is evaluated at the start of block j + 1 on its input. Its loss (ce of
its logits, times `exit_loss_coef`) trains it; its per-sample decision (mean over tokens of the
largest softmax probability >= `exit_threshold`) goes through `decide`, and the samples that have
exited skip every later block (the blocks run on the remaining rows only, and copy the exited rows
through). The final head scores every sample from its last hidden state. Per-sample compute (the
blocks each sample ran and their FLOPs) is reported by `gpt_report`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from memplan.profiler.models.decisions import decide, is_replaying

__all__ = [
    "GPTConfig",
    "GPTShared",
    "GPTEmbed",
    "Block",
    "GPTHead",
    "MoE",
    "build_gpt",
    "gpt_report",
    "set_targets",
    "moe_capacity",
    "GPT2_SIZES",
]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class GPTConfig:
    n_layer: int = 12  # transformer blocks (GPT-2 small: 12)
    n_embd: int = 768  # width C of the residual stream
    n_head: int = 12  # attention heads; n_embd must divide by it unless head_dim is set
    head_dim: int = 0  # width of one head; 0: n_embd // n_head (GPT-2). Pruned heads keep it
    ffn_hidden: int = 0  # feed-forward hidden width (MLP and each expert); 0: 4 * n_embd (GPT-2)
    block_size: int = 1024  # sequence length T of the example batch
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64
    batch_size: int = 8  # B of the example batch
    dropout: float = 0.0  # attention, residual and embedding dropout (0: none, as for pretraining)
    bias: bool = True  # biases in Linears and LayerNorms (GPT-2: True)
    attention: str = "flash"  # "flash" (SDPA's flash backend, reported fallback) or "math"
    tie_weights: bool = False  # share the token embedding with the head (GPT-2 does; see NOTE)
    dtype: str = "float32"  # parameter and compute dtype: float32, bfloat16, float16
    # mixture of experts (Switch Transformer, Fedus et al. 2021; GShard top-k priority)
    moe_experts: int = 0  # experts per feed-forward; 0: the dense MLP
    moe_top_k: int = 1  # experts per token
    moe_capacity_factor: float = 1.25  # expert capacity = ceil(factor * tokens * k / experts)
    moe_aux_loss_coef: float = 0.01  # Switch load-balancing loss weight (alpha)
    moe_z_loss_coef: float = 1e-3  # router z-loss weight (ST-MoE, Zoph et al. 2022)
    # early exit: an exit head after each listed block (0-based, < n_layer - 1)
    exit_layers: tuple[int, ...] = ()
    exit_threshold: float = 0.9  # a sample exits when its mean max-probability reaches this
    exit_loss_coef: float = 0.3  # weight of each exit head's loss in the step's loss
    seed: int = 0  # parameter initialisation and the example batch

    def __post_init__(self) -> None:
        self.exit_layers = tuple(int(j) for j in self.exit_layers)
        _validate(self)

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def attn_head_dim(self) -> int:
        """The width of one head: `head_dim`, or n_embd // n_head when it is 0."""
        return self.head_dim or self.n_embd // self.n_head

    @property
    def attn_inner(self) -> int:
        """The attention's inner width n_head * head_dim (c_attn's third, c_proj's input)."""
        return self.n_head * self.attn_head_dim

    @property
    def ffn_width(self) -> int:
        """The feed-forward hidden width: `ffn_hidden`, or 4 * n_embd when it is 0."""
        return self.ffn_hidden or 4 * self.n_embd


# GPT-2 sizes (Radford et al. 2019; nanoGPT's from_pretrained table)
GPT2_SIZES: dict[str, dict[str, int]] = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}


def _validate(cfg: GPTConfig) -> None:
    for name in ("n_layer", "n_embd", "n_head", "block_size", "vocab_size", "batch_size"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    for name in ("head_dim", "ffn_hidden"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: must be a positive integer, or 0 for the GPT-2 default, got {value!r}")
    if not cfg.head_dim and cfg.n_embd % cfg.n_head:
        raise ValueError(
            f"n_head: n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head}), "
            "or set head_dim"
        )
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"dropout: must be in [0, 1), got {cfg.dropout}")
    if cfg.attention not in ("flash", "math"):
        raise ValueError(f"attention: choose 'flash' or 'math', not {cfg.attention!r}")
    if cfg.dtype not in _DTYPES:
        raise ValueError(f"dtype: choose one of {', '.join(_DTYPES)}, not {cfg.dtype!r}")
    if cfg.moe_experts < 0:
        raise ValueError(f"moe_experts: must be >= 0 (0: dense MLP), got {cfg.moe_experts}")
    if cfg.moe_experts and not 1 <= cfg.moe_top_k <= cfg.moe_experts:
        raise ValueError(
            f"moe_top_k: must be between 1 and moe_experts ({cfg.moe_experts}), got {cfg.moe_top_k}"
        )
    if cfg.moe_experts and not cfg.moe_capacity_factor > 0:
        raise ValueError(f"moe_capacity_factor: must be > 0, got {cfg.moe_capacity_factor}")
    for j in cfg.exit_layers:
        if not 0 <= j < cfg.n_layer - 1:
            raise ValueError(
                f"exit_layers: {j} is not a block before the last (0..{cfg.n_layer - 2}); "
                "the final head already scores the last block"
            )
    if len(set(cfg.exit_layers)) != len(cfg.exit_layers):
        raise ValueError("exit_layers: each block may carry one exit head; remove the repeats")
    if not 0.0 < cfg.exit_threshold <= 1.0:
        raise ValueError(f"exit_threshold: must be in (0, 1], got {cfg.exit_threshold}")


def moe_capacity(cfg: GPTConfig) -> int:
    """Slots per expert: ceil(capacity_factor * tokens * k / experts) (Switch Transformer, eq. 3),
    fixed by the config so that every shape in the MoE layer is static."""
    from memplan.profiler.analytic import moe_capacity as _capacity

    return _capacity(cfg.batch_size * cfg.block_size, cfg.moe_top_k, cfg.moe_experts, cfg.moe_capacity_factor)


class GPTShared:
    """State the stages of one model share (plain Python, not a module; see the NOTEs above)."""

    def __init__(self) -> None:
        self.aux_values: dict[str, torch.Tensor] = {}  # key -> detached aux loss of the last forward
        self.loss_grad: torch.Tensor | None = None  # d(step loss)/d(head loss), from the head's backward
        self.exit_decisions: dict[int, torch.Tensor] = {}  # block j -> (B,) bool, exited after j
        self.targets_of = None  # callable returning the head's targets (B, T)


class _AddAux(torch.autograd.Function):
    """`branch` unchanged; `aux` receives the loss's gradient (see NOTE [ Auxiliary losses ])."""

    @staticmethod
    def forward(ctx, branch, aux, shared):  # noqa: D401
        ctx.shared = shared
        ctx.aux_meta = (aux.dtype, aux.device)
        return branch.view_as(branch)

    @staticmethod
    def backward(ctx, grad):
        dtype, device = ctx.aux_meta
        scale = ctx.shared.loss_grad
        g = torch.ones((), dtype=dtype, device=device) if scale is None else scale.to(dtype)
        return grad, g, None


class _LossGradProbe(torch.autograd.Function):
    """Identity on the loss; its backward records the loss's incoming gradient (1, or the scale a
    gradient scaler multiplied the loss by) for the auxiliary losses."""

    @staticmethod
    def forward(ctx, loss, shared):
        ctx.shared = shared
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):
        ctx.shared.loss_grad = grad.detach().reshape(())
        return grad, None


# ---------------------------------------------------------------------------------------------
# attention


_FLASH_PROBE: dict[tuple, str | None] = {}


_FLASH_WARNED: set[str] = set()  # fallback reasons already logged


def _flash_unavailable(q: torch.Tensor, dropout_p: float) -> str | None:
    """None when SDPA's flash backend runs these shapes/dtype/device; else the reason it does not."""
    key = (q.device.type, q.dtype, dropout_p > 0, q.shape[-1], q.requires_grad)
    if key in _FLASH_PROBE:
        return _FLASH_PROBE[key]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    small = torch.zeros(1, 1, 2, q.shape[-1], dtype=q.dtype, device=q.device)
    reason = None
    # the probe's dropout must not move the random stream: the run that probes first would
    # otherwise draw other masks than one whose probe was cached (the executor's reference step)
    cuda = [q.device.index if q.device.index is not None else torch.cuda.current_device()] \
        if q.device.type == "cuda" else []
    keep_rng = torch.random.fork_rng(devices=cuda) if dropout_p > 0 else contextlib.nullcontext()
    # nor may it show in a recording: under a selective checkpoint (a save policy,
    # profiler/policies.py) the probe's ops would be cached by the first forward and missing from
    # the recomputation (which finds the probe cached), a mismatch checkpoint refuses
    from torch.utils._python_dispatch import _disable_current_modes

    with warnings.catch_warnings(record=True) as caught, keep_rng, torch.no_grad(), \
            _disable_current_modes():
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(small, small, small, dropout_p=dropout_p, is_causal=True)
        except RuntimeError as err:
            texts = [str(w.message).split(" (Triggered")[0] for w in caught]
            reason = "; ".join(t for t in texts if t).replace(":;", ":") or str(err).splitlines()[0]
    _FLASH_PROBE[key] = reason
    return reason


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        D = cfg.attn_inner  # n_head * head_dim (n_embd unless head_dim is set or heads pruned)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * D, bias=cfg.bias)  # C -> q, k, v: 3 x D
        self.c_proj = nn.Linear(D, cfg.n_embd, bias=cfg.bias)  # D -> C
        self.resid_dropout = nn.Dropout(cfg.dropout)
        # heads and their width: the view/reshape below read these (pruning updates n_head)
        self.n_head, self.head_dim = cfg.n_head, cfg.attn_head_dim
        self.n_embd, self.dropout = cfg.n_embd, cfg.dropout
        self.requested = cfg.attention
        self.backend = cfg.attention  # what the last forward used
        self.fallback_reason: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        B, T, C = x.size()
        H, hs = self.n_head, self.head_dim
        D = H * hs
        q, k, v = self.c_attn(x).split(D, dim=2)  # 3 x (B, T, D)
        q = q.view(B, T, H, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, H, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, H, hs).transpose(1, 2)  # (B, nh, T, hs)
        p = self.dropout if self.training else 0.0
        backend = SDPBackend.MATH
        if self.requested == "flash":
            reason = _flash_unavailable(q, p)
            if reason is None:
                backend, self.backend = SDPBackend.FLASH_ATTENTION, "flash"
            else:
                if reason not in _FLASH_WARNED:  # once per process and reason, not per block
                    _FLASH_WARNED.add(reason)
                    log.warning("flash attention unavailable (%s); using the math path", reason)
                self.backend, self.fallback_reason = "math", reason
        with sdpa_kernel(backend):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, D)  # (B, T, D)
        return self.resid_dropout(self.c_proj(y))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.ffn_width, bias=cfg.bias)  # C -> F (4C unless set)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(cfg.ffn_width, cfg.n_embd, bias=cfg.bias)  # F -> C
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x)))), None  # (B, T, C)


class MoE(nn.Module):
    """Top-k routed experts with a fixed capacity per expert (tokens beyond it are dropped, i.e. pass
    through the residual only), the Switch load-balancing loss and the router z-loss.

    Every shape is static: each expert runs on `capacity` slots (empty ones are zero), so the
    saved bytes follow from the config alone (profiler.analytic)."""

    def __init__(self, cfg: GPTConfig, key: str):
        super().__init__()
        E, C, F_ = cfg.moe_experts, cfg.n_embd, cfg.ffn_width
        self.key, self.E, self.k = key, E, cfg.moe_top_k
        self.capacity = moe_capacity(cfg)
        self.aux_coef, self.z_coef = cfg.moe_aux_loss_coef, cfg.moe_z_loss_coef
        self.router = nn.Linear(C, E, bias=False)
        self.w_fc = nn.Parameter(torch.randn(E, C, F_) * 0.02)  # (E, C, F), F = 4C by default
        self.w_proj = nn.Parameter(torch.randn(E, F_, C) * 0.02)  # (E, F, C)
        self.gelu = nn.GELU()
        self.register_buffer("expert_counts", torch.zeros(E, dtype=torch.long))  # tokens kept, per expert
        self.register_buffer("dropped_count", torch.zeros((), dtype=torch.long))  # assignments dropped

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        N, E, k, cap = B * T, self.E, self.k, self.capacity
        xf = x.reshape(N, C)  # (N, C)
        logits = self.router(xf).float()  # (N, E) router in fp32 (Switch Transformer, sec. 2.4)
        probs = logits.softmax(dim=-1)  # (N, E)
        top = decide(f"{self.key}.topk", lambda: probs.detach().topk(k, dim=-1).indices)  # (N, k)
        gates = probs.gather(1, top)  # (N, k)
        if k > 1:
            gates = gates / gates.sum(dim=-1, keepdim=True)  # (N, k)
        expert = top.t().reshape(-1)  # (A,) A = N*k, first choices first (GShard priority)
        with torch.no_grad():
            onehot = F.one_hot(expert, E)  # (A, E)
            pos = (onehot.cumsum(0) * onehot).sum(1) - 1  # (A,) place in the expert's queue
        keep = decide(f"{self.key}.keep", lambda: pos < cap)  # (A,) bool
        slot = torch.where(keep, expert * cap + pos, E * cap)  # (A,) dropped -> a dump slot
        token = torch.arange(N, device=x.device).repeat(k)  # (A,)
        src = xf if k == 1 else xf.index_select(0, token)  # (A, C)
        buf = xf.new_zeros(E * cap + 1, C).index_add(0, slot, src)  # (E*cap+1, C)
        h = buf[: E * cap].view(E, cap, C)  # (E, cap, C)
        h = self.gelu(torch.bmm(h, self.w_fc))  # (E, cap, F)
        y = torch.bmm(h, self.w_proj).view(E * cap, C)  # (E*cap, C)
        y = torch.cat([y, y.new_zeros(1, C)])  # (E*cap+1, C)
        weight = (gates.t().reshape(-1) * keep).to(x.dtype)  # (A,)
        out = xf.new_zeros(N, C).index_add(0, token, y.index_select(0, slot) * weight[:, None])
        # Switch load balancing: E * sum_e f_e P_e, f_e the share of first choices sent to e
        frac = F.one_hot(top[:, 0], E).float().mean(0).detach()  # (E,)
        balance = E * (frac * probs.mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).square().mean()  # router z-loss
        aux = self.aux_coef * balance + self.z_coef * z
        if not is_replaying():
            with torch.no_grad():
                self.expert_counts += torch.bincount(expert[keep], minlength=E)
                self.dropped_count += (~keep).sum()
        return out.view(B, T, C), aux


class ExitHead(nn.Module):
    """An early-exit head: LayerNorm + projection to the vocabulary, scored against the targets."""

    def __init__(self, cfg: GPTConfig, after: int):
        super().__init__()
        self.after = after
        self.threshold, self.coef = cfg.exit_threshold, cfg.exit_loss_coef
        self.ln = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.register_buffer("exit_count", torch.zeros((), dtype=torch.long))  # samples exited here

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.proj(self.ln(x))  # (B, T, V)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

        def confident() -> torch.Tensor:
            with torch.no_grad():
                conf = logits.float().softmax(-1).amax(-1).mean(-1)  # (B,)
                return conf >= self.threshold

        exits = decide(f"exit.{self.after}", confident)  # (B,) bool
        return self.coef * loss, exits


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, index: int, shared: GPTShared):
        super().__init__()
        self.index = index
        self._shared = [shared]  # a list: not a submodule, not in state_dict
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MoE(cfg, f"block.{index}.moe") if cfg.moe_experts else MLP(cfg)
        self.exit = ExitHead(cfg, index - 1) if (index - 1) in cfg.exit_layers else None

    @property
    def shared(self) -> GPTShared:
        return self._shared[0]

    def _body(self, x: torch.Tensor, aux: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        branch, moe_aux = self.mlp(self.ln_2(x))  # (B, T, C)
        if moe_aux is not None:
            aux = moe_aux if aux is None else aux + moe_aux
        if aux is not None:
            self.shared.aux_values[f"block.{self.index}"] = aux.detach()
            branch = _AddAux.apply(branch, aux, self.shared)
        return x + branch  # (B, T, C): the residual add ends the block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aux = None
        if self.exit is not None:
            aux, exits = self.exit(x, self.shared.targets_of())
            self.shared.exit_decisions[self.exit.after] = exits
            if not is_replaying():
                with torch.no_grad():
                    self.exit.exit_count += exits.sum()
        exited = None
        for j, d in self.shared.exit_decisions.items():
            if j < self.index:
                exited = d if exited is None else exited | d
        if exited is None or not bool(exited.any()):
            return self._body(x, aux)
        rows = (~exited).nonzero().squeeze(1)  # (B_active,)
        y = self._body(x.index_select(0, rows), aux)  # (B_active, T, C)
        return x.index_copy(0, rows, y)  # exited samples pass through unchanged


class GPTEmbed(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.block_size = cfg.block_size

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input: token ids must be an integer tensor, got {idx.dtype}")
        B, T = idx.size()
        if T > self.block_size:
            raise ValueError(f"input: sequence of length {T} is longer than block_size {self.block_size}")
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        return self.drop(x) if self.drop.p > 0 else x


class GPTHead(nn.Module):
    def __init__(self, cfg: GPTConfig, shared: GPTShared):
        super().__init__()
        self._shared = [shared]
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.register_buffer(
            "targets", torch.zeros(cfg.batch_size, cfg.block_size, dtype=torch.long)
        )  # (B, T) next tokens of the example batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), self.targets.view(-1))
        shared = self._shared[0]
        if shared.aux_values:
            loss = loss + sum(v.float() for v in shared.aux_values.values())  # values only
        return _LossGradProbe.apply(loss, shared)  # () fp32


def set_targets(stages: list[nn.Module], targets: torch.Tensor) -> None:
    """Use `targets` (B, T) as the next tokens the head (and exit heads) score."""
    head = stages[-1]
    if not isinstance(head, GPTHead):
        raise ValueError("stages: the last stage is not a GPTHead")
    if targets.shape != head.targets.shape:
        raise ValueError(f"targets: expected shape {tuple(head.targets.shape)}, got {tuple(targets.shape)}")
    head.targets.copy_(targets)


def build_gpt(cfg: GPTConfig | None = None, *, device: str | torch.device = "cpu"):
    """`(stages, example_input)`: the model as [GPTEmbed, Block x n_layer, GPTHead] (train mode, on
    `device`, in `cfg.dtype`) and a batch of token ids (B, T) int64. The head's targets are the
    batch shifted by one token (the next token of a random sequence)."""
    cfg = cfg or GPTConfig()
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        shared = GPTShared()
        embed = GPTEmbed(cfg)
        blocks = [Block(cfg, i, shared) for i in range(cfg.n_layer)]
        head = GPTHead(cfg, shared)
        stages: list[nn.Module] = [embed, *blocks, head]
        for stage in stages:
            stage.apply(_init_weights)
            for name, p in stage.named_parameters():  # GPT-2's scaled init of residual projections
                if name.endswith("c_proj.weight") or name.endswith("w_proj"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
    if cfg.tie_weights:
        head.lm_head.weight = embed.wte.weight
    seq = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size + 1), generator=gen)
    idx = seq[:, :-1].contiguous()  # (B, T)
    head.targets.copy_(seq[:, 1:])
    shared.targets_of = lambda: head.targets
    for stage in stages:
        stage.to(device=device, dtype=cfg.torch_dtype)
        stage.train()
    for i, stage in enumerate(stages):
        stage.memplan_name = "embed" if i == 0 else ("head" if i == len(stages) - 1 else f"block.{i - 1}")
        stage.memplan_kind = "embed" if i == 0 else ("head" if i == len(stages) - 1 else "block")
    stages[0].memplan_config = {"family": "gpt", **asdict(cfg)}
    return stages, idx.to(device)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def gpt_report(stages: list[nn.Module]) -> dict:
    """What the last forward did: attention backends (and fallback reasons), expert token counts,
    early exits with per-sample compute (blocks run and forward FLOPs per sample)."""
    blocks = [s for s in stages if isinstance(s, Block)]
    report: dict = {"attention": {}, "moe": {}, "exit": {}}
    for b in blocks:
        a = b.attn
        report["attention"][f"block.{b.index}"] = {
            "requested": a.requested, "used": a.backend, "fallback_reason": a.fallback_reason,
        }
        if isinstance(b.mlp, MoE):
            report["moe"][f"block.{b.index}"] = {
                "expert_counts": b.mlp.expert_counts.tolist(),
                "dropped": int(b.mlp.dropped_count),
                "capacity": b.mlp.capacity,
            }
    if blocks and blocks[0].shared.exit_decisions:
        shared = blocks[0].shared
        embed = stages[0]
        B = next(iter(shared.exit_decisions.values())).numel()
        T = embed.block_size
        C = embed.wte.embedding_dim
        V = embed.wte.num_embeddings
        runs = []
        for s in range(B):
            n = 0
            for b in blocks:
                if not any(bool(d[s]) for j, d in shared.exit_decisions.items() if j < b.index):
                    n += 1
            runs.append(n)
        block_flops = _block_forward_flops_per_sample(T, C, blocks[0])
        report["exit"] = {
            "decisions": {str(j): d.tolist() for j, d in sorted(shared.exit_decisions.items())},
            "exit_counts": {str(b.exit.after): int(b.exit.exit_count) for b in blocks if b.exit is not None},
            "per_sample_blocks": runs,
            "per_sample_block_flops": [n * block_flops for n in runs],
            "full_block_flops": len(blocks) * block_flops,
            "vocab_size": V,
        }
    return report


def _block_forward_flops_per_sample(T: int, C: int, block: Block) -> float:
    """2 x multiply-adds of one block on one sequence (Kaplan et al. 2020, table 1 with the causal
    attention counted in full), at the block's own widths: D = n_head * head_dim for the
    attention, F hidden channels for the feed-forward (4C unless set or pruned)."""
    D = block.attn.n_head * block.attn.head_dim
    if isinstance(block.mlp, MoE):
        ffn = 2 * T * block.mlp.k * 2 * C * block.mlp.w_fc.shape[2]
    else:  # c_fc may be wrapped (QAT): its Linear holds the width
        fc = [m for m in block.mlp.c_fc.modules() if isinstance(m, nn.Linear)][-1]
        ffn = 2 * T * 2 * C * fc.out_features
    return float(2 * T * 4 * C * D + 2 * 2 * T * T * D + ffn)
