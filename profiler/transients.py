"""Transient bytes of the GPT family's stages from shapes: every allocation and free the CPU
allocator sees while a stage runs, replayed in order. No torch import.

NOTE [ Transient bytes from the allocation trace ]
A stage's transients (`forward_temp_bytes` tf_i, `forward_nograd_temp_bytes` tf'_i,
`backward_temp_bytes` tb_i) are peaks of a sequence of allocations and frees, so no closed formula
of the largest tensors gets them right: which tensor is still alive when the next one is made
decides the peak. This module writes that sequence down, op by op, as PyTorch 2.x runs the modules
of `memplan.profiler.models.gpt` on the CPU (read from the profiler's `[memory]` events, op by
op, on the GPT of issue 26 and checked on others), and replays it the way `profile_chain` measures
it (profiler/measure.py):

- tf_i: the recorded forward's peak minus what it leaves allocated (its output and saved tensors);
- tf'_i: the same for the forward under torch.no_grad(), which leaves its output only;
- tb_i: the backward's peak above its start minus the input's gradient and the output's gradient
  d_i (the chain model counts both as live during B_i), the backward seeded as the profiler seeds
  it: a scalar of the output's dtype whose gradient (one more scalar) makes d_i inside autograd.

Small tensors count: the math path's scale factors (an 8-byte double and its m-byte copy), its
causal mask (T x T bools, then m T^2 bytes of additive mask), `_safe_softmax`'s checks (B H T^2
bools, B H T bools, a scalar), the loss's total weight, the position indices (8 T) and the seed's
scalars are why the measured numbers are odd (459,012 = 4 + 524,288 + 65,536 + 256 - 131,072).

Kernel workspaces (C++ buffers the profiler also sees):
- the flash kernel's per-thread buffers (forward: fp32 (q_s kv_s + 2 q_s + q_s hs) per thread,
  plus q_s kv_s elements of a 16-bit dtype; backward: fp32 2 q_s kv_s and q_s, plus 2 q_s kv_s
  16-bit), with q_s = 32 below T 192, 64 below 768, else 256 (never above T) and kv_s = min(512, T);
- the LayerNorm backward's 2 C-element buffer for the weight and bias gradients, per thread.
Both scale with `at::get_num_threads()` when the stage runs (`cpu_threads` here; the tests run
one thread). On a CPU with AMX (`torch.cpu._is_amx_tile_supported()`), 16-bit stages take
buffers this trace does not have (oneDNN's AMX matmuls, with flash and with math attention: 11 KiB
more in a width-32 block's forward, 11 KiB in its backward, torch 2.13.0): there a bf16 stage's
transients are a lower bound; fp32 stages stay exact.

Exact on the CPU for the dense GPT (fp32 parameters, and bf16 where the CPU has no AMX; flash and
math attention, with biases), dropout 0, no autocast. Not covered (the callers keep their estimates and say so):
mixture-of-experts feed-forwards, autocast, and GPUs, where cuBLAS and the flash kernels keep
other workspaces and the caching allocator rounds every block to 512 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StageTransients", "gpt_transients", "conv_transients", "flash_split_sizes"]


@dataclass(frozen=True)
class StageTransients:
    """Transient bytes of one stage, as `profile_chain` measures them on the CPU."""

    forward: int  # tf_i: recorded forward's peak minus what it leaves allocated (bytes)
    forward_nograd: int  # tf'_i: no-grad forward's peak minus its output (bytes)
    backward: int  # tb_i: backward's peak above its start, minus d_{i-1} and d_i (bytes)


class _Trace:
    """A running allocated level and its peak (bytes)."""

    def __init__(self) -> None:
        self.level = 0
        self.peak = 0

    def __call__(self, *deltas: int) -> None:
        for d in deltas:
            self.level += d
            self.peak = max(self.peak, self.level)


def flash_split_sizes(T: int) -> tuple[int, int]:
    """(q_s, kv_s): the CPU flash kernel's query and key/value block sizes for sequence length T
    (rows of the query and of the keys a thread works on at once)."""
    q = 256 if T >= 768 else (64 if T >= 192 else 32)
    return min(q, T), min(512, T)


def _temps(fwd, nograd, bwd, *, out: int, in_grad: int, seed: int) -> StageTransients:
    """Replay the three traces the way profile_chain measures them (NOTE above)."""
    t = _Trace()
    fwd(t, True)
    n = _Trace()
    nograd(n, False)
    b = _Trace()
    b(seed, out)  # the seed scalar's gradient, then d_i made by the seed's backward
    bwd(b)
    # clamped at 0 as measured: tb can come out negative where d_{i-1} is made after the peak
    return StageTransients(forward=max(0, t.peak - t.level), forward_nograd=max(0, n.peak - n.level),
                           backward=max(0, b.peak - in_grad - out))


def gpt_transients(
    *, B: int, T: int, C: int, H: int, hs: int, F: int, V: int, e: int, attention: str,
    bias: bool = True, block_size: int | None = None, cpu_threads: int = 1,
) -> tuple[StageTransients, StageTransients, StageTransients]:
    """(embed, block, head) transient bytes of the dense GPT on the CPU (NOTE above): batch B,
    sequence T, width C, H heads of width hs, feed-forward width F, vocabulary V, element size e
    of the parameters and activations (4 fp32, 2 bf16), `attention` "flash" or "math", the
    position table's rows `block_size` (default T) and `cpu_threads` (at::get_num_threads())."""
    if attention not in ("flash", "math"):
        raise ValueError(f"attention: choose flash or math, not {attention!r}")
    if cpu_threads < 1:
        raise ValueError(f"cpu_threads: must be >= 1, got {cpu_threads}")
    N = B * T
    D = H * hs
    h = e * N * C  # one residual-stream activation
    s = e  # LayerNorm statistics: the input's dtype on the CPU
    up = e == 2  # the math path upcasts 16-bit inputs to fp32
    m = 4 if up else e
    A = m * B * H * T * T  # one attention matrix of the math path
    P = block_size or T
    nb = 1 if bias else 0
    ln_buf = 2 * e * C * cpu_threads  # LayerNorm backward's weight/bias gradient buffer

    def ln_fwd(t, grad: bool) -> None:  # output, mean, rstd (no-grad: statistics freed at once)
        t(h, s * N, s * N)
        if not grad:
            t(-s * N, -s * N)

    def ln_bwd(t, *, saved_input: bool, residual: bool) -> None:
        # grad input, weight (and bias) gradients, the kernel's buffer; then the incoming gradient,
        # the saved input (unless it is the stage's input), the statistics, and the gradient
        # itself once it has been added in place into the residual stream's gradient
        t(h, e * C, nb * e * C, ln_buf, -ln_buf, -h)
        t(-h if saved_input else 0, -s * N, -s * N, -h if residual else 0)
        t(-e * C, -nb * e * C)  # AccumulateGrad adds the weight gradients into .grad

    def linear_bwd(t, n_in: int, n_out: int, *, free_input: bool, free_grad: bool) -> None:
        # grad input (N x n_in), weight gradient, bias gradient; then the incoming gradient and
        # the saved input when nothing else keeps them; AccumulateGrad frees the weight gradients
        t(e * N * n_in, e * n_in * n_out, nb * e * n_out)
        t(-e * N * n_out if free_grad else 0, -e * N * n_in if free_input else 0)
        t(-nb * e * n_out, -e * n_in * n_out)

    q_s, kv_s = flash_split_sizes(T)
    fl_buf = 4 * cpu_threads * (q_s * kv_s + 2 * q_s + q_s * hs)
    fl_red = cpu_threads * q_s * kv_s * e if up else 0
    fl_bbuf = 4 * cpu_threads * 2 * q_s * kv_s
    fl_bred = cpu_threads * 2 * q_s * kv_s * e if up else 0
    fl_dsum = 4 * cpu_threads * q_s
    lse = 4 * B * H * T

    def attention_fwd(t, grad: bool) -> None:
        # from c_attn's output (3 e N D, allocated) to c_proj's input (e N D)
        if attention == "flash":
            t(e * N * D, lse, fl_buf, fl_red, -fl_red, -fl_buf)
            if not grad:
                t(-lse)
            return  # the output is laid out (B, T, H, hs): transpose + contiguous copies nothing
        if up:
            t(m * N * D, m * N * D, m * N * D)  # q, k, v in fp32
        t(8, m, m * N * D, -m, -8)  # q * sqrt(scale): the double, its copy, the product
        t(T * T, T * T, -T * T, m, m, m * T * T, -m, -m, -T * T)  # causal mask, then additive
        t(8, m, m * N * D, -m, -8)  # k^T * sqrt(scale)
        t(m * N * D, m * N * D, A)  # q and k^T made contiguous for bmm, the scores
        t(-m * N * D) if grad else t(-3 * m * N * D)  # the scaled k^T (no-grad: and both copies)
        t(A, A // m, B * H * T, 4, -4, -B * H * T, -A // m, -A)  # _safe_softmax, scores freed
        if up:
            t(e * B * H * T * T)
        t(m * N * D, m * N * D)  # v made contiguous, probabilities @ v
        if not grad:
            t(-m * N * D)  # the v copy
        if up:
            t(e * N * D)  # the output cast back
            freed = m * N * D + m * N * D + m * T * T + 3 * m * N * D + e * B * H * T * T
            t(-freed - (0 if grad else A))  # product, q, mask, fp32 q k v (, probabilities)
        else:
            t(-m * N * D, -m * T * T, 0 if grad else -A)  # q, mask (, probabilities)
        t(e * N * D, -e * N * D)  # y.transpose(1, 2).contiguous(); the attention output freed

    def block_fwd(t, grad: bool) -> None:
        ln_fwd(t, grad)
        t(3 * e * N * D)  # c_attn
        attention_fwd(t, grad)
        t(e * N * C)  # c_proj
        if not grad:
            t(-3 * e * N * D, -e * N * D, -h)  # qkv, c_proj's input, ln_1's output
        elif attention == "math":
            t(-3 * e * N * D)  # qkv: the math path keeps its own copies
        t(h, -e * N * C)  # x + attn
        ln_fwd(t, grad)
        t(e * N * F, e * N * F)  # c_fc, GELU
        if not grad:
            t(-e * N * F)
        t(e * N * C)  # c_proj
        if not grad:
            t(-e * N * F, -h)  # GELU's output, ln_2's output
        t(h, -e * N * C)  # x + mlp
        if not grad:
            t(-h)  # x + attn

    def block_bwd(t) -> None:
        linear_bwd(t, F, C, free_input=True, free_grad=False)  # mlp.c_proj (d stays: residual)
        t(e * N * F, -e * N * F, -e * N * F)  # GELU: grad in; grad out, saved input freed
        linear_bwd(t, C, F, free_input=False, free_grad=True)  # mlp.c_fc
        t(-h)  # ln_2's output, saved by c_fc
        ln_bwd(t, saved_input=True, residual=True)  # ln_2
        linear_bwd(t, D, C, free_input=attention == "math", free_grad=False)  # attn.c_proj
        if attention == "flash":
            t(3 * e * N * D, fl_bbuf, fl_bred, fl_dsum, -fl_dsum, -fl_bred, -fl_bbuf)
            t(-e * N * D, -3 * e * N * D, -lse, -e * N * D)  # grad out, qkv, lse, output
        else:
            if up:
                t(m * N * D, -e * N * D)  # the output cast's backward
                t(m * N * D, -m * N * D)  # the product's view: its gradient made contiguous
            else:
                t(m * N * D, -e * N * D)
            t(m * N * D, A, -m * N * D, -m * N * D)  # probabilities @ v: grad v, grad probs
            t(A, -A, -A)  # softmax
            t(m * N * D, m * N * D, -A, -m * N * D, -m * N * D)  # q @ k^T
            for _ in range(2):  # the two scale factors
                t(8, m, m * N * D, -m, -8, -m * N * D)
            if up:
                for _ in range(3):  # q, k, v back to the parameters' dtype
                    t(e * N * D, -m * N * D)
            t(e * N * D, -e * N * D, e * N * D, -e * N * D)  # q's and k's heads made contiguous
        t(3 * e * N * D, -e * N * D, -e * N * D, -e * N * D)  # split's backward: cat
        linear_bwd(t, C, 3 * D, free_input=False, free_grad=True)  # attn.c_attn
        t(-h)  # ln_1's output
        ln_bwd(t, saved_input=False, residual=True)  # ln_1 (its input is the stage's)

    def embed_fwd(t, grad: bool) -> None:
        t(8 * T, h, e * T * C, h, -h, -e * T * C)  # positions, wte, wpe, the sum
        if not grad:
            t(-8 * T)

    def embed_bwd(t) -> None:
        t(e * T * C, e * P * C, -e * T * C, -8 * T, -e * P * C)  # wpe: batch sum, its gradient
        t(e * V * C, -h, -e * V * C)  # wte: its gradient; d freed

    def head_fwd(t, grad: bool) -> None:
        ln_fwd(t, grad)
        t(e * N * V)  # lm_head
        if not grad:
            t(-h)
        t(4 * N * V if up else 0, 4 * N * V, 4, 4)  # .float(), log_softmax, loss, total weight
        if grad:
            t(-4 * N * V if up else 0, -e * N * V)
        else:
            t(-4, -4 * N * V, -4 * N * V if up else 0, -e * N * V)

    def head_bwd(t) -> None:
        t(4 * N * V, -4, 4 * N * V, -4 * N * V, -4 * N * V)  # nll, log_softmax backward
        if up:
            t(e * N * V, -4 * N * V)  # the .float()'s backward
        t(e * N * C, e * V * C, -e * N * V, -h, -e * V * C)  # lm_head (no bias)
        ln_bwd(t, saved_input=False, residual=False)  # ln_f

    embed = _temps(embed_fwd, embed_fwd, embed_bwd, out=h, in_grad=0, seed=e)
    block = _temps(block_fwd, block_fwd, block_bwd, out=h, in_grad=h, seed=e)
    head = _temps(head_fwd, head_fwd, head_bwd, out=4, in_grad=h, seed=4)
    return embed, block, head


def conv_transients(
    *, B: int, image_size: int, in_channels: int, channels: tuple[int, ...], blocks: tuple[int, ...],
    num_classes: int, e: int = 4,
) -> list[StageTransients]:
    """Transient bytes of `memplan.profiler.models.conv`'s stages (stem, each residual block, head)
    on the CPU, fp32, as oneDNN runs the convolutions on an AVX2 machine (NOTE [ Transient bytes
    of the conv chain ] in docs/profiler.md): each convolution reorders its input (not the
    3-channel stem's), its weight and its output between PyTorch's layout and oneDNN's blocked
    one, and its backward its gradients too. oneDNN's scratchpads (a strided 1 x 1 convolution's
    buffer, the weight gradient's reduction buffers: tens of KiB on the default chain) are left
    out: they depend on the kernel oneDNN picks for the CPU and were below every peak measured."""
    out: list[StageTransients] = []
    hw = image_size
    c0 = channels[0]
    y0 = e * B * c0 * hw * hw

    def stem_fwd(t, grad: bool) -> None:
        w = e * 9 * in_channels * c0
        t(w, y0, -w, y0, -y0)  # weight reorder, blocked output, plain output

    def stem_bwd(t) -> None:
        w = e * 9 * in_channels * c0
        t(y0, w, -y0, w, -w, -y0, -w)  # grad_out reordered, weight gradient; d freed

    out.append(_temps(stem_fwd, stem_fwd, stem_bwd, out=y0, in_grad=0, seed=4))

    def bn_fwd(t, a: int, c: int, grad: bool) -> None:  # batch counter, output, statistics
        t(8, -8, a, 4 * c, 4 * c, 4 * c, 4 * c, -4 * c, -4 * c, 4 * c, 4 * c, -4 * c, -4 * c)
        if not grad:
            t(-4 * c, -4 * c)

    def bn_bwd(t, a: int, c: int, *, saved_input: bool, residual: bool) -> None:
        t(a, 4 * c, 4 * c, a, -a, -a)  # grad in, weight and bias gradients, a kernel temporary
        t(-a if saved_input else 0, -4 * c, -4 * c, -a if residual else 0, -4 * c, -4 * c)

    def conv_fwd(t, x: int, w: int, y: int) -> None:  # input, weight, blocked output reordered
        t(x, w, y, -w, -x, y, -y)

    def conv_bwd(t, x: int, w: int, y: int, strided: bool) -> None:
        t(y, w, x, -w, -y)  # data: grad_out and weight reordered, blocked grad_in
        t(x, x, -x, -x) if strided else t(x, -x)  # grad_in to PyTorch's layout
        t(y, x, w, -x, -y, w, -w)  # weights: grad_out and input reordered, blocked gradient

    c_prev = c0
    for g, (ch, n) in enumerate(zip(channels, blocks, strict=True)):
        for j in range(n):
            stride = 2 if (g > 0 and j == 0) else 1
            hw_out = hw // stride
            a_in, a_out = e * B * c_prev * hw * hw, e * B * ch * hw_out * hw_out
            w1, w2, ws = e * 9 * c_prev * ch, e * 9 * ch * ch, e * c_prev * ch
            short = stride != 1 or c_prev != ch

            def fwd(t, grad: bool, a_in=a_in, a_out=a_out, w1=w1, w2=w2, ws=ws, ci=c_prev, co=ch,
                    short=short) -> None:
                bn_fwd(t, a_in, ci, grad)
                t(a_in, -a_in)  # ReLU; BatchNorm's output freed
                if short:
                    conv_fwd(t, a_in, ws, a_out)
                conv_fwd(t, a_in, w1, a_out)
                if not grad:
                    t(-a_in)  # ReLU's output
                bn_fwd(t, a_out, co, grad)
                t(a_out, -a_out)
                conv_fwd(t, a_out, w2, a_out)
                if not grad:
                    t(-a_out, -a_out)  # ReLU's and conv1's outputs
                t(a_out, -a_out)  # the residual add; conv2's output freed
                if short:
                    t(-a_out)  # the shortcut's output (the add keeps neither input)

            def bwd(t, a_in=a_in, a_out=a_out, w1=w1, w2=w2, ws=ws, ci=c_prev, co=ch, short=short,
                    strided=stride != 1) -> None:
                conv_bwd(t, a_out, w2, a_out, False)  # conv2 (grad_out is d: kept)
                t(-w2)
                t(a_out, -a_out, -a_out)  # ReLU 2: grad in; grad out and its output freed
                bn_bwd(t, a_out, co, saved_input=True, residual=False)  # bn2 (input: conv1's output)
                conv_bwd(t, a_in, w1, a_out, strided)  # conv1
                t(-a_out, -w1)  # its grad_out; AccumulateGrad
                if short:
                    conv_bwd(t, a_in, ws, a_out, strided)
                    t(-a_out, -a_in, -ws)  # d; its grad_in added into conv1's; AccumulateGrad
                t(a_in, -a_in, -a_in)  # ReLU 1
                bn_bwd(t, a_in, ci, saved_input=False, residual=not short)  # bn1: d added in

            out.append(_temps(fwd, fwd, bwd, out=a_out, in_grad=a_in, seed=4))
            c_prev, hw = ch, hw_out
    a = e * B * c_prev * hw * hw
    pooled, logits = e * B * c_prev, 4 * B * num_classes

    def head_fwd(t, grad: bool) -> None:
        bn_fwd(t, a, c_prev, grad)
        t(a, -a)  # ReLU
        t(pooled, 8, 4, -4, -8)  # mean over H, W: a sum, divided in place by a scalar
        if not grad:
            t(-a)
        t(logits, logits, 4, 4)  # fc, log_softmax, loss, total weight
        t(-logits) if grad else t(-4, -logits, -logits, -pooled)

    def head_bwd(t) -> None:
        t(logits, -4, -4, logits, -logits, -logits)  # nll, log_softmax
        K = num_classes
        t(pooled, e * K * c_prev, e * K, -logits, -pooled, -e * K, -e * K * c_prev)  # fc
        t(8, 4, a, -4, -8, -pooled)  # the mean's backward
        t(a, -a, -a)  # ReLU
        bn_bwd(t, a, c_prev, saved_input=False, residual=False)

    out.append(_temps(head_fwd, head_fwd, head_bwd, out=4, in_grad=a, seed=4))
    return out
