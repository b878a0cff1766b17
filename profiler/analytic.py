"""Profiles from shapes alone: the GPT family and the ResNet-like chain, for models far larger
than the machine at hand. No torch import: planning and sizing stay instant and run anywhere.

NOTE [ What PyTorch saves in a GPT block ]
The per-stage `saved_bytes` below are not a rule of thumb: they list, tensor by tensor, what
autograd keeps in PyTorch 2.x for the modules of `memplan.profiler.models.gpt`, and the tests check them
byte for byte against `profile_chain` on the CPU. With B batch, T sequence, C width, H heads,
e the element size of the compute dtype (4 fp32, 2 bf16), D = H x head_dim the attention's inner
width and F the feed-forward's hidden width (D = C and F = 4C for GPT-2; smaller once heads or
channels are pruned, executor.features.prune), per block (dropout 0):

    LayerNorm x2        input of ln_2 (the residual stream after attention)    e BTC
                        normalised outputs (inputs of c_attn and c_fc)        2 e BTC
                        mean and rstd, 2 per LayerNorm                        4 s BT
    attention, flash    q, k, v: the c_attn output (one storage)              3 e BTD
                        the output (which is also c_proj's input)               e BTD
                        logsumexp, fp32                                        4 BHT
                        on a GPU, the RNG state (philox seed and offset)          24
    attention, math     q (scaled), k^T, v as fresh copies                    3 m BTD
                        softmax probabilities                                   m BHT^2
                        c_proj's input (the transposed output made contiguous)  e BTD
    MLP                 c_fc output (GELU's input), GELU output (c_proj input) 2 e BTF

where s (the LayerNorm statistics) is e on the CPU and 4 on a GPU, and m (the math path's
precision) is 4 for 16-bit inputs (PyTorch upcasts them; measured on the CPU and, with torch 2.11,
on an H200) and e otherwise. On a GPU the flash kernel also saves its RNG state: 24 bytes. Dense flash
(D = C, F = 4C):
    s_block = 15 e BTC + 4 s BT + 4 BHT,
against Korthikanti et al. 2022 ("Reducing activation recomputation in large transformer
models", eq. 2), per layer s b h (34 + 5 a s / h) bytes for 16-bit Megatron: 34 = 2 x 17 hidden
states of 2 bytes, counting QKV's and the MLP's inputs separately, GELU's input at 4h x 2 bytes,
and 1-byte dropout masks (attention, attention output, MLP output: 3 bytes per element; 5 a s / h
= the attention scores 2 s^2 a, softmax output 2, dropout mask 1). Ours differs because: (1)
with dropout 0 no masks are saved (-3 BTC bytes, and no T^2 mask); (2) flash attention keeps no
T x T tensor at all (the 5 a s / h term vanishes; a 4 BHT logsumexp remains); (3) PyTorch's
Linear saves its input once per storage, so q, k, v share the c_attn output (3 e BTC), whereas
Megatron counts the QKV input (e BTC) and the attention inputs separately; (4) the block's input
is pinned by the chain (a_{i-1}) and its output is a_i, so neither is counted in s_i; (5) the
LayerNorm statistics are small but counted. `korthikanti_block_bytes` gives their number for
comparison.

NOTE [ Autocast's saved tensors ]
Under a mixed policy (bf16-mixed, fp16-mixed: fp32 parameters, forwards under torch.autocast in a
16-bit dtype c, 2 bytes) the residual stream, the LayerNorms and the loss stay fp32 and the Linear
layers save 16-bit copies of their inputs and of their weights. Per block (flash, dense MLP):

    ln_2's input (fp32) 4 BTC; LayerNorm statistics (fp32) 16 BT; logsumexp 4 BHT
    c_attn's and c_fc's inputs, c BTC each; q, k, v 3 c BTD; the output (c_proj's input) c BTD
    c_fc's output and GELU's (c_proj's input) 2 c BTF; the 16-bit weight copies c (4 CD + 2 CF)

(the LayerNorms' fp32 outputs are not saved: each Linear keeps its own 16-bit copy). The head saves
its statistics 8 BT, the 16-bit input and weight copies c BTC + c VC, the fp32 log-softmax 4 BTV
and the loss; stage outputs are fp32. Measured equal on the CPU for B 4, T 16, C 32, 2 heads
(91,648 bytes a block under bf16); the math path and experts under autocast are not covered.

NOTE [ Mixture of experts ]
With experts every shape is static because each expert works on a fixed `capacity` =
ceil(capacity_factor * B T * k / E) slots (empty slots are zeros), so the bytes below are exact
for any routing, tokens dropped or not. Per MoE feed-forward (N = BT tokens, A = N k
assignments, E experts, cap slots each), replacing the MLP's 8 e BTC:
    router: logits (fp32) 4 NE, probabilities 4 NE, logsumexp 4 N, first-choice fractions 4 E,
            top-k indices 8 N k, (k > 1: gates 4 N k and their sum 4 N)
    dispatch: slot and token indices 16 A, keep mask A, the gathered tokens e A C (k > 1 only:
            with k = 1 they are the LayerNorm output), the expert buffer e (E cap + 1) C
    experts: bmm outputs, GELU's input and output, 2 e E cap F (F = 4C unless ffn_hidden is set)
    combine: gathered expert outputs e A C, gate weights e A, weighted outputs e A C

Times come from FLOPs at a stated throughput (`flops_per_s`): forward_s = flops / rate and
backward_s = 2 x forward_s (the standard 1:2 split of Kaplan et al. 2020). The GPT's transient
bytes (`forward_temp_bytes`, `forward_nograd_temp_bytes`, `backward_temp_bytes`) replay the
stage's allocations op by op (`memplan.profiler.transients`, NOTE [ Transient bytes from the
allocation trace ]): exact on the CPU for the dense model without autocast; with experts or
autocast, and for the conv chain, they are estimates of the largest short-lived tensors (measure a
small model when they matter).
"""

