"""Hugging Face decoder configs read without transformers: shapes and parameter counts.

`decoder_shape(config)` reads a local `config.json` (a path, JSON text or a dict) into a
`DecoderShape`: the fields every count below needs, named once, for the families memplan knows:

    llama-style   llama, mistral, qwen2, qwen3, gemma, gemma2 (RMSNorm, SwiGLU/GeGLU MLP,
                  rotary positions, grouped-query attention, tied or untied embeddings)
    mixtral       sparse MoE MLP: a router C x E and E SwiGLU experts, top-k
    qwen2_moe     sparse MoE MLP plus one shared SwiGLU expert and its sigmoid gate (C x 1);
                  dense layers where `mlp_only_layers` or `decoder_sparse_step` say so
    gpt2          learned positions, LayerNorm with biases, Conv1D projections, tied head
    gpt_neox      rotary, LayerNorm with biases, fused QKV, untied head unless tied

`param_counts(shape)` counts parameters per stage (embedding, each decoder layer, final norm +
head) from the shapes alone, as transformers builds the modules (rotary tables and masks are
buffers, not parameters). Checked equal to the published counts and to transformers' own models
built on the meta device (tests/profiler/test_hf_config.py). No torch, no transformers here.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memplan.profiler.schema import ProfileError, check_flops_per_s, check_optimizer

log = logging.getLogger(__name__)

__all__ = ["CONFIG_DTYPES", "MAX_LAYERS", "DecoderShape", "ParamCounts", "decoder_shape", "param_counts", "n_params", "FAMILIES",
           "hf_analytic_profile", "hf_model", "measure_hf_config", "check_split", "CHUNK_BYTES",
           "CHUNKS_AT_LEAST", "rows_per_chunk", "loss_meta", "REUSE_LOGITS_NEEDS_LEAN"]

# model_type -> the family whose layer layout it has
FAMILIES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "gemma": "llama",
    "gemma2": "llama", "mixtral": "mixtral", "qwen2_moe": "qwen2_moe", "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
}


# NOTE [ A ceiling on decoder layers ]
# Every count, profile and plan here walks the layers one by one, so a config's layer count is held
# to MAX_LAYERS: far above any published decoder (~130 layers) and the planner's order of stages,
# low enough that a profile of that many stages is made in seconds. A larger count is refused in
# one line naming the field, before any work (without it 1e9 layers ran for minutes and ended in
# a MemoryError).
MAX_LAYERS = 10_000

# the dtype names a Hugging Face config may give as `torch_dtype` or `dtype` (torch.<name> is a
# floating torch.dtype); the model is built in float32 whatever it says
CONFIG_DTYPES = frozenset({"float32", "float", "float16", "half", "bfloat16", "float64", "double"})


@dataclass(frozen=True)
class DecoderShape:
    """The shapes of a decoder-only LM, in the config's own terms (sizes in elements)."""

    model_type: str  # the config's model_type, e.g. "llama"
    family: str  # llama (dense llama-style), mixtral, qwen2_moe, gpt2 or gpt_neox
    vocab_size: int  # V: embedding rows
    hidden_size: int  # C: the residual stream's width
    n_layer: int  # L: decoder layers
    n_head: int  # H: query heads
    n_kv_head: int  # KV: key/value heads (grouped-query attention; = H for multi-head)
    head_dim: int  # one head's width (hidden_size // n_head unless the config sets it)
    intermediate_size: int  # F: the dense MLP's hidden width
    tie_embeddings: bool  # the head reuses the embedding matrix
    qkv_bias: bool = False  # biases on q, k, v projections (Qwen2: True)
    o_bias: bool = False  # bias on the attention's output projection
    mlp_bias: bool = False  # biases on the MLP's projections
    norm: str = "rms"  # "rms" (weight only) or "layer" (weight and bias)
    norms_per_layer: int = 2  # gemma2: 4 (pre and post attention and feed-forward)
    qk_norm: bool = False  # qwen3: RMSNorm of each head's q and k (weight head_dim each)
    max_positions: int = 0  # gpt2: rows of the learned position table
    n_experts: int = 0  # E: experts per MoE layer (0: dense)
    top_k: int = 0  # experts per token
    expert_intermediate_size: int = 0  # each expert's hidden width
    shared_expert_intermediate_size: int = 0  # qwen2_moe: the shared expert's hidden width
    moe_layers: tuple[bool, ...] = ()  # per layer: sparse MoE (True) or dense MLP
    sliding_window: int | None = None  # attention window in tokens (None: full causal)
    rope_theta: float | None = None  # rotary base (reports only)
    extra: dict[str, Any] = field(default_factory=dict)  # fields read for reports

    def as_dict(self) -> dict[str, Any]:
        """The shape as a JSON-able dict."""
        d = asdict(self)
        d["moe_layers"] = list(self.moe_layers)
        return d


@dataclass(frozen=True)
class ParamCounts:
    """Parameters (elements) per stage of the chain embedding, layers, head."""

    embed: int  # token (and gpt2: position) embeddings
    layers: tuple[int, ...]  # each decoder layer
    head: int  # final norm and the LM head (0 rows when tied)
    tensors: int  # parameter tensors (AdamW keeps a step counter for each)
    active: int  # parameters a token passes through (MoE: top_k experts, not all)

    @property
    def total(self) -> int:
        """All parameters (elements)."""
        return self.embed + sum(self.layers) + self.head


def _load(config: str | Path | dict) -> dict:
    if isinstance(config, dict):
        return config
    text = None
    if isinstance(config, Path) or (isinstance(config, str) and not config.lstrip().startswith("{")):
        path = Path(config)
        if not path.exists():
            raise ProfileError(f"config: no such file {str(path)!r}; give a Hugging Face config.json")
        text = path.read_text()
    else:
        text = config
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"config: not valid JSON (line {err.lineno}, column {err.colno}: "
                           f"{err.msg})") from None
    if not isinstance(data, dict):
        raise ProfileError("config: expected a JSON object (a Hugging Face config.json)")
    return data


