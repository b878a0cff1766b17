"""Parameter gradients, for tests that compare a planned step with the unplanned one."""

from __future__ import annotations

import torch


def grads(model: torch.nn.Module) -> list[torch.Tensor | None]:
    """Copies of `model`'s parameter gradients, in parameter order (None where a parameter has
    none)."""
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def same(got: list, want: list) -> bool:
    """Bitwise equal gradient lists of one length; a missing gradient (None) is never equal."""
    return len(got) == len(want) and all(
        a is not None and b is not None and torch.equal(a, b) for a, b in zip(got, want, strict=True))
