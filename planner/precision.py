"""Precision policies: what each costs per parameter, and the dtype activations are computed in.

Fixed memory per parameter = weights + gradients + optimizer state (AdamW: two moments, plus a
master copy where the weights themselves are low precision). Sources: Micikevicius et al. 2018
("Mixed precision training") for loss scaling and fp32 masters; Rajbhandari et al. 2020 (ZeRO,
section 3.1) for the 2 + 2 + 12 = 16 bytes per parameter of 16-bit weights with fp32 Adam state;
torch.optim.AdamW keeps its moments in the parameter's dtype, which fixes the pure-bf16 numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from memplan.planner.schema import PlanError

__all__ = ["PrecisionPolicy", "POLICIES", "get_policy", "with_optimizer", "profile_optimizer",
           "fixed_bytes", "profile_policy", "check_profile_policy"]


@dataclass(frozen=True)
class PrecisionPolicy:
    """Bytes per parameter of each kind of model state, and the compute dtypes."""

    name: str
    weight_bytes: int  # the weights the forward reads
    grad_bytes: int  # their gradients
    optimizer_bytes: int  # AdamW moments, plus an fp32 master copy where the weights are 16-bit
    param_dtype: str  # dtype the parameters are stored in
    compute_dtype: str  # dtype of the matmuls (autocast's) and so of most activations
    loss_scaling: bool  # fp16 needs a gradient scaler; bf16 and fp32 do not
    description: str

    @property
    def bytes_per_param(self) -> int:
        """weight + grad + optimizer bytes for one parameter."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    def as_dict(self) -> dict:
        return {**asdict(self), "bytes_per_param": self.bytes_per_param}


POLICIES: dict[str, PrecisionPolicy] = {
    p.name: p
    for p in (
        PrecisionPolicy("fp32", 4, 4, 8, "float32", "float32", False,
                        "everything in fp32; AdamW moments fp32"),
        PrecisionPolicy("bf16-mixed", 4, 4, 8, "float32", "bfloat16", False,
                        "torch autocast to bf16; fp32 weights are the master copy"),
        PrecisionPolicy("fp16-mixed", 4, 4, 8, "float32", "float16", True,
                        "torch autocast to fp16 with a GradScaler; fp32 master weights"),
        PrecisionPolicy("bf16", 2, 2, 4, "bfloat16", "bfloat16", False,
                        "pure bf16: weights, gradients and AdamW moments all bf16"),
        PrecisionPolicy("zero-mixed", 2, 2, 12, "float16", "float16", True,
                        "16-bit weights and gradients, fp32 master + Adam moments (ZeRO's K = 12)"),
    )
}


# Optimizer state per parameter (bytes) under each policy, by optimizer (NOTE [ optimizer state by
# policy ]): torch.optim keeps AdamW's two moments and SGD's momentum buffer in the parameter's
# dtype, so fp32-weight policies hold 4 bytes a buffer and pure bf16 2; zero-mixed's 16-bit
# weights need an fp32 master copy (4) whatever the optimizer steps, and fp32 buffers beside it.
# The "adamw" column is each policy's own `optimizer_bytes`.
_STATE_BYTES = {
    "fp32": {"adamw": 8, "adam": 8, "sgd-momentum": 4, "sgd": 0, "none": 0},
    "bf16-mixed": {"adamw": 8, "adam": 8, "sgd-momentum": 4, "sgd": 0, "none": 0},
    "fp16-mixed": {"adamw": 8, "adam": 8, "sgd-momentum": 4, "sgd": 0, "none": 0},
    "bf16": {"adamw": 4, "adam": 4, "sgd-momentum": 2, "sgd": 0, "none": 0},
    "zero-mixed": {"adamw": 12, "adam": 12, "sgd-momentum": 8, "sgd": 4, "none": 0},
}


def with_optimizer(policy: str | PrecisionPolicy, optimizer: str = "adamw") -> PrecisionPolicy:
    """`policy` with the optimizer state `optimizer` keeps (adamw, adam, sgd-momentum, sgd, none):
    its `optimizer_bytes` per parameter replaced, the rest as it is. A policy not in `POLICIES`
    (a profile's measured bytes) is returned unchanged. Raises PlanError for an unknown optimizer."""
    pol = policy if isinstance(policy, PrecisionPolicy) else get_policy(policy)
    table = _STATE_BYTES.get(pol.name)
    if optimizer not in _STATE_BYTES["fp32"]:
        raise PlanError(f"optimizer: choose one of {', '.join(_STATE_BYTES['fp32'])}, not {optimizer!r}")
    if table is None:
        return pol
    return replace(pol, optimizer_bytes=table[optimizer])


