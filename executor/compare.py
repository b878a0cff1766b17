"""The unplanned step a planned run is judged against, and the comparison of their tensors.

The reference is a deep copy of the stages, taken from the same state (parameters, buffers), run
from the same RNG state as a plain forward over the stages followed by one backward: what training
without checkpointing would compute. Gradients, losses, buffers and parameters are compared
element by element.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "TOLERANCE",
    "Diff",
    "tensor_diff",
    "reference_copy",
    "reference_forward",
    "tolerance_for",
]

# largest accepted per-tensor relative difference by compute dtype. fp32: the 1e-6 (runs on
# the CPU are bitwise equal in practice); half types: a few units in the last place of their
# mantissa (bf16 2^-8, fp16 2^-11), as a loss or gradient accumulated in them may differ that much
TOLERANCE = {"float32": 1e-6, "bfloat16": 4 * 2.0**-8, "float16": 4 * 2.0**-11}


_BIG = sys.float_info.max  # stands for an infinite difference (JSON has no infinity)


def tolerance_for(dtype_name: str) -> float:
    """The accepted relative difference for a compute dtype name ('float32', 'bfloat16', ...)."""
    return TOLERANCE.get(dtype_name, 1e-6)


@dataclass
class Diff:
    """Largest differences over a set of tensor pairs."""

    max_abs: float = 0.0  # largest |a - b| of any element
    max_rel: float = 0.0  # largest per-tensor max|a - b| / max|b| (|b| = 0: max|a - b|)
    n_tensors: int = 0
    bitwise: bool = True  # every pair equal element by element

    def merge(self, other: Diff) -> Diff:
        return Diff(
            max(self.max_abs, other.max_abs),
            max(self.max_rel, other.max_rel),
            self.n_tensors + other.n_tensors,
            self.bitwise and other.bitwise,
        )


def tensor_diff(pairs: Iterable[tuple[torch.Tensor | None, torch.Tensor | None]]) -> Diff:
    """Differences of (value, reference) pairs; a missing tensor on one side only is an infinite
    difference (reported as the largest float), and non-finite values count as equal only where
    both sides hold the same one."""
    out = Diff()
    for a, b in pairs:
        out.n_tensors += 1
        if a is None and b is None:
            continue
        if a is None or b is None or a.shape != b.shape:
            return Diff(_BIG, _BIG, out.n_tensors, False)
        a = a.detach().to(torch.float64)
        b = b.detach().to(torch.float64)
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        if bool(same.all()):
            continue
        out.bitwise = False
        d = torch.where(same, torch.zeros_like(a), (a - b).abs())
        d = torch.nan_to_num(d, nan=_BIG, posinf=_BIG)
        dmax = float(d.max())
        finite_b = b[torch.isfinite(b)]
        scale = float(finite_b.abs().max()) if finite_b.numel() else 0.0
        out.max_abs = max(out.max_abs, dmax)
        out.max_rel = max(out.max_rel, dmax / scale if scale > 0 else dmax)
    return out


def reference_copy(stages: Sequence[nn.Module]) -> list[nn.Module]:
    """A deep copy of the stages, sharing nothing with them (modules shared between stages stay
    shared within the copy)."""
    return copy.deepcopy(list(stages))


def reference_forward(stages: Sequence[nn.Module], example_input, *, autocast_dtype=None,
                      device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """The plain forward over the stages with autograd recording. Returns the loss and the bytes
    of each stage's output (for the check against the profile)."""
    import contextlib

    from memplan.profiler.tensors import storage_bytes

    ctx = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    outputs = []
    x = example_input
    with ctx, torch.enable_grad():
        for stage in stages:
            x = stage(x)
            outputs.append(storage_bytes([x]))
    return x, outputs
