"""Per-GPU model-state memory under data parallelism with sharded states (ZeRO 1-3, FSDP).

Rajbhandari et al. 2020, "ZeRO: Memory optimizations toward training trillion parameter models",
section 5 and Figure 1: with Psi parameters, N data-parallel GPUs and per-parameter bytes
w (weights), g (gradients), K (optimizer state incl. master copy):

    stage 0 (plain DDP)          (w + g + K) Psi
    stage 1 (P_os: optimizer)    (w + g) Psi + K Psi / N
    stage 2 (P_os+g: + grads)    w Psi + (g + K) Psi / N
    stage 3 (P_os+g+p: + params) (w + g + K) Psi / N

FSDP's FULL_SHARD is stage 3, SHARD_GRAD_OP stage 2. Stage 3 also gathers one unit's full weights
at a time (transient, `gathered_params`), which the plan's activations sit beside.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.precision import PrecisionPolicy, get_policy
from planner.schema import PlanError

__all__ = ["ShardedMemory", "sharded_fixed_bytes", "ZERO_STAGES"]

ZERO_STAGES = (0, 1, 2, 3)


class ShardedMemory(BaseModel):
    """Model-state bytes on each GPU."""

    model_config = ConfigDict(extra="forbid")

    n_params: int
    n_gpus: int
    zero_stage: int
    policy: str
    weight_bytes: int = Field(description="bytes of weights held per GPU")
    grad_bytes: int = Field(description="bytes of gradients held per GPU")
    optimizer_bytes: int = Field(description="bytes of optimizer state per GPU")
    gathered_bytes: int = Field(description="stage 3: transient full weights of one gathered unit")
    fixed_bytes: int = Field(description="weight + grad + optimizer + gathered bytes per GPU")


def _shard(total: int, n: int) -> int:
    return -(-total // n)  # ceiling: the largest shard


def sharded_fixed_bytes(
    n_params: int,
    *,
    n_gpus: int = 1,
    zero_stage: int = 0,
    policy: str | PrecisionPolicy = "zero-mixed",
    gathered_params: int = 0,
) -> ShardedMemory:
    """Per-GPU bytes of model state for `n_params` parameters over `n_gpus` data-parallel GPUs at
    ZeRO `zero_stage`. `gathered_params`: parameters of the largest unit stage 3 gathers at once."""
    for name, value, low in (("n_params", n_params, 0), ("n_gpus", n_gpus, 1),
                             ("gathered_params", gathered_params, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PlanError(f"{name}: expected an integer of at least {low}, got {value!r}")
    if zero_stage not in ZERO_STAGES:
        raise PlanError(f"zero_stage: expected one of 0, 1, 2, 3, got {zero_stage!r}")
    pol = policy if isinstance(policy, PrecisionPolicy) else get_policy(policy)
    w = n_params * pol.weight_bytes
    g = n_params * pol.grad_bytes
    o = n_params * pol.optimizer_bytes
    if zero_stage >= 1:
        o = _shard(o, n_gpus)
    if zero_stage >= 2:
        g = _shard(g, n_gpus)
    gathered = 0
    if zero_stage >= 3:
        w = _shard(w, n_gpus)
        gathered = gathered_params * pol.weight_bytes if n_gpus > 1 else 0
    return ShardedMemory(
        n_params=n_params, n_gpus=n_gpus, zero_stage=zero_stage, policy=pol.name,
        weight_bytes=w, grad_bytes=g, optimizer_bytes=o, gathered_bytes=gathered,
        fixed_bytes=w + g + o + gathered,
    )
