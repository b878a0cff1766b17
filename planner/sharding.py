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

from memplan.planner.precision import PrecisionPolicy, get_policy, profile_optimizer, with_optimizer
from memplan.planner.schema import PlanError
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ShardedMemory", "sharded_fixed_bytes", "dp_buffer_bytes", "shard_profile", "ZERO_STAGES"]

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


def dp_buffer_bytes(unit_params: int, *, n_gpus: int, zero_stage: int, weight_bytes: int,
                    grad_bytes: int) -> int:
    """Bytes of data-parallel communication buffers (NOTE [ Communication buffers ] item 4 in
    planner/parallelism.py): with more than one GPU, ZeRO-2 and 3 hold the largest unit's
    (`unit_params` elements) unsharded gradients until its reduce-scatter, and ZeRO-3 a second
    gathered unit (the prefetch); ZeRO 0-1 none (gradients are views into DDP's buckets)."""
    if n_gpus <= 1 or zero_stage < 2:
        return 0
    return unit_params * grad_bytes + (unit_params * weight_bytes if zero_stage == 3 else 0)


def shard_profile(
    profile,
    *,
    n_gpus: int = 1,
    zero_stage: int = 0,
    policy: str | PrecisionPolicy | None = None,
    gathered_params: int | None = None,
):
    """A copy of `profile` whose `fixed_bytes` are the per-GPU bytes of data-parallel training on
    `n_gpus` GPUs at ZeRO `zero_stage` (the activation chain is unchanged: each GPU runs the whole
    model on its own micro-batch).

    The model states (weights, gradients, optimizer state) come from `sharded_fixed_bytes`; the
    rest of the profile's fixed bytes (buffers, a tied weight's pending gradient, AdamW's per-tensor
    step counters) is kept as measured on every GPU. `policy`: None keeps the bytes per parameter
    the profile was measured with (its `meta.fixed` breakdown, e.g. fp32 AdamW = 4 + 4 + 8);
    a name prices the states by that precision policy instead, for the profile's optimizer
    (`meta["optimizer"]`; AdamW when it does not say). `gathered_params` (stage 3): the
    largest unit gathered at once; default the largest stage's parameters.
    Raises PlanError when the profile has no parameter count (`meta.fixed.n_params`)."""
    from memplan.profiler.schema import load_profile

    prof = load_profile(profile)
    fixed = prof.meta.get("fixed") if isinstance(prof.meta, dict) else None
    if not isinstance(fixed, dict) or not isinstance(fixed.get("n_params"), int):
        raise PlanError(
            "profile.meta.fixed.n_params: the profile does not say how many parameters it has; "
            "profile the model with profile_chain or profiler.analytic (they record it)"
        )
    n = fixed["n_params"]
    w, g, o = (int(fixed.get(k, 0)) for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))
    # AdamW's per-tensor step counters (4 bytes each on the CPU): neither a moment nor sharded,
    # kept on every GPU whatever the policy
    steps = o - 2 * w if o >= 2 * w and o - 2 * w < w else 0
    if policy is None:  # the measured bytes per parameter, as a policy
        per = [(b // n if n else 0) for b in (w, g, o - steps)]
        pol = PrecisionPolicy(f"measured ({prof.dtype})", *per, prof.dtype, prof.dtype, False,
                              "bytes per parameter as profiled")
    else:  # the policy's bytes for the optimizer the profile priced (SGD keeps no moments)
        pol = with_optimizer(policy, profile_optimizer(prof))
    other = prof.fixed_bytes - (w + g + o) + steps  # buffers, pending tied gradients, step counters
    if gathered_params is None:
        per_elem = (w // n) if n else 0
        gathered_params = max((layer.param_bytes for layer in prof.layers), default=0)
        gathered_params = gathered_params // per_elem if per_elem else 0
    mem = sharded_fixed_bytes(n, n_gpus=n_gpus, zero_stage=zero_stage, policy=pol,
                              gathered_params=gathered_params)
    # a pipeline rank's profile (planner.parallelism.rank_profile) has its buffers in its fixed
    # bytes already (kept in `other`); any other profile gets the data-parallel ones here, as
    # memplan capacity counts them
    buffers = 0 if "parallel" in prof.meta else dp_buffer_bytes(
        gathered_params, n_gpus=n_gpus, zero_stage=zero_stage, weight_bytes=pol.weight_bytes,
        grad_bytes=pol.grad_bytes)
    meta = {**prof.meta, "sharding": {**mem.model_dump(), "other_fixed_bytes": max(0, other),
                                      "comm_buffer_bytes": buffers,
                                      "unsharded_fixed_bytes": prof.fixed_bytes}}
    return prof.model_copy(update={"fixed_bytes": mem.fixed_bytes + max(0, other) + buffers,
                                   "meta": meta})


def over_memory_plan(profile, memory_bytes: int, *, strategy: str, options: dict | None = None):
    """The infeasible Plan for a device whose `memory_bytes` (per GPU) are fewer than the
    profile's fixed bytes (model states, buffers): no schedule of activations can fit, whatever
    the strategy. Its message says how many bytes the states need and how to get there."""
    from memplan.planner.precision import profile_policy
    from memplan.planner.schema import Plan

    shard = profile.meta.get("sharding", {}) if isinstance(profile.meta, dict) else {}
    policy = shard.get("policy") or profile_policy(profile) or "the profile's own"
    return Plan(
        strategy=strategy,
        budget_bytes=0,
        feasible=False,
        message=(
            f"the model states alone need {profile.fixed_bytes} bytes per GPU ({policy} "
            f"precision), more than the {memory_bytes} bytes of memory; add GPUs, raise the ZeRO "
            "stage or give more memory"
        ),
        n_stages=profile.n_stages,
        profile_fingerprint=profile.fingerprint(),
        options=options or {},
    )
