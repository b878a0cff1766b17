"""Storage precision of kept activations, realised: a cast on store, and back on read.

The schedule runner (executor/runner.py) calls `store` on a kept activation a_i once its first
reader has run (NOTE [ Storage precision of checkpoints ] in planner/checkpoint_dtype.py), and
`load` when a later forward reads it. Bytes follow the replay exactly: a stored value holds one
tensor of numel x element bytes; fp8 (E4M3, largest value 448) is stored times a power of two
chosen from the tensor's largest magnitude, so nothing overflows to NaN and the scaling itself is
exact; the scale is a Python float, not a tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from memplan.executor.report import ExecutorError

__all__ = ["Stored", "store", "load", "torch_dtype", "supported"]

_FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called `name` (float32, bfloat16, float16, float8_e4m3fn)."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ExecutorError(f"plan.checkpoint_dtypes: {name!r} is not a torch dtype")
    return dt


def supported(name: str) -> bool:
    """Whether this torch build can cast to and from the storage dtype `name`."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        return False
    try:
        torch.ones(2).to(dt).to(torch.float32)
    except (RuntimeError, TypeError):
        return False
    return True


@dataclass
class Stored:
    """A kept activation held in its storage dtype."""

    data: torch.Tensor  # the stored tensor
    dtype: torch.dtype  # the dtype it was computed in (and is restored to)
    scale: float = 1.0  # stored = value x scale (fp8); a power of two

    def nbytes(self) -> int:
        return self.data.untyped_storage().nbytes()


def store(value: torch.Tensor, name: str, *, stage: int) -> Stored:
    """`value` converted to the storage dtype `name` (the caller drops `value`)."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise ExecutorError(
            f"plan.checkpoint_dtypes[{stage}]: stage {stage} output is "
            f"{type(value).__name__ if not isinstance(value, torch.Tensor) else value.dtype}; only a "
            "single floating tensor can be stored converted: plan without checkpoint_dtypes for it"
        )
    dt = torch_dtype(name)
    if dt.itemsize == 1:  # fp8: scale by a power of two so that the largest magnitude fits
        lo, hi = value.aminmax()
        amax = max(abs(float(lo)), abs(float(hi)))
        del lo, hi
        if not math.isfinite(amax):
            raise ExecutorError(
                f"stage {stage}: its output holds inf or NaN; fp8 storage cannot represent it "
                "(the step has diverged: lower the learning rate or store in bf16)"
            )
        scale = 2.0 ** math.floor(math.log2(_FP8_MAX / amax)) if amax > 0 else 1.0
        return Stored((value * scale).to(dt, copy=True), value.dtype, scale)  # (value * scale): a temporary
    return Stored(value.to(dt, copy=True), value.dtype)  # a copy even in the same dtype, as replayed


def load(s: Stored) -> torch.Tensor:
    """The stored activation in the dtype it was computed in (a new tensor)."""
    out = s.data.to(s.dtype, copy=True)
    if s.scale != 1.0:
        out.mul_(1.0 / s.scale)
    return out
