"""Torch byte accounting and stage inputs, written once for the profiler and the executor.

NOTE [ Bytes of tensors ]
1. A tensor's bytes are its storage's bytes (`untyped_storage().nbytes()`), counted once per
   storage however many views share it: a view costs nothing, and two outputs that alias are one
   allocation.
2. Storages of no bytes are left out (their data pointers are not unique).
3. Parameters and buffers are counted once per object, in the order modules yield them: a weight
   tied between two stages belongs to the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten

__all__ = ["unique_params", "unique_buffers", "storage_sizes", "storage_bytes", "stage_input", "Seed"]


def unique_params(modules: Sequence[nn.Module]) -> list[nn.Parameter]:
    """The modules' parameters in order, each once (NOTE [ Bytes of tensors ] rule 3)."""
    seen: dict[int, nn.Parameter] = {}
    for m in modules:
        for p in m.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def unique_buffers(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    """The modules' buffers in order, each once (NOTE [ Bytes of tensors ] rule 3)."""
    seen: dict[int, torch.Tensor] = {}
    for m in modules:
        for b in m.buffers():
            seen.setdefault(id(b), b)
    return list(seen.values())


def storage_sizes(values: Iterable[Any], *, device: torch.device | None = None) -> dict[int, int]:
    """{storage data pointer: bytes} of the distinct non-empty storages of the tensors in `values`
    (each a tensor, None, or a tree of them: lists, tuples, dicts); with `device`, only those on it."""
    out: dict[int, int] = {}
    for value in values:
        flat, _ = tree_flatten(value)
        for t in flat:
            if isinstance(t, torch.Tensor) and (device is None or t.device == device):
                st = t.untyped_storage()
                if st.nbytes():
                    out[st.data_ptr()] = st.nbytes()
    return out


def storage_bytes(values: Iterable[Any], *, device: torch.device | None = None) -> int:
    """Bytes of the distinct storages of the tensors in `values` (see `storage_sizes`)."""
    return sum(storage_sizes(values, device=device).values())


def stage_input(x: torch.Tensor, first: bool) -> torch.Tensor:
    """The stage's input as a leaf that takes a gradient (stage 1's data input does not)."""
    x = x.detach()
    if not first and x.is_floating_point():
        x.requires_grad_(True)
    return x


class Seed(torch.autograd.Function):
    """A scalar whose backward hands `ones_like(out)` to `out`'s graph, so that the gradient of the
    stage's output exists only inside autograd (a Python reference would pin it)."""

    @staticmethod
    def forward(ctx, out):
        ctx.meta = (out.shape, out.dtype, out.device)
        return out.new_zeros(())

    @staticmethod
    def backward(ctx, grad):
        shape, dtype, device = ctx.meta
        return torch.ones(shape, dtype=dtype, device=device)
