"""Precision policies as the profiler sees them: which dtype a policy keeps parameters in and which
it computes in, and the policy a measured run used. No torch here.

The bytes each policy costs per parameter (and what they mean for the plan) live in
`memplan.planner.precision`, which reads this table; the profiler only records the policy's name
in a profile's `meta["precision"]`, so that a plan can refuse a profile made under another policy.
"""

from __future__ import annotations

from memplan.profiler.schema import ProfileError

__all__ = ["POLICY_DTYPES", "policy_dtypes", "infer_policy", "precision_meta"]

# policy name -> (parameter dtype, compute dtype). The optimizer is AdamW with its moments in the
# parameter's dtype (torch.optim's layout), so the parameter dtype fixes the bytes per parameter.
POLICY_DTYPES: dict[str, tuple[str, str]] = {
    "fp32": ("float32", "float32"),  # no autocast
    "bf16-mixed": ("float32", "bfloat16"),  # fp32 parameters (the master copy), bf16 autocast
    "fp16-mixed": ("float32", "float16"),  # fp32 parameters, fp16 autocast with a GradScaler
    "bf16": ("bfloat16", "bfloat16"),  # parameters, gradients and moments all bf16
}


def policy_dtypes(name: str) -> tuple[str, str]:
    """(parameter dtype, compute dtype) of policy `name`; raises ProfileError naming the known ones."""
    try:
        return POLICY_DTYPES[name]
    except KeyError:
        raise ProfileError(
            f"precision: unknown policy {name!r}; choose one of {', '.join(POLICY_DTYPES)}"
        ) from None


def infer_policy(param_dtype: str | None, autocast_dtype: str | None) -> str | None:
    """The policy whose parameter and compute dtypes these are (autocast_dtype None: the
    parameters' own), or None when no policy matches (e.g. pure fp16 parameters)."""
    compute = autocast_dtype or param_dtype
    for name, pair in POLICY_DTYPES.items():
        if pair == (param_dtype, compute):
            return name
    return None


def precision_meta(policy: str | None, optimizer: str, param_dtype: str | None,
                   compute_dtype: str | None) -> dict:
    """The profile's `meta["precision"]`: the policy (None: none matches), the optimizer whose
    state `fixed_bytes` counts, and the parameter and compute dtypes."""
    return {"policy": policy, "optimizer": optimizer, "param_dtype": param_dtype,
            "compute_dtype": compute_dtype}