from __future__ import annotations

import math
from dataclasses import asdict, is_dataclass
from typing import Any

from memplan.profiler.hf_config import MAX_LAYERS
from memplan.profiler.precision import infer_policy, policy_dtypes, precision_meta
from memplan.profiler.schema import (
    OPTIMIZER_BUFFERS,
    LayerProfile,
    Profile,
    ProfileError,
    check_flops_per_s,
    check_optimizer,
)
from memplan.profiler.transients import conv_transients, gpt_transients

__all__ = [
    "gpt_analytic_profile",
    "conv_analytic_profile",
    "gpt_block_saved_bytes",
    "gpt_block_policy_bytes",
    "korthikanti_block_bytes",
    "moe_capacity",
]

_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}
_GPT_DEFAULTS: dict[str, Any] = dict(
    n_layer=12, n_embd=768, n_head=12, block_size=1024, vocab_size=50304, batch_size=8,
    head_dim=0, ffn_hidden=0, dropout=0.0, bias=True, attention="flash", tie_weights=False, dtype="float32",
    moe_experts=0, moe_top_k=1, moe_capacity_factor=1.25, moe_aux_loss_coef=0.01,
    moe_z_loss_coef=1e-3, exit_layers=(), exit_threshold=0.9, exit_loss_coef=0.3, seed=0,
)


