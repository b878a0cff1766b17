"""Fixed memory and module state: the bytes a training step holds whatever the plan (parameters,
gradients, optimizer state, buffers), and the state a profile must leave as it found it.
"""

from __future__ import annotations

from typing import Any

import torch
from memplan.profiler.schema import OPTIMIZER_BUFFERS, check_optimizer
from memplan.profiler.tensors import unique_buffers, unique_params

__all__ = ["optimizer_state_bytes", "fixed_bytes", "param_dtype", "snapshot_state", "restore_state"]


def optimizer_state_bytes(params, optimizer: str, device: torch.device) -> int:
    """Bytes the optimizer allocates for `params` once it has stepped (torch.optim's layout):
    AdamW/Adam two moments like each parameter plus a 4-byte step tensor per parameter (kept on
    the CPU unless the parameters are on a GPU, where it is not counted); SGD with momentum one
    buffer; plain SGD and 'none' nothing. Raises `ProfileError` for any other name."""
    check_optimizer(optimizer)
    trainable = [p for p in params if p.requires_grad]
    buffers = OPTIMIZER_BUFFERS[optimizer] * sum(p.numel() * p.element_size() for p in trainable)
    steps = 4 * len(trainable) if optimizer in ("adamw", "adam") and device.type == "cpu" else 0
    return buffers + steps


def fixed_bytes(stages, params, optimizer: str, dev: torch.device) -> dict[str, int]:
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    state = optimizer_state_bytes(params, optimizer, dev)
    buffer_bytes = sum(b.numel() * b.element_size() for b in unique_buffers(stages))
    # NOTE [ Parameters shared between stages ]: autograd sums a shared leaf's gradient
    # contributions in a buffer before accumulating them, so the later stage's contribution stays
    # allocated until the earlier stage's backward: through the whole backward, whatever the plan.
    # It is fixed memory (the chain model has no other place for it).
    owners: dict[int, set[int]] = {}
    for i, stage in enumerate(stages):
        for p in stage.parameters():
            owners.setdefault(id(p), set()).add(i)
    pending = sum(
        p.numel() * p.element_size() for p in params if p.requires_grad and len(owners[id(p)]) > 1
    )
    return {
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": state,
        "buffer_bytes": buffer_bytes,
        "pending_shared_grad_bytes": pending,
        "n_params": sum(p.numel() for p in params),
        "total_bytes": param_bytes + grad_bytes + state + buffer_bytes + pending,
    }


def param_dtype(stages) -> torch.dtype | None:
    """The dtype of the stages' first floating parameter (what they compute in without
    autocast); None when they have none."""
    for stage in stages:
        for p in stage.parameters():
            if p.is_floating_point():
                return p.dtype
    return None


def snapshot_state(stages) -> dict[str, Any]:
    bufs = []
    for stage in stages:
        for b in stage.buffers():
            bufs.append((b, b.detach().clone()))
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in unique_params(stages)]
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"buffers": bufs, "grads": grads, "cpu_rng": torch.get_rng_state(), "cuda_rng": cuda_rng}


def restore_state(stages, snap: dict[str, Any]) -> None:
    with torch.no_grad():
        for b, saved in snap["buffers"]:
            b.copy_(saved)
        for p, g in snap["grads"]:
            if g is None:
                p.grad = None
            elif p.grad is not None:
                p.grad.copy_(g)
            else:
                p.grad = g
    torch.set_rng_state(snap["cpu_rng"])
    if snap["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(snap["cuda_rng"])
