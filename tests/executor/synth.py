"""Stages whose chain-model costs are exact by construction, so that a run's measured peak must
equal the replay's prediction to the byte.

A `SynthStage` allocates exactly what its profile says: its output (x_i bytes), a record of s_i
bytes kept for the backward only when autograd records it, tf_i transient bytes in the forward, and
in the backward the input gradient (x_{i-1}) plus tb_i transient bytes. Its values still depend on
its input and its one parameter, so gradients can be compared with the unplanned step.
"""

from __future__ import annotations

import torch
from memplan.profiler.schema import Profile
from torch import nn

F32 = 4


class _SynthFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, w, x_out: int, s: int, tf: int, tb: int, scalar: bool, record: bool):
        av = float(a.detach().mean())  # scalar temporaries come first
        v = av * float(w) + 0.5
        out = torch.full((), v) if scalar else torch.full((x_out // F32,), v)
        if record:  # needs_input_grad is set even under no_grad
            ctx.record = torch.empty(s // F32) if s else None  # the record: s bytes
        tmp = torch.empty(tf // F32) if tf else None  # transient: tf bytes
        del tmp
        ctx.a_shape, ctx.tb = a.shape, tb
        ctx.wv, ctx.n_in = float(w), a.numel()
        ctx.save_for_backward(w)  # a parameter: not counted
        ctx.av = av
        return out

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        gs = float(g.detach().sum())
        grad_in = torch.full(ctx.a_shape, gs * ctx.wv / ctx.n_in)  # x_{i-1} bytes
        tmp = torch.empty(ctx.tb // F32) if ctx.tb else None  # transient: tb bytes
        del tmp
        ctx.record = None
        grad_w = torch.full((), gs * ctx.av)  # 4 bytes, below tb
        return grad_in, grad_w, None, None, None, None, None, None


class SynthStage(nn.Module):
    def __init__(self, x_out: int, s: int, tf: int, tb: int, *, scalar: bool = False, seed: int = 0):
        super().__init__()
        self.costs = (x_out, s, tf, tb)
        self.scalar = scalar
        self.w = nn.Parameter(torch.tensor(1.0 + 0.01 * seed))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return _SynthFn.apply(a, self.w, *self.costs, self.scalar, torch.is_grad_enabled())


def synth_chain(x, s, tf, tb, *, f=None, b=None):
    """(stages, a_0, profile) for costs in bytes; x includes x_0 first and the loss (4) last.

    Sizes must be multiples of 4; tb at least 8 (the parameter gradient's 4-byte temporary)."""
    L = len(s)
    stages = [SynthStage(x[i + 1], s[i], tf[i], tb[i], scalar=i == L - 1, seed=i) for i in range(L)]
    a0 = torch.linspace(0.1, 1.0, x[0] // F32)
    f = f or [1.0] * L
    b = b or [2.0] * L
    prof = Profile(
        name="synth",
        input_bytes=x[0],
        layers=[
            dict(name=f"synth.{i + 1}", forward_s=f[i], backward_s=b[i], output_bytes=x[i + 1],
                 saved_bytes=s[i], forward_temp_bytes=tf[i], backward_temp_bytes=tb[i])
            for i in range(L)
        ],
    )
    return stages, a0, prof


def worked_chain():
    """The chain model's worked example in KiB units (its bytes times 1024)."""
    K = 1024
    x = [1, 3, 4, 3, 4]
    s = [3, 4, 1, 4]
    tf = [2, 2, 0, 2]
    tb = [1, 0, 0, 0]
    return synth_chain(
        [v * K for v in x[:-1]] + [F32], [v * K for v in s], [v * K for v in tf],
        [max(v * K, 8) for v in tb], f=[3, 4, 4, 1], b=[6, 8, 8, 2],
    )