def moe_capacity(tokens: int, top_k: int, experts: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(capacity_factor * tokens * k / experts) (Switch Transformer, eq. 3)."""
    return max(1, math.ceil(capacity_factor * tokens * top_k / experts))


def _config(cfg: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if is_dataclass(cfg):
        data = asdict(cfg)
    elif isinstance(cfg, dict):
        unknown = set(cfg) - set(defaults)
        if unknown:
            raise ProfileError(f"config: unknown field(s) {', '.join(sorted(unknown))}")
        data = {**defaults, **cfg}
    else:
        raise ProfileError(f"config: expected a config dataclass or a dict, got {type(cfg).__name__}")
    return data


def _widths(c: dict[str, Any]) -> tuple[int, int, int]:
    """(head_dim, D, F): one head's width, the attention's inner width n_head * head_dim and the
    feed-forward's hidden width; 0 in the config means GPT-2's n_embd // n_head and 4 n_embd."""
    C, H = c["n_embd"], c["n_head"]
    for name in ("head_dim", "ffn_hidden"):
        if not isinstance(c[name], int) or c[name] < 0:
            raise ProfileError(f"{name}: must be a positive integer, or 0 for the GPT-2 default, got {c[name]!r}")
    if not c["head_dim"] and C % H:
        raise ProfileError(f"n_head: n_embd ({C}) must be divisible by n_head ({H}), or set head_dim")
    hd = c["head_dim"] or C // H
    return hd, H * hd, c["ffn_hidden"] or 4 * C



def _check_layers(c: dict[str, Any]) -> None:
    """The GPT's block count within MAX_LAYERS, and a finite expert capacity factor."""
    L = c["n_layer"]
    if isinstance(L, int) and not isinstance(L, bool) and L > MAX_LAYERS:
        raise ProfileError(f"n_layer: at most {MAX_LAYERS:,} blocks (memplan's ceiling, NOTE [ A ceiling "
                           f"on decoder layers ] in profiler/hf_config.py), got {L:,}")
    f = c["moe_capacity_factor"]
    if c["moe_experts"] and (isinstance(f, bool) or not isinstance(f, (int, float))
                             or not math.isfinite(f) or not f > 0):
        raise ProfileError(f"moe_capacity_factor: must be a finite number > 0, got {f!r}")


def _device_kind(device: str) -> str:
    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda"):
        raise ProfileError(f"device: choose cpu or cuda, not {device!r}")
    return kind


def gpt_block_saved_bytes(cfg: Any, *, device: str = "cpu", precision: str | None = None) -> int:
    """Bytes autograd saves for one block of `memplan.profiler.models.gpt` (see the NOTE), exact on the CPU
    for dropout 0 and no early exit. `precision`: a mixed policy (bf16-mixed, fp16-mixed) prices
    the block under autocast (NOTE [ Autocast's saved tensors ]); None or a pure one: `cfg`'s dtype."""
    c = _config(cfg, _GPT_DEFAULTS)
    kind = _device_kind(device)
    _check_exactness(c)
    B, T, C, H = c["batch_size"], c["block_size"], c["n_embd"], c["n_head"]
    _, D, F = _widths(c)
    N = B * T
    param_dtype, compute_dtype = _policy(c, precision)
    if param_dtype != compute_dtype:
        _check_autocast_covered(c, precision)
        r, e = _ELEMENT[param_dtype], _ELEMENT[compute_dtype]
        saved = r * N * C + 16 * N + 4 * B * H * T  # ln_2 input, LayerNorm statistics, logsumexp
        saved += e * (2 * N * C + 4 * N * D + 2 * N * F)  # Linear inputs, q k v, output, MLP hidden
        saved += e * (4 * C * D + 2 * C * F)  # the Linears' 16-bit weight copies
        return saved + (24 if kind == "cuda" else 0)  # flash's RNG state on a GPU
    e = _ELEMENT[c["dtype"]]
    s = e if kind == "cpu" else 4
    m = 4 if e == 2 else e
    saved = e * N * C + 2 * e * N * C + 4 * s * N  # ln_2 input, ln outputs, statistics
    if c["attention"] == "flash":
        saved += 3 * e * N * D + e * N * D + 4 * B * H * T  # qkv, output, logsumexp
        if kind == "cuda":  # the kernel's RNG state: philox seed and offset (uint64[2]) and an int64
            saved += 24
    else:
        saved += 3 * m * N * D + m * B * H * T * T + e * N * D  # q, k^T, v, probs, c_proj input
    E = c["moe_experts"]
    if not E:
        return saved + 2 * e * N * F  # c_fc output, GELU output
    k = c["moe_top_k"]
    A = N * k
    cap = moe_capacity(N, k, E, c["moe_capacity_factor"])
    saved += 4 * N * E + 4 * N * E + 4 * N + 4 * E + 8 * N * k  # logits, probs, lse, fractions, top-k
    if k > 1:
        saved += 4 * N * k + 4 * N  # gates and their sum (renormalisation)
        saved += e * A * C  # the gathered tokens
    saved += 16 * A + A + e * (E * cap + 1) * C  # slot and token indices, keep mask, buffer
    saved += 2 * e * E * cap * F  # expert hidden states
    saved += e * A * C + e * A + e * A * C  # gathered outputs, weights, weighted outputs
    return saved


# NOTE [ Save policies of a GPT block from shapes ]
# Under a save policy (memplan.profiler.policies, NOTE [ candidate save policies ]) the record of
# stage i is what the recorded forward leaves besides a_i: the selective checkpoint's cache (the
# outputs of every op it does not recompute, needed by the backward or not), plus checkpoint's
# copy of the CPU random state, R = 5,056 bytes (the Mersenne Twister state of PyTorch's CPU
# generator; on a GPU the copies are host memory, 0 device bytes). Per dense block with flash
# attention, dropout 0, no early exit, in the model's dtype (e bytes, s the LayerNorm statistics'
# as in NOTE [ What PyTorch saves in a GPT block ]), N = B T:
#   none          R (only the input, which is a_{i-1}, is kept)
#   matmuls       the four Linear outputs e (3ND + NC + NF + NC) and the attention kernel's output
#                 and logsumexp e ND + 4 BHT (the kernel is kept with the matmuls, as torchtitan
#                 does), + R (+ 24 on a GPU: the kernel's philox state, as in the base record)
#   no_attention  everything but the kernel and the residual sums: the LayerNorms' outputs and
#                 statistics 2 (e NC + 2 s N), the Linear outputs e (3ND + NC + NF + NC) and
#                 GELU's output e NF, + R (the block's output is the second sum, so the sums'
#                 packet is recomputed in every candidate: NOTE [ candidate save policies ] rule 5)
# Korthikanti et al. 2022 (Table 2) count s b h (34 + 5 a s / h) bytes per layer without
# recompute, 34 s b h with selective recompute of the attention core and 2 s b h with full
# recompute: selective recompute removes the T^2 term. Flash attention keeps no T^2 tensor in the
# first place, so here `no_attention` frees almost nothing: for D = C, F = 4C 'all' keeps
# 15 e NC + 4 s N + 4 BHT and no_attention 15 e NC + 4 s N + R, which on the CPU is more wherever
# BHT < 1,264 (the tests' tiny GPTs: the profiler drops it as it saves nothing). `none` is Table 2's full recompute, less the input the chain already counts.
# Checked equal to the profiler's measurement of each policy on the CPU (fp32,
# tests/profiler/test_policies.py); the math path, experts and autocast are not derived.
CPU_RNG_STATE_BYTES = 5056


def gpt_block_policy_bytes(cfg: Any, *, device: str = "cpu") -> dict[str, int]:
    """Saved bytes of one dense GPT block (flash attention, dropout 0) under the save policies
    'none', 'matmuls' and 'no_attention' (NOTE [ Save policies of a GPT block from shapes ]), by
    name, in bytes. Raises ProfileError for the math path, experts or dropout."""
    c = _config(cfg, _GPT_DEFAULTS)
    kind = _device_kind(device)
    _check_exactness(c)
    if c["attention"] != "flash" or c["moe_experts"]:
        raise ProfileError("attention, moe_experts: save policies are derived for flash attention "
                           "and a dense MLP only; measure others (profile_chain(policies=True))")
    B, T, C, H = c["batch_size"], c["block_size"], c["n_embd"], c["n_head"]
    _, D, F = _widths(c)
    N = B * T
    e = _ELEMENT[c["dtype"]]
    s = e if kind == "cpu" else 4
    rng = CPU_RNG_STATE_BYTES if kind == "cpu" else 0
    linears = e * (3 * N * D + N * C + N * F + N * C)
    return {
        "none": rng,
        "matmuls": linears + e * N * D + 4 * B * H * T + rng + (24 if kind == "cuda" else 0),
        "no_attention": 2 * (e * N * C + 2 * s * N) + linears + e * N * F + rng,
    }


def _policy(c: dict[str, Any], precision: str | None) -> tuple[str, str]:
    """(parameter dtype, compute dtype): the policy's, or `c`'s dtype for both when None. A policy
    with a dtype in `c` other than its parameters' (or the default float32) is a conflict."""
    if precision is None:
        return c["dtype"], c["dtype"]
    param_dtype, compute_dtype = policy_dtypes(precision)
    if c["dtype"] not in (param_dtype, "float32"):
        raise ProfileError(
            f"dtype: {c['dtype']} conflicts with precision {precision!r}, which keeps parameters "
            f"in {param_dtype} and computes in {compute_dtype}; leave dtype out (the policy sets it)"
        )
    return param_dtype, compute_dtype


def _check_autocast_covered(c: dict[str, Any], precision: str | None) -> None:
    if c["attention"] != "flash" or c["moe_experts"]:
        raise ProfileError(
            f"precision: the analytic profile prices {precision} (autocast) for flash attention "
            "and a dense MLP only; measure this model under autocast (memplan profile --autocast "
            "bfloat16) or use --attention flash --moe-experts 0"
        )


def _check_exactness(c: dict[str, Any]) -> None:
    if c["dropout"] > 0:
        raise ProfileError(
            "dropout: the analytic profile covers dropout 0 (the pretraining default); "
            "measure the model with profile_chain to include dropout masks"
        )
    if c["exit_layers"]:
        raise ProfileError(
            "exit_layers: early exit makes shapes depend on the data; measure with profile_chain"
        )


def korthikanti_block_bytes(cfg: Any) -> int:
    """s b h (34 + 5 a s / h): Korthikanti et al. 2022's activation bytes per layer (16-bit)."""
    c = _config(cfg, _GPT_DEFAULTS)
    s, b, h, a = c["block_size"], c["batch_size"], c["n_embd"], c["n_head"]
    return int(s * b * h * (34 + 5 * a * s / h))


def _gpt_params(c: dict[str, Any]) -> dict[str, int]:
    C, V, T = c["n_embd"], c["vocab_size"], c["block_size"]
    _, D, F = _widths(c)
    bias = 1 if c["bias"] else 0
    ln = C + bias * C
    attn = 3 * C * D + bias * 3 * D + D * C + bias * C  # c_attn C -> 3D, c_proj D -> C
    E = c["moe_experts"]
    ffn = (E * C + 2 * E * C * F) if E else (2 * C * F + bias * (F + C))  # C -> F -> C
    # LayerNorms and attention Linears: a weight each, plus a bias; MoE: router, w_fc, w_proj
    block_tensors = 4 * (1 + bias) + (3 if E else 2 * (1 + bias))
    return {
        "embed": V * C + T * C,
        "block": 2 * ln + attn + ffn,
        "head": ln + (0 if c["tie_weights"] else V * C),
        "embed_tensors": 2,
        "block_tensors": block_tensors,
        "head_tensors": (1 + bias) + (0 if c["tie_weights"] else 1),
    }


def gpt_analytic_profile(
    cfg: Any,
    *,
    device: str = "cpu",
    flops_per_s: float = 1e12,
    optimizer: str = "adamw",
    name: str | None = None,
    precision: str | None = None,
    cpu_threads: int = 1,
) -> Profile:
    """The profile of `memplan.profiler.models.gpt` for `cfg` (a GPTConfig or a dict of its fields) from
    shapes alone: exact `output_bytes`, `saved_bytes`, `param_bytes`, `input_bytes` and
    `fixed_bytes` (CPU accounting: LayerNorm statistics and the math path's precision differ on a
    GPU, see the NOTE); FLOPs counted like FlopCounterMode (matrix products); times from FLOPs at
    `flops_per_s`; transient bytes (tf_i, tf'_i, tb_i) from the allocation trace of
    `memplan.profiler.transients`, exact on the CPU with `cpu_threads` intra-op threads for the
    dense model without autocast (estimates with experts or autocast, and on a GPU).

    `precision` (fp32, bf16-mixed, fp16-mixed, bf16; None: `cfg`'s dtype for parameters and
    compute) sets the parameters' dtype (so the bytes per parameter of weights, gradients and the
    optimizer's state) and the compute dtype (mixed: autocast). `meta["precision"]` records the
    policy and optimizer assumed."""
    from pydantic import ValidationError

    kw = dict(device=device, flops_per_s=flops_per_s, optimizer=optimizer, name=name,
              precision=precision, cpu_threads=cpu_threads)
    try:
        return _gpt_analytic_profile(cfg, **kw)
    except ValidationError as err:  # a size beyond the profile's ceilings (NOTE [ ceilings ])
        c = _config(cfg, _GPT_DEFAULTS)
        # blame the batch, then the sequence, when the profile is within the ceilings without them
        for field, smaller in (("batch_size", {"batch_size": 1}),
                               ("batch_size, block_size", {"batch_size": 1, "block_size": 1})):
            try:
                _gpt_analytic_profile({**c, **smaller}, **kw)
                fix = "a smaller batch" if field == "batch_size" else "a smaller batch or sequence"
                break
            except (ValidationError, ProfileError):
                continue
        else:
            field, fix = "n_layer, n_embd, vocab_size", "a smaller model (layers, width, vocabulary)"
        raise _over_ceiling(err, field, fix) from None


def _over_ceiling(err, field: str, fix: str) -> ProfileError:
    """One line naming `field` for pydantic's `err` about a size over the profile's ceilings."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return ProfileError(f"{field}: the profile's {where} exceeds memplan's ceilings ({first['msg']}; "
                        f"NOTE [ ceilings ] in profiler/schema.py); give {fix}")


def _gpt_analytic_profile(cfg: Any, *, device: str, flops_per_s: float, optimizer: str,
                          name: str | None, precision: str | None, cpu_threads: int) -> Profile:
    c = _config(cfg, _GPT_DEFAULTS)
    kind = _device_kind(device)
    param_dtype, compute_dtype = _policy(c, precision)
    mixed = param_dtype != compute_dtype
    if mixed:
        _check_autocast_covered(c, precision)
    check_flops_per_s(flops_per_s)
    _check_layers(c)
    if isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 1:
        raise ProfileError(f"cpu_threads: the intra-op threads (torch.get_num_threads()), an integer "
                           f">= 1, got {cpu_threads!r}")
    check_optimizer(optimizer)
    if c["dtype"] not in _ELEMENT:
        raise ProfileError(f"dtype: choose one of {', '.join(_ELEMENT)}, not {c['dtype']!r}")
    B, T, C, H, V, L = (c[k] for k in ("batch_size", "block_size", "n_embd", "n_head", "vocab_size", "n_layer"))
    _, D, F = _widths(c)
    c = {**c, "dtype": param_dtype}
    e = _ELEMENT[param_dtype]  # parameters, and every activation unless mixed
    ce = _ELEMENT[compute_dtype]  # the matmuls' outputs under autocast
    s = e if kind == "cpu" else 4
    N = B * T
    hidden = e * N * C  # the residual stream: the parameters' dtype under autocast too
    params = _gpt_params(c)
    E, k = c["moe_experts"], c["moe_top_k"]

    block_flops = 2 * N * 4 * C * D + 2 * 2 * N * T * D  # projections + causal attention in full
    if E:
        cap = moe_capacity(N, k, E, c["moe_capacity_factor"])
        block_flops += 2 * N * C * E + 2 * 2 * E * cap * C * F
    else:
        block_flops += 2 * N * 2 * C * F
    head_flops = 2 * N * C * V

    def stage(name: str, kind_: str, flops: float, out: int, saved: int, tf: int, tb: int, pbytes: int):
        f = flops / flops_per_s
        return LayerProfile(
            name=name, kind=kind_, forward_s=f, backward_s=2 * f, output_bytes=out, saved_bytes=saved,
            forward_temp_bytes=tf, backward_temp_bytes=tb, param_bytes=pbytes, flops=float(flops),
        )

    m = 4 if e == 2 else e
    attn_tmp = 0 if c["attention"] == "flash" else 2 * m * B * H * T * T
    layers = [
        stage("embed", "embed", 0, hidden, 8 * T, hidden + e * T * C, e * (V + T) * C, e * params["embed"]),
    ]
    block_saved = gpt_block_saved_bytes(c, device=device, precision=precision)
    for i in range(L):
        layers.append(
            stage(f"block.{i}", "block", block_flops, hidden, block_saved, hidden + attn_tmp // 2,
                  7 * hidden + attn_tmp, e * params["block"])
        )
    logits = 4 * N * V
    head_saved = 2 * s * N + hidden + logits + 4  # statistics, ln_f output, log-softmax, loss
    if mixed:  # statistics fp32, the Linear's 16-bit input and weight copies, fp32 log-softmax
        head_saved = 8 * N + ce * N * C + ce * V * C + logits + 4
    layers.append(
        stage("head", "head", head_flops, 4, head_saved,
              logits + (e * N * V if e != 4 else 0), logits + e * N * V, e * params["head"])
    )
    traced = not mixed and not E  # NOTE [ Transient bytes from the allocation trace ]
    if traced:
        hd, _, _ = _widths(c)
        embed_t, block_t, head_t = gpt_transients(
            B=B, T=T, C=C, H=H, hs=hd, F=F, V=V, e=e, attention=c["attention"], bias=c["bias"],
            cpu_threads=cpu_threads)
        by_kind = {"embed": embed_t, "block": block_t, "head": head_t}
        layers = [ly.model_copy(update=dict(
            forward_temp_bytes=by_kind[ly.kind].forward, backward_temp_bytes=by_kind[ly.kind].backward,
            forward_nograd_temp_bytes=by_kind[ly.kind].forward_nograd)) for ly in layers]
    n_params = params["embed"] + L * params["block"] + params["head"]
    n_tensors = params["embed_tensors"] + L * params["block_tensors"] + params["head_tensors"]
    param_bytes = e * n_params
    opt = OPTIMIZER_BUFFERS[optimizer] * param_bytes
    if optimizer in ("adamw", "adam") and kind == "cpu":
        opt += 4 * n_tensors  # AdamW's step counters: a 4-byte CPU tensor per parameter
    buffers = 8 * N + (L * (8 * E + 8) if E else 0)  # targets; expert and dropped counters
    pending = e * V * C if c["tie_weights"] else 0
    fixed = {
        "param_bytes": param_bytes, "grad_bytes": param_bytes, "optimizer_bytes": opt,
        "buffer_bytes": buffers, "pending_shared_grad_bytes": pending, "n_params": n_params,
    }
    fixed["total_bytes"] = param_bytes * 2 + opt + buffers + pending
    return Profile(
        name=name or f"gpt-{L}x{C}",
        device=device,
        dtype=compute_dtype,
        input_bytes=8 * N,
        fixed_bytes=fixed["total_bytes"],
        layers=layers,
        meta={
            "source": "memplan.profiler.analytic.gpt_analytic_profile",
            "config": {"family": "gpt", **{k_: (list(v) if isinstance(v, tuple) else v) for k_, v in c.items()}},
            "flops_per_s": flops_per_s,
            "optimizer": optimizer,
            "precision": precision_meta(precision or infer_policy(param_dtype, None), optimizer,
                                        param_dtype, compute_dtype),
            "autocast_dtype": compute_dtype if mixed else None,
            "fixed": fixed,
            "korthikanti_block_bytes": korthikanti_block_bytes(c),
            "attention_backend": c["attention"],
            "cpu_threads": cpu_threads,
            # 16-bit stages take oneDNN's AMX buffers on CPUs that have it (NOTE [ Transient
            # bytes from the allocation trace ]): exact only on CPUs without, so not claimed
            "transients": ("estimate (experts or autocast)" if not traced else "allocation trace"
                           if e == 4 else "allocation trace (a lower bound on CPUs with AMX)"),
            "exact": ["output_bytes", "saved_bytes", "param_bytes", "input_bytes", "fixed_bytes"]
            + (["forward_temp_bytes", "forward_nograd_temp_bytes", "backward_temp_bytes"]
               if traced and kind == "cpu" and e == 4 else []),
        },
    )


_CONV_DEFAULTS: dict[str, Any] = dict(
    channels=(16, 32, 64), blocks=(2, 2, 2), image_size=32, in_channels=3, num_classes=10,
    batch_size=8, dtype="float32", seed=0,
)


def conv_analytic_profile(
    cfg: Any, *, device: str = "cpu", flops_per_s: float = 1e12, optimizer: str = "adamw",
    name: str | None = None, precision: str | None = None,
) -> Profile:
    """The profile of `memplan.profiler.models.conv` for `cfg` from shapes: exact output and saved bytes in
    fp32 (BatchNorm keeps its input, which is the stage input, and fp32 mean and inverse std per
    channel; ReLU its output, shared with the next convolution's input), FLOPs of the convolutions
    and the classifier; times as for the GPT; transient bytes (fp32) from the allocation trace of
    `memplan.profiler.transients.conv_transients`, equal to the measured ones on the default chain
    (oneDNN's scratchpads are left out: docs/profiler.md), estimates in bf16."""
    c = _config(cfg, _CONV_DEFAULTS)
    _device_kind(device)
    param_dtype, compute_dtype = _policy(c, precision)
    if param_dtype != compute_dtype:
        raise ProfileError(
            f"precision: the analytic conv profile covers fp32 and bf16, not {precision} "
            "(autocast); measure the model under autocast (memplan profile --autocast bfloat16)"
        )
    c = {**c, "dtype": param_dtype}
    check_flops_per_s(flops_per_s)
    if sum(c["blocks"]) > MAX_LAYERS:
        raise ProfileError(f"blocks: at most {MAX_LAYERS:,} blocks in all (memplan's ceiling, NOTE "
                           f"[ A ceiling on decoder layers ] in profiler/hf_config.py), got {sum(c['blocks']):,}")
    e = _ELEMENT[c["dtype"]]
    B, hw, cin = c["batch_size"], c["image_size"], c["in_channels"]
    chans, blocks = tuple(c["channels"]), tuple(c["blocks"])

    def stage(name, kind_, flops, out, saved, tf, tb, pbytes):
        f = flops / flops_per_s
        return LayerProfile(name=name, kind=kind_, forward_s=f, backward_s=2 * f, output_bytes=out,
                            saved_bytes=saved, forward_temp_bytes=tf, backward_temp_bytes=tb,
                            param_bytes=pbytes, flops=float(flops))

    act = e * B * chans[0] * hw * hw
    n_params = 9 * cin * chans[0]
    n_tensors = 1
    layers = [stage("stem", "stem", 2 * B * hw * hw * 9 * cin * chans[0], act, 0, 0, act,
                    e * 9 * cin * chans[0])]
    c_prev = chans[0]
    for g, (ch, n) in enumerate(zip(chans, blocks, strict=True)):
        for j in range(n):
            stride = 2 if (g > 0 and j == 0) else 1
            hw_out = hw // stride
            a_in, a_out = e * B * c_prev * hw * hw, e * B * ch * hw_out * hw_out
            short = stride != 1 or c_prev != ch
            saved = a_in + 2 * a_out + 8 * c_prev + 8 * ch  # relu1 out, conv1 out, relu2 out, stats
            flops = 2 * B * hw_out * hw_out * 9 * (c_prev * ch + ch * ch)
            p = 9 * c_prev * ch + 9 * ch * ch + 2 * c_prev + 2 * ch
            n_tensors += 6
            if short:
                flops += 2 * B * hw_out * hw_out * c_prev * ch
                p += c_prev * ch
                n_tensors += 1
            n_params += p
            layers.append(stage(f"layer{g + 1}.{j}", "block", flops, a_out, saved, a_out, 2 * a_in, e * p))
            c_prev, hw = ch, hw_out
    K = c["num_classes"]
    a = e * B * c_prev * hw * hw
    head_p = 2 * c_prev + c_prev * K + K
    n_params += head_p
    n_tensors += 4
    layers.append(stage("head", "head", 2 * B * c_prev * K, 4,
                        8 * c_prev + a + e * B * c_prev + 4 * B * K + 4, a, 2 * a, e * head_p))
    traced = e == 4  # fp32: NOTE [ Transient bytes of the conv chain ] in docs/profiler.md
    if traced:
        temps = conv_transients(B=B, image_size=c["image_size"], in_channels=cin, channels=chans,
                                blocks=blocks, num_classes=K)
        layers = [ly.model_copy(update=dict(
            forward_temp_bytes=tr.forward, forward_nograd_temp_bytes=tr.forward_nograd,
            backward_temp_bytes=tr.backward)) for ly, tr in zip(layers, temps, strict=True)]
    param_bytes = e * n_params
    opt = OPTIMIZER_BUFFERS[optimizer] * param_bytes
    if optimizer in ("adamw", "adam") and device.startswith("cpu"):
        opt += 4 * n_tensors
    n_bn = sum(blocks) * 2 + 1
    bn_channels = 0
    c_prev = chans[0]
    for ch, n in zip(chans, blocks, strict=True):
        for _ in range(n):
            bn_channels += c_prev + ch
            c_prev = ch
    bn_channels += c_prev
    buffers = 8 * B + e * 2 * bn_channels + 8 * n_bn  # targets; running mean/var; batch counters
    fixed = {"param_bytes": param_bytes, "grad_bytes": param_bytes, "optimizer_bytes": opt,
             "buffer_bytes": buffers, "n_params": n_params}
    fixed["total_bytes"] = 2 * param_bytes + opt + buffers
    return Profile(
        name=name or "resnet-like", device=device, dtype=c["dtype"],
        input_bytes=e * B * cin * c["image_size"] ** 2, fixed_bytes=fixed["total_bytes"], layers=layers,
        meta={"source": "memplan.profiler.analytic.conv_analytic_profile", "flops_per_s": flops_per_s,
              "config": {"family": "conv", **{k_: (list(v) if isinstance(v, tuple) else v) for k_, v in c.items()}},
              "fixed": fixed, "optimizer": optimizer,
              "transients": "allocation trace, oneDNN scratchpads left out" if traced else "estimate (bf16)",
              "precision": precision_meta(precision or infer_policy(param_dtype, None), optimizer,
                                          param_dtype, compute_dtype),
              "exact": ["output_bytes", "saved_bytes", "param_bytes", "input_bytes", "fixed_bytes"]},
    )
