"""Precision policies: what each costs per parameter, and the dtype activations are computed in.

Fixed memory per parameter = weights + gradients + optimizer state (AdamW: two moments, plus a
master copy where the weights themselves are low precision). Sources: Micikevicius et al. 2018
("Mixed precision training") for loss scaling and fp32 masters; Rajbhandari et al. 2020 (ZeRO,
section 3.1) for the 2 + 2 + 12 = 16 bytes per parameter of 16-bit weights with fp32 Adam state;
torch.optim.AdamW keeps its moments in the parameter's dtype, which fixes the pure-bf16 numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memplan.planner.schema import PlanError

__all__ = ["PrecisionPolicy", "POLICIES", "get_policy", "fixed_bytes"]


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
