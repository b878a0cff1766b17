"""The profile: per-stage costs of one training step, as docs/chain-model.md defines them.

Plain validated data shared by every part of memplan. This module imports pydantic only (no torch),
so that the planner and the service can read profiles without the measuring stack.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
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
    "SavePolicy",
    "SAVE_ALL",
    "MINCUT",
    "mincut_budget",
    "Profile",
    "ProfileError",
    "OPTIMIZERS",
    "OPTIMIZER_BUFFERS",
    "check_optimizer",
    "check_flops_per_s",
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



def _not_bool(v: Any) -> Any:
    """Refuse true/false where a number is due (pydantic reads them as 1 and 0)."""
    if isinstance(v, bool):
        raise ValueError(f"a number, not {str(v).lower()}")
    return v


Bytes = Annotated[int, BeforeValidator(_not_bool),
                  Field(ge=0, le=MAX_BYTES, description="bytes (at most 2^53)")]
Seconds = Annotated[float, BeforeValidator(_not_bool),
                    Field(ge=0.0, le=MAX_SECONDS, description="seconds (at most 1e9)")]

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)


class ProfileError(ValueError):
    """Invalid profile input; the message names the field and says how to fix it."""


OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "none")  # the optimizers profiles price
# buffers each keeps per parameter, in the parameter's dtype (torch.optim: AdamW's two moments,
# SGD's momentum); AdamW's per-tensor step counters are counted apart
OPTIMIZER_BUFFERS = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0, "none": 0}


def check_optimizer(optimizer: object) -> str:
    """`optimizer` when it is one of `OPTIMIZERS`; raises `ProfileError` naming the field
    otherwise (an unknown name priced as no optimizer state would make a step that does not fit
    "fit")."""
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ProfileError(f"optimizer: choose one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    return optimizer


def check_flops_per_s(flops_per_s: object) -> float:
    """`flops_per_s` when it is a finite number > 0 (an analytic profile's assumed throughput);
    raises `ProfileError` naming the field otherwise (infinity made every stage's time 0)."""
    if isinstance(flops_per_s, bool) or not isinstance(flops_per_s, (int, float)) \
            or not math.isfinite(flops_per_s) or not flops_per_s > 0:
        raise ProfileError(f"flops_per_s: must be a finite number > 0 (FLOP/s), got {flops_per_s!r}")
    return flops_per_s


SAVE_ALL = "all"  # the name of a stage's own record: autograd keeps everything (its base fields)
MINCUT = "mincut:"  # a min-cut policy's token (NOTE [ min-cut policies of compiled stages ])


def mincut_budget(recompute: list[str] | tuple[str, ...] | None) -> float | None:
    """The activation memory budget B of a min-cut policy `["mincut:B"]` (NOTE [ min-cut policies
    of compiled stages ] in profiler/policies.py); None for any other recompute list. Raises
    ValueError when B is not a number."""
    if recompute and len(recompute) == 1 and recompute[0].startswith(MINCUT):
        return float(recompute[0][len(MINCUT):])
    return None


class SavePolicy(BaseModel):
    """Another way to record stage i (docs/chain-model.md section 10.8): autograd keeps the outputs
    of some operators and the backward recomputes the others from the stage's input.

    The stage's own fields are the policy `all` (everything kept); each `SavePolicy` is an
    alternative with its own record, transients and times. Output bytes and the no-grad forward
    (`F` ops) do not change with the policy."""

    model_config = _STRICT

    name: str = Field(min_length=1, max_length=64, description="policy name, unique in the stage, "
                      "not 'all', e.g. 'matmuls', 'no_attention', 'none'")
    recompute: list[str] = Field(
        default_factory=list,
        description="operators recomputed in the backward instead of kept, as aten overload "
        "packets ('aten.gelu', 'aten._softmax'); ['*']: every operator (the whole stage is "
        "recomputed from its input, as torch.utils.checkpoint does); ['mincut:B']: compiled "
        "stages only, inductor's min-cut partitioner chooses under activation memory budget B "
        "(0..1)")
    saved_bytes: Bytes = Field(description="[s_i] bytes kept for the backward under this policy")
    forward_temp_bytes: Bytes = Field(default=0, description="[tf_i] transient of the recorded "
                                      "forward under this policy")
    backward_temp_bytes: Bytes = Field(default=0, description="[tb_i] transient of the backward, "
                                       "its recomputation included")
    forward_s: Seconds = Field(description="[f_i] seconds of the recorded forward under it")
    backward_s: Seconds = Field(description="[b_i] seconds of the backward, recomputation included")

    @field_validator("name")
    @classmethod
    def _not_all(cls, name: str) -> str:
        if name == SAVE_ALL:
            raise ValueError("'all' names the stage's own record (its base fields); "
                             "give the policy another name")
        return name

    @field_validator("recompute")
    @classmethod
    def _ops_named(cls, ops: list[str]) -> list[str]:
        for op in ops:
            if op.startswith(MINCUT):  # NOTE [ min-cut policies of compiled stages ]
                try:
                    budget = mincut_budget([op])
                except ValueError:
                    budget = math.nan
                if not 0.0 <= budget <= 1.0:
                    raise ValueError(f"{op!r}: a min-cut policy is 'mincut:B' with a memory "
                                     "budget B between 0 and 1, e.g. 'mincut:0.5'")
                if len(ops) > 1:
                    raise ValueError(f"{op!r} lets the compiler choose every operator; list it "
                                     "alone")
            elif op != "*" and not re.fullmatch(r"[A-Za-z_][\w.]*", op):
                raise ValueError(f"{op!r} is not an operator name; use aten packets such as "
                                 "'aten.gelu', '*' for every operator, or 'mincut:B' (compiled "
                                 "stages)")
        if "*" in ops and len(ops) > 1:
            raise ValueError("'*' recomputes every operator; list it alone")
        return ops


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
    policies: list[SavePolicy] = Field(
        default_factory=list, max_length=8,
        description="other ways to record the stage (selective recompute, docs/chain-model.md "
        "section 10.8); the base fields are the policy 'all'. Empty: only 'all'")

    @field_validator("policies")
    @classmethod
    def _policy_names_unique(cls, policies: list[SavePolicy]) -> list[SavePolicy]:
        names = [p.name for p in policies]
        for k, name in enumerate(names):
            if name in names[:k]:
                raise ValueError(f"policies[{k}] repeats the name {name!r}; give each policy "
                                 "of a stage a unique name")
        return policies

    def policy(self, name: str) -> LayerProfile:
        """This stage with policy `name` as its record ('all': itself). Raises KeyError when the
        stage has no such policy."""
        if name == SAVE_ALL:
            return self
        for p in self.policies:
            if p.name == name:
                # `F` ops (no record) stay as they were: their time and transient are the base's
                nograd_s = self.forward_s if self.forward_nograd_s is None else self.forward_nograd_s
                nograd_tmp = (self.forward_temp_bytes if self.forward_nograd_temp_bytes is None
                              else self.forward_nograd_temp_bytes)
                return self.model_copy(update={
                    "forward_nograd_s": nograd_s, "forward_nograd_temp_bytes": nograd_tmp,
                    "saved_bytes": p.saved_bytes, "forward_temp_bytes": p.forward_temp_bytes,
                    "backward_temp_bytes": p.backward_temp_bytes, "forward_s": p.forward_s,
                    "backward_s": p.backward_s, "policies": []})
        raise KeyError(name)

    @property
    def policy_names(self) -> list[str]:
        """'all', then the names of `policies`."""
        return [SAVE_ALL] + [p.name for p in self.policies]


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
        total = sum(layer.forward_s + layer.backward_s
                    + sum(p.forward_s + p.backward_s for p in layer.policies)
                    for layer in self.layers)
        if not math.isfinite(total):
            raise ValueError(
                "layers: forward_s and backward_s add up to infinity; give times in seconds"
            )
        sizes = self.input_bytes + self.fixed_bytes + sum(
            la.output_bytes + la.saved_bytes + la.forward_temp_bytes + la.backward_temp_bytes
            + (la.forward_nograd_temp_bytes or 0) + la.param_bytes
            + sum(p.saved_bytes + p.forward_temp_bytes + p.backward_temp_bytes for p in la.policies)
            for la in self.layers)
        if sizes > MAX_PROFILE_BYTES:
            raise ValueError(
                f"layers: the profile's byte sizes add up to {sizes}, over the ceiling of 2^58 "
                "(NOTE [ ceilings ] in profiler/schema.py); give sizes in bytes"
            )
        return self

    @property
    def has_policies(self) -> bool:
        """Whether any stage has a save policy besides 'all'."""
        return any(layer.policies for layer in self.layers)

    def with_policies(self, stage_policies: dict[int, str] | None) -> Profile:
        """This profile with stage i recorded under `stage_policies[i]` (its fields replaced by
        the policy's; stages not listed: 'all'), and no other policies. Raises ProfileError naming
        `stage_policies.i` for a stage out of range or a policy the stage does not have."""
        layers = []
        chosen = dict(stage_policies or {})
        for i in chosen:
            if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= self.n_stages:
                raise ProfileError(f"stage_policies.{i}: no stage {i!r}; stages are 1..{self.n_stages}")
        for i, layer in enumerate(self.layers, start=1):
            name = chosen.get(i, SAVE_ALL)
            try:
                layer = layer.policy(name)
            except KeyError:
                raise ProfileError(
                    f"stage_policies.{i}: stage {i} ({layer.name}) has no policy {name!r}; "
                    f"it has {', '.join(layer.policy_names)}") from None
            layers.append(layer if not layer.policies else layer.model_copy(update={"policies": []}))
        return self.model_copy(update={"layers": layers})

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


def load_profile(data: Profile | dict | str | bytes | os.PathLike) -> Profile:
    """A validated `Profile` from a Profile, a dict, JSON text or the path of a JSON file (a
    `pathlib.Path`). Raises `ProfileError`."""
    if isinstance(data, Profile):
        return data
    if isinstance(data, os.PathLike):
        try:
            data = Path(data).read_bytes()
        except OSError as err:
            raise ProfileError(f"profile: cannot read {str(data)!r} ({err.strerror or err})") from None
    if isinstance(data, str) and not data.lstrip().startswith("{"):
        raise ProfileError(f"profile: {data[:80]!r} is not a profile's JSON text (an object); to "
                           "read a file, pass a pathlib.Path")
    try:
        if isinstance(data, (str, bytes)):
            return Profile.model_validate_json(data)
        if isinstance(data, dict):
            return Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(format_validation_error(err, what="profile")) from None
    raise ProfileError(f"profile: expected a Profile, a dict, JSON text or a pathlib.Path, got "
                       f"{type(data).__name__}")