def _int(cfg: dict, key: str, *, default: int | None = None, low: int = 1, high: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ProfileError(f"config.{key}: missing; a Hugging Face config of this model_type has it")
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ProfileError(f"config.{key}: expected an integer >= {low}, got {value!r}")
    if high is not None and value > high:
        raise ProfileError(f"config.{key}: at most {high:,} (memplan's ceiling, NOTE [ A ceiling on "
                           f"decoder layers ] in profiler/hf_config.py), got {value:,}; give a smaller model")
    return value


def _layers(cfg: dict, key: str) -> int:
    """The config's decoder layer count `key`, at most MAX_LAYERS."""
    return _int(cfg, key, high=MAX_LAYERS)


def _bool(cfg: dict, key: str, default: bool) -> bool:
    """The boolean `key` of the config (`default` when absent). JSON true or false only, as
    transformers' own configs check: a string such as "false" is not read as true."""
    if key not in cfg:
        return default
    value = cfg[key]
    if not isinstance(value, bool):
        raise ProfileError(f"config.{key}: expected true or false (a JSON boolean), got {value!r}")
    return value


def _top_k(cfg: dict, experts: int, experts_key: str) -> int:
    """num_experts_per_tok: at least 1 and at most the `experts` of `experts_key`."""
    k = _int(cfg, "num_experts_per_tok")
    if k > experts:
        raise ProfileError(f"config.num_experts_per_tok: {k} experts per token is more than the "
                           f"{experts} experts of config.{experts_key}; choose at most {experts}")
    return k


def decoder_shape(config: str | Path | dict) -> DecoderShape:
    """The `DecoderShape` of a Hugging Face config (a path to config.json, its JSON text or a dict).

    Returns the shape; raises `ProfileError` naming the field for a model_type memplan does not
    know or a missing or malformed field. Defaults are transformers' own where the config may omit
    a field (e.g. num_key_value_heads = num_attention_heads)."""
    cfg = _load(config)
    if "model_type" not in cfg or cfg["model_type"] in (None, ""):
        # a config without it is not a Hugging Face config.json memplan can read (none of the
        # other keys is looked at, so a misspelt config is never priced as some default model)
        raise ProfileError(f"config.model_type: missing; a Hugging Face config.json names its "
                           f"model_type, one of {', '.join(FAMILIES)}")
    mt = cfg["model_type"]
    if not isinstance(mt, str) or mt not in FAMILIES:
        raise ProfileError(f"config.model_type: {mt!r} is not a decoder memplan knows; choose a config "
                           f"of {', '.join(FAMILIES)}")
    fam = FAMILIES[mt]
    if fam == "gpt2":
        C = _int(cfg, "n_embd")
        H = _int(cfg, "n_head")
        if C % H:
            raise ProfileError(f"config.n_head: n_embd ({C}) must be divisible by n_head ({H})")
        # n_inner: null or absent means 4 x n_embd, as transformers' GPT2MLP reads it
        inner = 4 * C if cfg.get("n_inner") is None else _int(cfg, "n_inner")
        return DecoderShape(
            model_type=mt, family=fam, vocab_size=_int(cfg, "vocab_size"), hidden_size=C,
            n_layer=_layers(cfg, "n_layer"), n_head=H, n_kv_head=H, head_dim=C // H,
            intermediate_size=inner, tie_embeddings=_bool(cfg, "tie_word_embeddings", True),
            qkv_bias=True, o_bias=True, mlp_bias=True, norm="layer",
            max_positions=_int(cfg, "n_positions", default=1024))
    C = _int(cfg, "hidden_size")
    H = _int(cfg, "num_attention_heads")
    L = _layers(cfg, "num_hidden_layers")
    KV = _int(cfg, "num_key_value_heads", default=H)
    if H % KV:
        raise ProfileError(f"config.num_key_value_heads: {KV} must divide num_attention_heads ({H})")
    hd = cfg.get("head_dim")
    if hd is None:
        if C % H:
            raise ProfileError(f"config.num_attention_heads: hidden_size ({C}) must be divisible by "
                               f"num_attention_heads ({H}), or set head_dim")
        hd = C // H
    hd = _int({"head_dim": hd}, "head_dim")
    V = _int(cfg, "vocab_size")
    window = cfg.get("sliding_window") if _bool(cfg, "use_sliding_window", True) else None
    common = dict(model_type=mt, family=fam, vocab_size=V, hidden_size=C, n_layer=L, n_head=H,
                  n_kv_head=KV, head_dim=hd, rope_theta=cfg.get("rope_theta"),
                  sliding_window=window if isinstance(window, int) else None)
    if fam == "gpt_neox":
        if C % H:
            raise ProfileError(f"config.num_attention_heads: hidden_size ({C}) must be divisible by "
                               f"num_attention_heads ({H})")
        return DecoderShape(**{**common, "n_kv_head": H, "head_dim": C // H},
                            intermediate_size=_int(cfg, "intermediate_size"),
                            tie_embeddings=_bool(cfg, "tie_word_embeddings", False),
                            qkv_bias=_bool(cfg, "attention_bias", True),
                            o_bias=_bool(cfg, "attention_bias", True), mlp_bias=True, norm="layer")
    tie_default = mt in ("gemma", "gemma2")
    tie = _bool(cfg, "tie_word_embeddings", tie_default)
    attn_bias = _bool(cfg, "attention_bias", False)
    base = dict(common, tie_embeddings=tie,
                qkv_bias=True if mt in ("qwen2", "qwen2_moe") else attn_bias,
                o_bias=False if mt in ("qwen2", "qwen2_moe") else attn_bias,
                mlp_bias=_bool(cfg, "mlp_bias", False),
                norms_per_layer=4 if mt == "gemma2" else 2, qk_norm=mt == "qwen3")
    if fam == "llama":
        return DecoderShape(**base, intermediate_size=_int(cfg, "intermediate_size"))
    if fam == "mixtral":
        E = _int(cfg, "num_local_experts")
        k = _top_k(cfg, E, "num_local_experts")
        F = _int(cfg, "intermediate_size")
        return DecoderShape(**base, intermediate_size=F, n_experts=E, top_k=k,
                            expert_intermediate_size=F, moe_layers=(True,) * L)
    # qwen2_moe: sparse layers by decoder_sparse_step and mlp_only_layers (transformers' rule)
    E = _int(cfg, "num_experts")
    k = _top_k(cfg, E, "num_experts")
    step = _int(cfg, "decoder_sparse_step", default=1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ProfileError(f"config.mlp_only_layers: expected a list of layer indices, got {only!r}")
    dense_only = set(only)
    moe = tuple((i not in dense_only) and (i + 1) % step == 0 for i in range(L))
    return DecoderShape(**base, intermediate_size=_int(cfg, "intermediate_size"), n_experts=E,
                        top_k=k, expert_intermediate_size=_int(cfg, "moe_intermediate_size"),
                        shared_expert_intermediate_size=_int(cfg, "shared_expert_intermediate_size",
                                                             low=0),
                        moe_layers=moe)


def _norm(shape: DecoderShape, width: int) -> tuple[int, int]:
    """(parameters, tensors) of one norm over `width` channels."""
    return (2 * width, 2) if shape.norm == "layer" else (width, 1)


def _attention(s: DecoderShape) -> tuple[int, int]:
    """(parameters, tensors) of one attention block."""
    C, D, Dkv = s.hidden_size, s.n_head * s.head_dim, s.n_kv_head * s.head_dim
    if s.family == "gpt_neox" or s.family == "gpt2":  # fused qkv C -> 3C, output C -> C
        p = 3 * C * C + C * C + (3 * C if s.qkv_bias else 0) + (C if s.o_bias else 0)
        return p, 2 + (1 if s.qkv_bias else 0) + (1 if s.o_bias else 0)
    p = C * D + 2 * C * Dkv + D * C
    t = 4
    if s.qkv_bias:
        p += D + 2 * Dkv
        t += 3
    if s.o_bias:
        p += C
        t += 1
    if s.qk_norm:
        p += 2 * s.head_dim
        t += 2
    return p, t


def _gated(C: int, F: int, bias: bool) -> tuple[int, int]:
    """(parameters, tensors) of a gated MLP: gate and up C -> F, down F -> C."""
    return 3 * C * F + ((2 * F + C) if bias else 0), 3 + (3 if bias else 0)


def _layer(s: DecoderShape, i: int) -> tuple[int, int, int]:
    """(parameters, tensors, parameters a token uses) of decoder layer `i`."""
    C = s.hidden_size
    np_, nt = _norm(s, C)
    p, t = s.norms_per_layer * np_, s.norms_per_layer * nt
    ap, at = _attention(s)
    p, t = p + ap, t + at
    if s.family in ("gpt2", "gpt_neox"):  # plain MLP C -> F -> C with biases
        F = s.intermediate_size
        mp = 2 * C * F + F + C
        return p + mp, t + 4, p + mp
    if not (s.moe_layers and s.moe_layers[i]):
        mp, mt = _gated(C, s.intermediate_size, s.mlp_bias)
        return p + mp, t + mt, p + mp
    E, k, Fe = s.n_experts, s.top_k, s.expert_intermediate_size
    ep, _ = _gated(C, Fe, False)
    router = C * E
    # transformers 5 keeps all experts in two tensors (gate-up E x 2F x C, down E x C x F)
    total, active, tensors = p + router + E * ep, p + router + k * ep, t + 1 + 2
    if s.family == "qwen2_moe":  # transformers builds the shared expert and its gate (C x 1)
        # even at shared_expert_intermediate_size 0 (three empty tensors and the gate)
        sp, st = _gated(C, s.shared_expert_intermediate_size, False)
        total, active, tensors = total + sp + C, active + sp + C, tensors + st + 1
    return total, tensors, active


def param_counts(shape: DecoderShape | str | Path | dict) -> ParamCounts:
    """Parameters per stage of the decoder `shape` (a DecoderShape or a config as for
    `decoder_shape`): returns a `ParamCounts` (elements, not bytes)."""
    s = shape if isinstance(shape, DecoderShape) else decoder_shape(shape)
    C, V = s.hidden_size, s.vocab_size
    embed, et = V * C, 1
    if s.family == "gpt2":
        embed, et = embed + s.max_positions * C, 2
    layers = [_layer(s, i) for i in range(s.n_layer)]
    np_, nt = _norm(s, C)
    head, ht = np_ + (0 if s.tie_embeddings else V * C), nt + (0 if s.tie_embeddings else 1)
    return ParamCounts(embed=embed, layers=tuple(p for p, _, _ in layers), head=head,
                       tensors=et + sum(t for _, t, _ in layers) + ht,
                       active=embed + sum(a for _, _, a in layers) + head)


def n_params(config: DecoderShape | str | Path | dict) -> int:
    """All parameters (elements) of the decoder a Hugging Face config describes."""
    return param_counts(config).total


# ---------------------------------------------------------------------------------------------
# analytic profiles of Llama-style decoders and Mixtral

# NOTE [ What autograd keeps in a Hugging Face decoder layer ]
# Per stage of `memplan.profiler.cut.cut_decoder`, tensor by tensor, as transformers 5.x's
# modules save them on the CPU (N = B T tokens, C width, H and KV heads of width hd, D = H hd,
# Dkv = KV hd, F the MLP width, V the vocabulary; p the parameters' element size and the residual
# stream's, c the compute element size: fp32 p = c = 4; bf16-mixed p = 4, c = 2 under autocast;
# bf16 p = c = 2):
#   RMSNorm        its fp32 input (pow's; the stage input for the first norm, the residual after
#                  attention for the second: counted once, p = 4), rsqrt 4N, the normalised
#                  x p NC (weight's mul); the output p NC (the projections' input, one storage).
#                  bf16 params: the fp32 upcast 4NC is a fresh tensor. Under autocast the output
#                  is not kept: each projection keeps its own 16-bit copy (3 c NC for q, k, v;
#                  2 c NC for gate, up) and its weight's (c C D ...).
#   rotary         cos and sin, p T hd each (made by the embedding stage, kept by each layer)
#   attention      eager: q, the repeated k and v, c N D each; softmax's fp32 output 4 B H T^2
#                  and (c = 2) its 16-bit copy c B H T^2; o_proj's input c N D.
#                  sdpa (PyTorch's flash kernel): q c N D, k and v c N Dkv each (grouped-query:
#                  not repeated), logsumexp 4 B H T, the output c N D (o_proj's input, a view)
#   SwiGLU MLP     gate's output, silu's output, up's output, their product: 4 c N F
#   MoE (Mixtral)  router softmax 4 N E, top-k indices 8 N k and values 4 N k, their sum 4 N,
#                  token and expert indices 16 A (A = N k assignments), expert counts 4 E;
#                  gathered tokens m A C, fused gate-up output 2 m A F, silu's output and the
#                  product m A F each, routing weights 4 A, expert outputs m A C, scatter index
#                  8 A (m = p: the experts' grouped matmuls run outside autocast on the CPU)
#   embedding      the backbone's final norm applied to its output and discarded: rsqrt 4N and
#                  the normalised x p NC (p = 2: plus the fp32 upcast 4NC)
#   head           the final norm as above (the output kept by lm_head; autocast: its 16-bit
#                  copy and the head weight's c V C), log-softmax's fp32 output 4 N V, the shifted
#                  labels 8 N and the loss's weight 4
# Checked equal to profile_chain on the real transformers layers for Llama, Qwen2 and Mixtral, the
# head with either loss (tests/profiler/test_hf_config.py). Transient bytes are estimates (no
# allocation trace of these layers yet): forward p NC plus the larger of the MLP's 2 c N F and
# eager's 4 B H T^2 scores; backward twice the layer's largest intermediates.
#
# The lean head (`lean_loss=True`: memplan.lean_loss, NOTE [ the lean cross-entropy ] in
# profiler/lean_cross_entropy.py) saves, in place of the log-softmax and the shifted labels: the
# logits themselves c N V (the head made them: fp32, or autocast's and bf16's 16-bit), the targets
# with ignored ones zeroed 8 N, their mask N (bools), the log-sum-exps 4 N and the divisor 4.
# Transients of the head (estimates, the largest tensors; within 0.5% of the measured for fp32 and
# 16-bit logits at N V = 2 M, tiny Llama, CPU): Hugging Face's loss, forward the logits c N V and
# (16-bit) their fp32 copy 4 N V, backward the log-softmax's gradient and the logits' (fp32) 8 N V;
# the lean loss, forward one chunk's fp32 temporaries (rows_per_chunk rows x V x 4; two with 16-bit
# logits: the upcast chunk beside its exponentials), backward the logits' gradient c N V beside
# the same chunks; with `reuse_logits` that gradient is written over the logits, and the backward
# holds the chunks alone (measured 0.3% under for fp32 logits, 0.7-1.5% under for 16-bit).

CHUNK_BYTES = 8 << 20  # the lean loss's chunk: fp32 bytes of its temporaries (rows x V x 4), at most
CHUNKS_AT_LEAST = 8  # chunks at least: a chunk is at most 1/8 of the rows, small beside N x V


def rows_per_chunk(n: int, vocab: int) -> int:
    """Rows of one chunk of the lean loss over n rows of `vocab` logits: at most CHUNK_BYTES of
    fp32 and 1/CHUNKS_AT_LEAST of the rows."""
    return max(1, min(CHUNK_BYTES // (4 * max(1, vocab)), -(-n // CHUNKS_AT_LEAST)))


# the refusal of reuse_logits without lean_loss, one wording at every boundary that takes both
# (profiles, capacity, runs, the service's run config), each raising its own error type
REUSE_LOGITS_NEEDS_LEAN = ("reuse_logits: it is an option of the lean loss; set lean_loss too, or drop "
                           "reuse_logits")


def _check_loss(lean_loss: object, reuse_logits: object, *, tp: int) -> None:
    """Refuse, in one line naming the field, a loss option the profile cannot price."""
    if not isinstance(lean_loss, bool):
        raise ProfileError(f"lean_loss: expected true or false, got {lean_loss!r}")
    if not isinstance(reuse_logits, bool):
        raise ProfileError(f"reuse_logits: expected true or false, got {reuse_logits!r}")
    if reuse_logits and not lean_loss:
        raise ProfileError(REUSE_LOGITS_NEEDS_LEAN)
    if lean_loss and tp > 1:
        raise ProfileError("lean_loss: the lean loss is not vocabulary-parallel; with tp > 1 the "
                           "head's loss is Megatron's vocab-parallel cross-entropy (drop lean_loss)")


def loss_meta(lean_loss: bool, reuse_logits: bool) -> dict:
    """The profile's meta on its head's loss: "loss" ("lean" or "hf") and, for the lean loss,
    whether its backward reuses the logits."""
    if not lean_loss:
        return {"loss": "hf"}
    return {"loss": "lean", "reuse_logits": reuse_logits}


# NOTE [ Tensor, sequence and context parallel bytes per rank ]
# One rank of a Megatron-style split (Shoeybi et al. 2019; Korthikanti et al. 2022, "Reducing
# activation recomputation in large transformer models", section 4 and table 2) of the layer above,
# over t tensor-parallel ranks (heads and the MLP's F columns split; H, KV and F divisible by t),
# with SP (sequence parallelism) or not, and c context-parallel ranks (each sequence's T tokens
# split; T divisible by c). Per rank N = B T / c tokens; the norms and the residual stream hold
# Ns = N / t of them under SP, N without.
#   1. Split by t: q, k, v, the attention output, the logsumexp or the softmax (H / t heads), the
#      MLP's four F-wide tensors (F / t), autocast's copies of the q, k, v, o, gate, up, down
#      weights (their shards).
#   2. Whole on every tensor-parallel rank without SP, split by t with it: the first norm's rsqrt
#      and normalised x, the residual after attention and the second norm's, the layer's output
#      (the stage's output), bf16's fp32 upcasts.
#   3. Whole on every rank in both: the projections' input, p N C (autocast: each projection's
#      16-bit copy). Under SP it is the all-gathered norm output that torch's tensor-parallel API
#      keeps; Megatron-LM instead keeps the rank's shard and gathers it again in the backward
#      (Korthikanti et al. 2022, section 4.2.2: 34 / t in their table), which memplan does not
#      assume. The rotary cos and sin (p T hd each) are whole as well.
#   4. Context parallelism: every term above on T / c tokens, except keys and values: each rank
#      keeps the whole sequence's K and V (all-gathered, 2 c B T Dkv / t; Llama 3's all-gather
#      context parallelism, Dubey et al. 2024, section 3.3.2) and eager's scores are T / c x T.
# With t = 2 and SP on and off, eager and sdpa, fp32, bf16 and bf16-mixed, each rank's saved and
# output bytes per layer are checked equal to those measured on 2 gloo processes running torch's
# ColwiseParallel / RowwiseParallel / SequenceParallel (executor/tensor_parallel.py,
# tests/executor/test_tensor_parallel.py). Context parallelism is derived, not measured.
# The embedding is vocabulary-parallel (V / t rows, its output all-reduced, or reduce-scattered
# under SP); the head is column-parallel over the vocabulary (a rank keeps its V / t logits' fp32
# log-softmax, Megatron's vocab-parallel cross-entropy); both derived, not measured.

_POLICY_BYTES = {"fp32": (4, 4), "bf16-mixed": (4, 2), "fp16-mixed": (4, 2), "bf16": (2, 2)}


def _layer_saved(s: DecoderShape, i: int, B: int, T: int, p: int, c: int, attention: str, *,
                 tp: int = 1, sp: bool = False, cp: int = 1) -> int:
    """Bytes decoder layer `i` keeps for the backward on one rank (NOTE [ What autograd keeps in a
    Hugging Face decoder layer ]), split over `tp` tensor-parallel ranks (with `sp`: the norms and
    the residual stream too) and `cp` context-parallel ranks (NOTE [ Tensor, sequence and context
    parallel bytes per rank ]); tp = cp = 1 is the whole layer."""
    C, H, hd = s.hidden_size, s.n_head, s.head_dim
    D, Dkv = H * hd // tp, s.n_kv_head * hd // tp  # this rank's heads' widths
    Tl = T // cp  # this rank's tokens of each sequence
    N = B * Tl  # tokens the attention and the MLP see on this rank
    Ns = N // tp if sp else N  # tokens the norms and the residual stream hold on this rank
    mixed = p != c
    upcast = 4 * Ns * C if p == 2 else 0
    # first norm (its fp32 input is the stage input unless upcast); the projections' input: the
    # norm's output (all-gathered under SP), or under autocast each projection's 16-bit copy of it
    saved = upcast + 4 * Ns + p * Ns * C
    if mixed:
        saved += 3 * c * N * C + c * (C * D + 2 * C * Dkv)
    else:
        saved += p * N * C
    saved += 2 * p * Tl * hd  # cos, sin
    Hl = H // tp
    Tk = T if cp > 1 else Tl  # keys each query sees: the whole sequence, all-gathered under CP
    if attention == "eager":
        saved += c * N * D + 2 * c * B * Tk * D + 4 * B * Hl * Tl * Tk + (c * B * Hl * Tl * Tk if c != 4 else 0)
        saved += c * N * D
    else:
        saved += c * N * D + 2 * c * B * Tk * Dkv + 4 * B * Hl * Tl + c * N * D
    saved += c * D * C if mixed else 0  # o_proj's weight copy
    # second norm: the residual after attention (fp32: itself; bf16 params: its upcast)
    saved += 4 * Ns * C + 4 * Ns + p * Ns * C
    moe = bool(s.moe_layers and s.moe_layers[i])
    if not moe:
        F = s.intermediate_size // tp
        saved += (2 * c * N * C + c * 3 * C * F) if mixed else p * N * C
        return saved + 4 * c * N * F
    if tp > 1 or sp or cp > 1:
        raise ProfileError("tp: tensor, sequence and context parallel bytes are derived for dense "
                           "layers; MoE layers split their experts (expert parallelism), not built")
    if s.shared_expert_intermediate_size:
        raise ProfileError("config.model_type: qwen2_moe's analytic profile is not derived yet "
                           "(parameter counts are); measure it (memplan profile --hf-config without "
                           "--analytic)")
    E, k, F = s.n_experts, s.top_k, s.expert_intermediate_size
    N = B * T
    A, m = N * k, p
    saved += (c * N * C + c * C * E) if mixed else p * N * C  # the router's input (and weight)
    saved += 4 * N * E + 8 * N * k + 4 * N + 4 * N * k + 16 * A + 4 * E
    saved += m * A * C + 2 * m * A * F + 2 * m * A * F + 4 * A + m * A * C + 8 * A
    return saved


# NOTE [ Save policies of a Llama-style layer from shapes ]
# As NOTE [ Save policies of a GPT block from shapes ] in profiler/analytic.py (the selective
# checkpoint caches every output it does not recompute, plus checkpoint's CPU random state R),
# per dense Llama (or Mistral, without its sliding window) layer in fp32 (p = c = 4), SDPA's flash
# kernel (no dropout, no padding mask), N = B T:
#   none          R
#   matmuls       q, k, v, o, gate, up, down projections c (ND + 2 N Dkv + NC + 2 NF + NC) and the
#                 kernel's output and logsumexp c ND + 4 BHT, + R
#   no_attention  everything but the kernel and the adds (the layer's output is the second
#                 residual sum, so the adds' packet is recomputed in every candidate: NOTE
#                 [ candidate save policies ] rule 5 in profiler/policies.py): per RMSNorm pow's
#                 output, the normalised x and the weight's product 3 c NC and the mean and rsqrt
#                 8 N (two norms); the projections as above without the kernel; rotary on q and k
#                 (x cos, the negated half, the concatenation, x sin: 3.5 c ND and 3.5 c N Dkv);
#                 silu's output and the product 2 c NF, + R
#   = c (8 NC + 4.5 ND + 5.5 N Dkv + 4 NF) + 16 N + R
# Korthikanti et al. 2022 (Table 2): selective recompute drops the T^2 term, which the flash kernel
# never keeps, so `no_attention` frees nothing against 'all' here. Checked equal to the
# profiler's measurement on a tiny Llama (tests/profiler/test_policies.py).


def llama_layer_policy_bytes(shape: DecoderShape, *, seq_len: int, batch_size: int = 1,
                             device: str = "cpu") -> dict[str, int]:
    """Saved bytes of one dense Llama-style decoder layer (fp32, SDPA's flash kernel, no
    dropout) under the save policies 'none', 'matmuls' and 'no_attention' (NOTE [ Save policies
    of a Llama-style layer from shapes ]), by name, in bytes. Raises ProfileError for other
    families, experts or norms."""
    if shape.model_type not in ("llama", "mistral") or any(shape.moe_layers) or shape.qkv_bias \
            or shape.o_bias or shape.mlp_bias:
        raise ProfileError(f"config.model_type: save policies are derived for dense Llama and "
                           f"Mistral layers without biases only, not {shape.model_type}; measure "
                           "them (profile_chain(policies=True))")
    B, T = batch_size, seq_len
    N, C, H, hd = B * T, shape.hidden_size, shape.n_head, shape.head_dim
    D, Dkv, F = H * hd, shape.n_kv_head * hd, shape.intermediate_size
    c = 4
    rng = 5056 if device.startswith("cpu") else 0
    projections = c * (N * D + 2 * N * Dkv + N * C + 2 * N * F + N * C)
    return {
        "none": rng,
        "matmuls": projections + c * N * D + 4 * B * H * T + rng,
        "no_attention": c * (16 * N * C + 9 * N * D + 11 * N * Dkv + 8 * N * F) // 2 + 16 * N + rng,
    }


def _layer_flops(s: DecoderShape, i: int, B: int, T: int) -> int:
    """Forward FLOPs of decoder layer `i` on B x T tokens (matrix products, attention in full)."""
    N, C, H, hd = B * T, s.hidden_size, s.n_head, s.head_dim
    D, Dkv = H * hd, s.n_kv_head * hd
    flops = 2 * N * (2 * C * D + 2 * C * Dkv) + 2 * 2 * B * H * T * T * hd
    if s.moe_layers and s.moe_layers[i]:
        return flops + 2 * N * C * s.n_experts + 2 * N * s.top_k * 3 * C * s.expert_intermediate_size
    return flops + 2 * N * 3 * C * s.intermediate_size


def hf_analytic_profile(
    config: DecoderShape | str | Path | dict,
    *,
    seq_len: int,
    batch_size: int = 1,
    precision: str = "fp32",
    attention: str = "sdpa",
    optimizer: str = "adamw",
    flops_per_s: float = 1e12,
    device: str = "cpu",
    name: str | None = None,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    lean_loss: bool = False,
    reuse_logits: bool = False,
):
    """The profile of a Hugging Face decoder cut by `cut_decoder` (embedding, each decoder layer,
    final norm + head + loss) from its config alone, at `batch_size` sequences of `seq_len` tokens.

    Returns a `Profile`: per stage output and saved bytes as NOTE [ What autograd keeps in a
    Hugging Face decoder layer ] derives them (exact on the CPU for Llama-style layers and
    Mixtral, eager or sdpa attention), forward FLOPs (matrix products, attention in full), times
    from FLOPs at `flops_per_s` (backward twice the forward), transient bytes as stated estimates;
    `input_bytes` the batch's input_ids and labels (int64); `fixed_bytes` the model states
    `precision` keeps (weights, gradients, optimizer state; memplan.planner.precision) plus AdamW's
    per-tensor step counters on the CPU.

    With `tp` > 1, `sp` or `cp` > 1 the profile is one rank's of a tensor-, sequence- and
    context-parallel split (NOTE [ Tensor, sequence and context parallel bytes per rank ]): its
    bytes, FLOPs and parameters are that rank's. `lean_loss`: the head computes the loss with
    memplan.lean_loss (the logits and per-token log-sum-exps saved, no log-softmax; not with
    `tp` > 1, where the loss is vocabulary-parallel); `reuse_logits` (with `lean_loss`): its backward
    writes the logits' gradient over the logits. Raises `ProfileError` naming the field on bad
    input (tp not dividing the heads or the MLP width, cp not dividing seq_len)."""
    from pydantic import ValidationError

    try:
        return _hf_analytic_profile(config, seq_len=seq_len, batch_size=batch_size,
                                    precision=precision, attention=attention, optimizer=optimizer,
                                    flops_per_s=flops_per_s, device=device, name=name, tp=tp, sp=sp,
                                    cp=cp, lean_loss=lean_loss, reuse_logits=reuse_logits)
    except ValidationError as err:  # a size beyond the profile's ceilings (NOTE [ ceilings ])
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        # the model alone is to blame when one token of one sequence is over the ceilings too
        try:
            _hf_analytic_profile(config, seq_len=cp * (tp if sp else 1), batch_size=1,
                                 precision=precision, attention=attention, optimizer=optimizer,
                                 flops_per_s=flops_per_s, device=device, name=name, tp=tp, sp=sp, cp=cp,
                                 lean_loss=lean_loss, reuse_logits=reuse_logits)
            field, fix = "seq_len, batch_size", "a smaller batch or sequence"
        except (ValidationError, ProfileError):
            field, fix = "config", "a smaller model (hidden_size, intermediate_size, layers, vocabulary)"
        raise ProfileError(
            f"{field}: the profile's {where} exceeds memplan's ceilings ({first['msg']}; "
            f"NOTE [ ceilings ] in profiler/schema.py); give {fix}") from None



def _check_sizes(seq_len, batch_size) -> None:
    for field_, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProfileError(f"{field_}: expected an integer >= 1, got {value!r}")


def check_split(s: DecoderShape, seq_len: int, *, tp: int = 1, sp: bool = False, cp: int = 1) -> None:
    """Raise `ProfileError` naming the field unless decoder `s` splits over `tp` tensor-parallel
    ranks (dividing the query and key/value heads and the MLP width; dense layers) and each
    `seq_len`-token sequence over `cp` context-parallel ranks (times `tp` under `sp`)."""
    for field_, v in (("tp", tp), ("cp", cp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ProfileError(f"{field_}: expected an integer >= 1, got {v!r}")
    if tp > 1 or sp or cp > 1:
        if any(s.moe_layers):
            raise ProfileError("tp: tensor, sequence and context parallelism are derived for dense "
                               "layers; MoE layers split their experts (expert parallelism), not built")
    for what, size in (("num_attention_heads", s.n_head), ("num_key_value_heads", s.n_kv_head),
                       ("intermediate_size", s.intermediate_size)):
        if size % tp:
            raise ProfileError(f"tp: {tp} tensor-parallel ranks must divide config.{what} ({size}); "
                               f"choose a divisor of it")
    if seq_len % cp:
        raise ProfileError(f"seq_len: {seq_len} tokens do not split over cp = {cp} context-parallel "
                           "ranks; choose a multiple of cp")
    if sp and (seq_len // cp) % tp:
        raise ProfileError(f"seq_len: sequence parallelism splits each rank's {seq_len // cp} tokens "
                           f"over tp = {tp}; choose a multiple of cp x tp ({cp * tp})")


def _rank_params(s: DecoderShape, counts: ParamCounts, tp: int) -> tuple[int, list[int], int]:
    """Parameters (elements) one tensor-parallel rank holds: (embedding, each layer, head). The
    vocabulary-parallel embedding and head and the split projections are 1 / t (rounded up); the
    norms and the row-parallel layers' biases are whole on every rank."""
    if tp == 1:
        return counts.embed, list(counts.layers), counts.head
    C = s.hidden_size
    np_, _ = _norm(s, C)
    whole = s.norms_per_layer * np_ + (C if s.o_bias else 0) + (C if s.mlp_bias else 0)
    whole += 2 * s.head_dim if s.qk_norm else 0
    layers = [-(-(n - whole) // tp) + whole for n in counts.layers]
    head_w = counts.head - np_
    return -(-counts.embed // tp), layers, np_ + -(-head_w // tp)


def _hf_analytic_profile(config, *, seq_len, batch_size, precision, attention, optimizer, flops_per_s,
                         device, name, tp=1, sp=False, cp=1, lean_loss=False, reuse_logits=False):
    s = config if isinstance(config, DecoderShape) else decoder_shape(config)
    if s.family == "gpt2":
        raise ProfileError(f"config.model_type: the analytic profile covers Llama-style decoders and "
                           f"Mixtral, not {s.model_type} (parameter counts are); measure it "
                           "(memplan profile --hf-config without --analytic)")
    if s.family == "gpt_neox":  # nor does the decoder cut of `memplan profile --hf-config`
        raise ProfileError("config.model_type: the analytic profile covers Llama-style decoders and "
                           "Mixtral, not gpt_neox (parameter counts are), and memplan profile "
                           "--hf-config does not cut it; profile the model itself in Python "
                           "(memplan.profile_model or memplan.auto_checkpoint)")
    _check_sizes(seq_len, batch_size)
    if precision not in _POLICY_BYTES:
        raise ProfileError(f"precision: choose one of {', '.join(_POLICY_BYTES)}, not {precision!r}")
    if attention not in ("sdpa", "eager", "flash"):
        raise ProfileError(f"attention: choose sdpa (flash kernel) or eager, not {attention!r}")
    attention = "sdpa" if attention == "flash" else attention
    check_optimizer(optimizer)
    check_flops_per_s(flops_per_s)
    check_split(s, seq_len, tp=tp, sp=sp, cp=cp)
    _check_loss(lean_loss, reuse_logits, tp=tp)
    from memplan.profiler.precision import policy_dtypes, precision_meta
    from memplan.profiler.schema import LayerProfile, Profile

    p, c = _POLICY_BYTES[precision]
    param_dtype, compute_dtype = policy_dtypes(precision)
    B, T = batch_size, seq_len
    C, V, H = s.hidden_size, s.vocab_size, s.n_head
    N = B * T // cp  # this rank's tokens (NOTE [ Tensor, sequence and context parallel bytes per rank ])
    Ns = N // tp if sp else N  # of them, those the norms and the residual stream hold
    counts = param_counts(s)
    r_embed, r_layers, r_head = _rank_params(s, counts, tp)
    hidden = p * Ns * C

    def stage(name_, kind, flops, out, saved, tf, tb, n):
        f = flops / flops_per_s
        return LayerProfile(name=name_, kind=kind, forward_s=f, backward_s=2 * f, output_bytes=out,
                            saved_bytes=saved, forward_temp_bytes=tf, backward_temp_bytes=tb,
                            param_bytes=p * n, flops=float(flops),
                            output_dtype=param_dtype if kind != "head" else None)

    embed_saved = (4 * Ns * C if p == 2 else 0) + 4 * Ns + p * Ns * C
    layers = [stage("embed", "embed", 0, hidden, embed_saved, hidden + 4 * Ns * C, p * V * C // tp, r_embed)]
    Tl, Tk = T // cp, (T if cp > 1 else T // cp)
    for i in range(s.n_layer):
        F = (s.top_k * s.expert_intermediate_size if s.moe_layers and s.moe_layers[i]
             else s.intermediate_size) // tp
        scores = 4 * B * (H // tp) * Tl * Tk if attention == "eager" else 0
        tf = hidden + max(2 * c * N * F, scores)
        tb = 2 * (hidden + max(2 * c * N * F, 2 * scores))
        layers.append(stage(f"block.{i}", "block", _layer_flops(s, i, B, T) // (tp * cp), hidden,
                            _layer_saved(s, i, B, T, p, c, attention, tp=tp, sp=sp, cp=cp), tf, tb,
                            r_layers[i]))
    mixed = p != c
    Vl = -(-V // tp)  # the head's vocabulary shard (rounded up)
    head_saved = (4 * Ns * C if p == 2 else 0) + 4 * Ns + p * Ns * C
    head_saved += (c * N * C + c * Vl * C) if mixed else p * N * C
    logits, up = c * N * Vl, (4 * N * Vl if c != 4 else 0)  # the logits; their fp32 copy (16-bit)
    if lean_loss:  # the logits, the zeroed targets, their mask, the log-sum-exps, the divisor
        chunks = (1 if c == 4 else 2) * 4 * rows_per_chunk(N, Vl) * Vl
        head_saved += logits + 8 * N + N + 4 * N + 4
        # the logits' gradient: over the logits themselves when reused (rule 4 of the NOTE)
        head_tf, head_tb = chunks, (0 if reuse_logits else logits) + chunks
    else:  # log-softmax's fp32 output, the shifted labels, the loss's weight
        head_saved += 4 * N * Vl + 8 * N + 4
        head_tf, head_tb = logits + up, 8 * N * Vl
    layers.append(stage("head", "head", 2 * N * C * Vl, 4, head_saved, head_tf, head_tb, r_head))
    from memplan.planner.precision import with_optimizer

    pol = with_optimizer(precision, optimizer)
    n = r_embed + sum(r_layers) + r_head  # this rank's parameters (all of them when tp = 1)
    opt = n * pol.optimizer_bytes
    if optimizer in ("adamw", "adam") and device.startswith("cpu"):
        opt += 4 * counts.tensors  # AdamW's step counters: a 4-byte CPU tensor per parameter
    # NOTE [ Parameters shared between stages ] (profiler/measure.py, profiler/fixed.py): a tied
    # embedding is used by the first stage and the head, so autograd holds the head's gradient of
    # it (this rank's V / t rows, in the gradient's dtype) until the embedding's backward adds its
    # own: through the whole backward, whatever the plan. The measured profile counts it as
    # `pending_shared_grad_bytes` in its fixed bytes, and so does gpt_analytic_profile; so here.
    # It is autograd's buffer of the whole (tensor-parallel shard of the) weight, made before any
    # gradient hook reduce-scatters, so ZeRO does not shard it: planner.sharding.shard_profile
    # keeps it on every GPU as it does for measured profiles (the fixed bytes other than states).
    pending = Vl * C * pol.grad_bytes if s.tie_embeddings else 0
    fixed = {"param_bytes": n * pol.weight_bytes, "grad_bytes": n * pol.grad_bytes,
             "optimizer_bytes": opt, "buffer_bytes": 0, "pending_shared_grad_bytes": pending,
             "n_params": n, "n_params_model": counts.total,
             "n_active_params": counts.active, "n_tensors": counts.tensors}
    fixed["total_bytes"] = fixed["param_bytes"] + fixed["grad_bytes"] + opt + pending
    return Profile(
        name=name or f"{s.model_type}-{s.n_layer}x{C}", device=device, dtype=compute_dtype,
        input_bytes=16 * N, fixed_bytes=fixed["total_bytes"], layers=layers,
        meta={"source": "memplan.profiler.hf_config.hf_analytic_profile",
              "config": {"family": "hf", **s.as_dict(), "seq_len": T, "batch_size": B},
              **({"parallel": {"tp": tp, "sp": sp, "cp": cp, "per_rank": True}}
                 if tp > 1 or sp or cp > 1 else {}),
              "flops_per_s": flops_per_s, "optimizer": optimizer, "attention_backend": attention,
              **loss_meta(lean_loss, reuse_logits),
              "precision": precision_meta(precision, optimizer, param_dtype, compute_dtype),
              "autocast_dtype": compute_dtype if mixed else None, "fixed": fixed,
              "transients": "estimate (largest intermediates; no allocation trace of these layers)",
              "exact": _exact_fields(s, T)},
    )


def _exact_fields(s: DecoderShape, seq_len: int) -> list[str]:
    """The fields of the analytic profile that equal a measured profile of the same model on the
    CPU. Saved bytes are derived for the Llama layer (Mixtral's experts beside): Gemma2's extra
    norms, Qwen3's q/k norms and a sliding window shorter than the sequence save tensors the
    derivation leaves out (measured: 9-14% more per Qwen3 layer, 20% per Gemma2 layer, and a
    Mistral window's share growing with the sequence), so there they are an estimate. Input
    bytes count labels apart from the input ids (16 bytes a token); a batch whose labels are
    the ids themselves holds 8."""
    exact = ["output_bytes", "param_bytes"]
    if s.model_type not in ("qwen3", "gemma2") and not (s.sliding_window and seq_len > s.sliding_window):
        exact.append("saved_bytes")
    return exact


def hf_model(config: DecoderShape | str | Path | dict, *, attention: str = "sdpa", seed: int = 0):
    """A transformers causal LM built from `config` (a path, JSON text or dict; random weights,
    nothing downloaded), fp32, with `attention` ("sdpa" or "eager"). Needs transformers."""
    try:
        import torch
        import transformers
    except ImportError:  # pragma: no cover - the dev extra installs it
        raise ProfileError("config: building the model needs transformers (pip install "
                           "'transformers>=4.57,<6'); or use the analytic profile (--analytic)") from None
    cfg = _load(config) if not isinstance(config, DecoderShape) else None
    if cfg is None:
        raise ProfileError("config: give the config itself (a path, JSON text or dict), not a shape")
    decoder_shape(cfg)  # known model_type, fields present
    fields = {k: v for k, v in cfg.items() if not k.startswith("_") and k not in ("architectures", "torch_dtype")}
    hf_cfg = transformers.AutoConfig.for_model(**fields)
    hf_cfg._attn_implementation = "sdpa" if attention == "flash" else attention
    torch.manual_seed(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    except ValueError as err:  # e.g. Gemma2 with sdpa: transformers builds it with eager only
        if "attention implementation" not in str(err):
            raise
        raise ProfileError(f"attention: transformers {transformers.__version__} does not run "
                           f"{cfg.get('model_type')} with {hf_cfg._attn_implementation} attention; use "
                           "eager") from None
    model.config._attn_implementation = hf_cfg._attn_implementation
    return model


def measure_hf_config(
    config: str | Path | dict, *, seq_len: int, batch_size: int = 1, precision: str = "fp32",
    attention: str = "sdpa", device: str = "cpu", optimizer: str = "adamw", repeats: int = 3,
    warmup: int = 1, name: str | None = None, seed: int = 0, policies: bool | list[str] = False,
    progress=None, lean_loss: bool = False, reuse_logits: bool = False,
):
    """The measured profile (`memplan.profiler.measure.profile_chain`) of the model `config`
    describes, built with random weights and cut by `cut_decoder`, on a random batch of
    `batch_size` x `seq_len` tokens under `precision` (bf16: bf16 parameters; mixed: autocast).

    Returns a `Profile` whose stages are the cut's (embedding, each layer, head). profile_chain
    passes one tensor between stages and a decoder cut a pair (hidden states, the per-layer
    arguments the embedding made), so each stage is wrapped: the embedding keeps the arguments it
    made, the later stages read them; what each stage outputs and saves is unchanged. `policies`
    measures save policies per stage as profile_chain does; `progress(done, total, what)` as
    there, called after each stage is measured. `lean_loss`: the model computes its loss with
    memplan.lean_loss (profiler/lean_cross_entropy.py), as `memplan.lean_loss(model)` installs it;
    `reuse_logits` (with `lean_loss`): its backward writes the logits' gradient over the logits,
    as `memplan.lean_loss(model, reuse_logits=True)` installs it."""
    import torch
    import torch.nn as nn
    from memplan.profiler.cut import cut_decoder
    from memplan.profiler.measure import profile_chain
    from memplan.profiler.precision import policy_dtypes

    _check_sizes(seq_len, batch_size)
    if precision not in _POLICY_BYTES:
        raise ProfileError(f"precision: choose one of {', '.join(_POLICY_BYTES)}, not {precision!r}")
    _check_loss(lean_loss, reuse_logits, tp=1)
    shape = decoder_shape(_load(config))
    if shape.max_positions and seq_len > shape.max_positions:  # gpt2's learned position table
        raise ProfileError(f"seq_len: {seq_len} tokens exceed config.n_positions ({shape.max_positions}), "
                           f"the rows of the model's learned position table; give at most "
                           f"{shape.max_positions}")
    param_dtype, compute_dtype = policy_dtypes(precision)
    log.info("building %s from its config with random weights (%d layers, width %d)",
             shape.model_type, shape.n_layer, shape.hidden_size)
    model = hf_model(config, attention=attention, seed=seed)
    if param_dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.to(device).train()
    if lean_loss:
        from memplan.profiler.lean_cross_entropy import (
            lean_causal_lm_loss,
            lean_causal_lm_loss_reusing_logits,
        )

        model.loss_function = lean_causal_lm_loss_reusing_logits if reuse_logits else lean_causal_lm_loss
    stages = cut_decoder(model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=g).to(device)
    held: dict = {}

    class _Embed(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            hidden, batch = self.inner({"input_ids": x, "labels": ids})
            held["batch"] = batch
            return hidden

    class _Later(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, h):
            out = self.inner((h, held["batch"]))
            return out[0] if isinstance(out, tuple) else out

    wrapped = [_Embed(stages[0]), *(_Later(s) for s in stages[1:])]
    autocast = compute_dtype if compute_dtype != param_dtype else None
    return profile_chain(
        wrapped, ids, device=device, repeats=repeats, warmup=warmup, timing="stage",
        autocast_dtype=autocast, optimizer=optimizer, names=[s.memplan_name for s in stages],
        policies=policies, progress=progress,
        name=name or f"{shape.model_type}-{shape.n_layer}x{shape.hidden_size}",
        meta={"config": {"family": "hf", **shape.as_dict(), "seq_len": seq_len, "batch_size": batch_size},
              "attention_backend": attention, **loss_meta(lean_loss, reuse_logits),
              "hf_input": "input_ids only (labels held by the head)"})
