"""The profile: per-stage costs of one training step, as docs/chain-model.md defines them.

Plain validated data shared by every part of memplan. This module imports pydantic only (no torch),
so that the planner and the service can read profiles without the measuring stack.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "SCHEMA_VERSION",
    "MAX_BYTES",
    "MAX_PROFILE_BYTES",
    "MAX_SECONDS",
    "LayerProfile",
    "Profile",
    "ProfileError",
    "load_profile",
    "format_validation_error",
]

SCHEMA_VERSION = "1"

# NOTE [ ceilings ]
# Sizes and times have ceilings so that every sum the planner forms fits int64 with room: one byte
# size is at most 2^53 (8 PiB, exact in a float64 too), all of a profile's byte sizes together at
# most 2^58 (256 PiB), a time at most 1e9 s. Any peak of the chain model counts each stored
# activation, record and gradient at most once besides one transient and two gradients, so it is
# under 3 x 2^58 < 2^60: a budget (planner/request.py: at most 2^60) and the compiled DP's sums
# (a peak plus what its ancestors hold, its sentinel 2^62 plus one size) stay below 2^63.
MAX_BYTES = 2**53
MAX_PROFILE_BYTES = 2**58
MAX_SECONDS = 1e9

Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES, description="bytes (at most 2^53)")]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, description="seconds (at most 1e9)")]

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)


class ProfileError(ValueError):
    """Invalid profile input; the message names the field and says how to fix it."""


class LayerProfile(BaseModel):
    """Costs of one stage i (symbols of chain-model.md in brackets)."""

    model_config = _STRICT

    name: str = Field(min_length=1, description="stage name, e.g. 'block.3'")
    kind: str = Field(default="layer", description="stage family, e.g. 'block', 'embed', 'head'")
    forward_s: Seconds = Field(description="[f_i] seconds for one forward of the stage")
    backward_s: Seconds = Field(description="[b_i] seconds for its backward")
    forward_nograd_s: Seconds | None = Field(
        default=None,
        description="[f'_i] seconds for one forward under torch.no_grad() (an `F` op; cheaper: "
        "autograd records nothing); None: forward_s (a chain-model extension, docs/chain-model.md)",
    )
    output_bytes: Bytes = Field(description="[x_i] bytes of its output a_i (and of d_i)")
    saved_bytes: Bytes = Field(
        description="[s_i] bytes autograd keeps for its backward (unique storages, no parameters, "
        "no input or output storage)"
    )
    forward_temp_bytes: Bytes = Field(default=0, description="[tf_i] transient bytes in forward")
    forward_nograd_temp_bytes: Bytes | None = Field(
        default=None,
        description="[tf'_i] transient bytes above the live set and the output during a forward "
        "under torch.no_grad() (an `F` op: what a recorded forward keeps for the backward is "
        "transient there); None: forward_temp_bytes (a chain-model extension, docs/chain-model.md)",
    )
    backward_temp_bytes: Bytes = Field(default=0, description="[tb_i] transient bytes in backward")
    param_bytes: Bytes = Field(default=0, description="bytes of the stage's parameters (reports)")
    flops: Annotated[float, Field(ge=0.0)] = Field(default=0.0, description="FLOPs of one forward")
    output_dtype: str | None = Field(
        default=None,
        description="dtype of its output a_i (e.g. 'float32' for the residual stream under bf16 "
        "autocast); None: the profile's dtype. Storage precision of checkpoints (docs/precision.md)",
    )


class Profile(BaseModel):
    """A chain of stages 1..L plus what the plan cannot change."""

    model_config = _STRICT

    schema_version: Literal["1"] = SCHEMA_VERSION
    name: str = Field(default="model", min_length=1, description="model name, for reports")
    device: str = Field(default="cpu", description="device measured on, e.g. 'cpu', 'cuda:0'")
    dtype: str = Field(default="float32", description="compute dtype measured under")
    input_bytes: Bytes = Field(description="[x_0] bytes of the step's input a_0 (always live)")
    fixed_bytes: Bytes = Field(
        default=0,
        description="parameters, gradients, optimizer state and other memory the plan cannot change",
    )
    layers: list[LayerProfile] = Field(min_length=1, description="stages 1..L in order")
    meta: dict[str, Any] = Field(
        default_factory=dict, description="free-form provenance (model config, tool versions)"
    )

    @field_validator("layers")
    @classmethod
    def _names_unique(cls, layers: list[LayerProfile]) -> list[LayerProfile]:
        seen: set[str] = set()
        for i, layer in enumerate(layers):
            if layer.name in seen:
                raise ValueError(
                    f"stage {i + 1} repeats the name {layer.name!r}; give every stage a unique name"
                )
            seen.add(layer.name)
        return layers

    @model_validator(mode="after")
    def _totals_finite(self) -> Profile:
        # each time is finite, but their sum can still overflow to infinity (e.g. 1e308 twice)
        total = sum(layer.forward_s + layer.backward_s for layer in self.layers)
        if not math.isfinite(total):
            raise ValueError(
                "layers: forward_s and backward_s add up to infinity; give times in seconds"
            )
        sizes = self.input_bytes + self.fixed_bytes + sum(
            la.output_bytes + la.saved_bytes + la.forward_temp_bytes + la.backward_temp_bytes
            + (la.forward_nograd_temp_bytes or 0) + la.param_bytes for la in self.layers)
        if sizes > MAX_PROFILE_BYTES:
            raise ValueError(
                f"layers: the profile's byte sizes add up to {sizes}, over the ceiling of 2^58 "
                "(NOTE [ ceilings ] in profiler/schema.py); give sizes in bytes"
            )
        return self

    @property
    def n_stages(self) -> int:
        """L, the number of stages."""
        return len(self.layers)

    def fingerprint(self) -> str:
        """A short hash of the stage names, output and parameter sizes: plans carry it so that a plan
        made for one model is refused by another, a pruned copy included (timings are left out;
        they vary between runs)."""
        key = [(layer.name, layer.output_bytes, layer.param_bytes) for layer in self.layers]
        digest = hashlib.sha256(json.dumps([self.input_bytes, key]).encode()).hexdigest()
        return digest[:16]


def format_validation_error(err: ValidationError, *, what: str) -> str:
    """One line per problem: 'what: field.path: message'."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; remove it (check the spelling against the schema)"
        elif e["type"] == "finite_number":
            msg = "must be a finite number, not NaN or infinity"
        elif e["type"] == "missing":
            msg = "field required"
        lines.append(f"{what}: {loc}: {msg}")
    return "; ".join(lines)


def load_profile(data: Profile | dict | str | bytes) -> Profile:
    """A validated `Profile` from a Profile, a dict or JSON text. Raises `ProfileError`."""
    if isinstance(data, Profile):
        return data
    try:
        if isinstance(data, (str, bytes)):
            return Profile.model_validate_json(data)
        if isinstance(data, dict):
            return Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(format_validation_error(err, what="profile")) from None
    raise ProfileError(f"profile: expected a Profile, a dict or JSON text, got {type(data).__name__}")