def profile_optimizer(profile) -> str:
    """The optimizer `profile` priced its state for (its `meta["optimizer"]`, or its precision
    record's); "adamw" when it does not say (profiles from before the record)."""
    meta = profile.meta if isinstance(profile.meta, dict) else {}
    rec = meta.get("precision") if isinstance(meta.get("precision"), dict) else {}
    name = meta.get("optimizer") or rec.get("optimizer") or "adamw"
    return name if name in _STATE_BYTES["fp32"] else "adamw"


def get_policy(name: str) -> PrecisionPolicy:
    """The policy called `name`; raises PlanError listing the known ones."""
    try:
        return POLICIES[name]
    except KeyError:
        raise PlanError(
            f"precision: unknown policy {name!r}; choose one of {', '.join(POLICIES)}"
        ) from None


def fixed_bytes(n_params: int, policy: str | PrecisionPolicy = "fp32") -> int:
    """Bytes of weights, gradients and optimizer state for `n_params` parameters on one device."""
    if isinstance(n_params, bool) or not isinstance(n_params, int) or n_params < 0:
        raise PlanError(f"n_params: expected a non-negative integer, got {n_params!r}")
    pol = policy if isinstance(policy, PrecisionPolicy) else get_policy(policy)
    return n_params * pol.bytes_per_param


def profile_policy(profile) -> str | None:
    """The name of the policy `profile` was made under: its `meta["precision"]["policy"]`
    (analytic and measured profiles record it), else inferred from its parameter bytes and
    autocast dtype (profiles from before the record). None when no policy matches or the profile
    does not say."""
    from memplan.profiler.precision import infer_policy

    meta = profile.meta if isinstance(profile.meta, dict) else {}
    rec = meta.get("precision")
    if isinstance(rec, dict) and "policy" in rec:
        return rec["policy"]
    fixed = meta.get("fixed")
    if not isinstance(fixed, dict) or not fixed.get("n_params"):
        return None
    per = int(fixed.get("param_bytes", 0)) // int(fixed["n_params"])
    if per == 4:
        param_dtype = "float32"
    elif per == 2 and profile.dtype in ("bfloat16", "float16"):
        param_dtype = profile.dtype
    else:
        return None
    autocast = meta.get("autocast_dtype")
    if (autocast or param_dtype) != profile.dtype:
        return None  # the compute dtype is neither autocast's nor the parameters': unknown
    return infer_policy(param_dtype, autocast)


def check_profile_policy(profile, precision: str) -> PrecisionPolicy:
    """The policy `precision`, after checking `profile` was made under it. Returns the policy;
    raises PlanError (field `precision`) naming both policies and the fix when they differ. A
    profile that records no policy is checked by its compute dtype alone."""
    from memplan.profiler.precision import POLICY_DTYPES

    pol = get_policy(precision)
    made = profile_policy(profile)
    if made is not None and made != pol.name and pol.name not in POLICY_DTYPES:
        raise PlanError(  # no profile is made under a states-only policy: do not send the user there
            f"precision: the profile was made under {made}; {pol.name} prices model states only and "
            f"is planned on a {pol.compute_dtype} profile that records no policy (an analytic "
            f"profile with dtype {pol.compute_dtype}); plan with --precision {made}"
        )
    if made is not None and made != pol.name:
        raise PlanError(
            f"precision: the profile was made under {made}, the plan asks for {pol.name}; "
            f"profile the model under {pol.name} (memplan profile --precision {pol.name}) or plan "
            f"with --precision {made}"
        )
    if made is None and profile.dtype != pol.compute_dtype:
        raise PlanError(
            f"precision: {pol.name} computes in {pol.compute_dtype} but the profile was made in "
            f"{profile.dtype}; profile the model under {pol.name} (memplan profile --precision "
            f"{pol.name}) or plan with the matching policy"
        )
    return pol
