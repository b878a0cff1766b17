"""Typed, bounded configs of the built-in job functions: what `config` of a run, a profile or a
sweep's model may hold, per model family. The API validates a job's `config` against these at
submission (`memplan.service.jobs.admission`), so a bad field is a 422 naming it, not a failed job
later, and no config can ask a worker for unbounded work.

NOTE [ Why these bounds ]
The bounds are sanity limits on the shape of one job on one device, wide enough for every model
this project runs or sizes (GPT-2 XL: 48 layers, width 1600, 25 heads, 1,024 tokens; a measured
run on a CPU is far smaller) and narrow enough that the estimate of a job's memory and time
(admission.py) is computed in microseconds from integers that cannot overflow. What a worker can
actually afford is the estimate's business, against the settings (`job_max_bytes`,
`job_timeout_s`); the bounds here only stop absurd requests before any arithmetic.
Profiles may be analytic (derived from shapes, never executed), so their depth bound is the
planner's stage limit's order (10,000 blocks); a measured profile is held to a run's 1,024 at
admission (admission.MEASURED_MAX_LAYERS), which also keeps the estimate's replay short.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from memplan.profiler.hf_config import REUSE_LOGITS_NEEDS_LEAN
from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

__all__ = [
    "GPTRunConfig", "ConvRunConfig", "HFRunConfig", "GPTSweepConfig", "ConvSweepConfig", "GPTProfileConfig",
    "ConvProfileConfig", "RUN_CONFIGS", "SWEEP_CONFIGS", "PROFILE_CONFIGS", "HF_RUN_MODEL_TYPES",
]

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def _heads_divide(n_embd: int, n_head: int, head_dim: int = 0) -> None:
    if not head_dim and n_embd % n_head:
        raise ValueError(f"n_head: n_embd ({n_embd}) must be divisible by n_head ({n_head})")


class GPTRunConfig(BaseModel):
    """The GPT settings of a validation run (executor.pipeline.RunSpec's model fields)."""

    model_config = _STRICT

    n_layer: int = Field(default=6, ge=1, le=1024, description="transformer blocks")
    n_embd: int = Field(default=128, ge=1, le=16384, description="width of the residual stream")
    n_head: int = Field(default=4, ge=1, le=256, description="attention heads; must divide n_embd")
    block_size: int = Field(default=64, ge=1, le=32768, description="sequence length (tokens)")
    vocab_size: int = Field(default=512, ge=1, le=1 << 20, description="vocabulary")
    batch_size: int = Field(default=8, ge=1, le=4096, description="examples per step")
    dropout: float = Field(default=0.1, ge=0, lt=1, description="dropout probability")
    repeats: int = Field(default=3, ge=1, le=100, description="profiling repeats per stage")

    @model_validator(mode="after")
    def _check(self) -> GPTRunConfig:
        _heads_divide(self.n_embd, self.n_head)
        return self


class ConvRunConfig(BaseModel):
    """The conv chain's settings of a validation run (three groups of `n_layer` residual blocks)."""

    model_config = _STRICT

    n_layer: int = Field(default=6, ge=1, le=256, description="residual blocks per group (3 groups)")
    batch_size: int = Field(default=8, ge=1, le=4096, description="examples per step")
    repeats: int = Field(default=3, ge=1, le=100, description="profiling repeats per stage")


# NOTE [ Hugging Face run configs ]
# 1. The model types a run job builds from a config are those `memplan run --hf-config` is tested
#    on (tests/hf_tiny.py: GPT-2, Llama, Mistral, Qwen2; auto_checkpoint's cut of their layers).
# 2. The config's size fields are held to the bounds of the built-in GPT run (layers, width,
#    heads, vocabulary, MLP width, positions), under either of their names (GPT-2's or Llama's);
#    its JSON to 64 KiB. Fields that ask transformers for code or quantized weights from elsewhere
#    (`auto_map`, `quantization_config`) are refused: a run builds the model from the dict alone,
#    with random weights, offline (HF_HUB_OFFLINE).
# 3. Whether the fields make a valid model of that type is `memplan.profiler.hf_config.decoder_shape`'s
#    to say at admission (422 naming `body.config.hf_config.<field>`), and the memory and time the
#    run needs are estimated from its shapes there too (admission.py).
HF_RUN_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2")
_HF_SIZE_BOUNDS = {  # config field -> (least, most)
    "n_layer": (1, 1024), "num_hidden_layers": (1, 1024), "n_embd": (1, 16384), "hidden_size": (1, 16384),
    "n_head": (1, 256), "num_attention_heads": (1, 256), "num_key_value_heads": (1, 256),
    "vocab_size": (1, 1 << 20), "n_inner": (1, 1 << 18), "intermediate_size": (1, 1 << 18),
    "n_positions": (1, 32768), "max_position_embeddings": (1, 1 << 20), "head_dim": (1, 4096),
}
_HF_REFUSED = ("auto_map", "quantization_config")
HF_CONFIG_MAX_BYTES = 64 << 10


class HFRunConfig(BaseModel):
    """A run of a Hugging Face causal LM built from its config.json (random weights, nothing
    downloaded), as `memplan run --hf-config` does: `auto_checkpoint` on a random batch, a plain
    AdamW loop on fresh batches, and one measured step against the plan's prediction."""

    model_config = _STRICT

    hf_config: dict[str, Any] = Field(description="the model's config.json as an object; model_type one of "
                                      + ", ".join(HF_RUN_MODEL_TYPES))
    seq: int = Field(default=64, ge=1, le=32768, description="tokens per sequence")
    batch_size: int = Field(default=4, ge=1, le=4096, description="sequences per step")
    lean_loss: bool = Field(default=False, description="compute the loss with memplan.lean_loss (the "
                            "same loss without the saved log-softmax: a lighter head; docs/apply.md)")
    reuse_logits: bool = Field(default=False, description="with lean_loss: its backward writes the logits' "
                               "gradient over the logits (one N x V tensor less at the head's peak)")

    @model_validator(mode="after")
    def _check(self) -> HFRunConfig:
        if self.reuse_logits and not self.lean_loss:
            raise ValueError(REUSE_LOGITS_NEEDS_LEAN)
        cfg = self.hf_config
        mt = cfg.get("model_type")
        if mt not in HF_RUN_MODEL_TYPES:
            raise ValueError(f"hf_config.model_type: one of {', '.join(HF_RUN_MODEL_TYPES)}, got {mt!r}")
        size = len(json.dumps(cfg, separators=(",", ":")))
        if size > HF_CONFIG_MAX_BYTES:
            raise ValueError(f"hf_config: at most {HF_CONFIG_MAX_BYTES:,} bytes of JSON, got {size:,}")
        for key in _HF_REFUSED:
            if cfg.get(key):
                raise ValueError(f"hf_config.{key}: not allowed; a run builds the model from this config "
                                 "alone (random weights, nothing loaded); remove it")
        for key, (lo, hi) in _HF_SIZE_BOUNDS.items():
            if key in cfg and cfg[key] is not None:
                v = cfg[key]
                if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                    raise ValueError(f"hf_config.{key}: an integer from {lo} to {hi:,}, got {v!r}")
        positions = cfg.get("n_positions") if mt == "gpt2" else None
        if isinstance(positions, int) and self.seq > positions:
            raise ValueError(f"seq: at most the config's n_positions ({positions}; GPT-2's positions are "
                             f"learned), got {self.seq}")
        return self


class GPTProfileConfig(BaseModel):
    """The fields of profiler.models.gpt.GPTConfig a profile may set (its defaults where unset)."""

    model_config = _STRICT

    n_layer: int = Field(default=12, ge=1, le=10_000, description="transformer blocks")
    n_embd: int = Field(default=768, ge=1, le=65536, description="width of the residual stream")
    n_head: int = Field(default=12, ge=1, le=1024, description="attention heads")
    head_dim: int = Field(default=0, ge=0, le=4096, description="width of one head; 0: n_embd // n_head")
    ffn_hidden: int = Field(default=0, ge=0, le=1 << 18, description="feed-forward width; 0: 4 n_embd")
    block_size: int = Field(default=1024, ge=1, le=1 << 20, description="sequence length (tokens)")
    vocab_size: int = Field(default=50304, ge=1, le=1 << 20, description="vocabulary")
    batch_size: int = Field(default=8, ge=1, le=1 << 16, description="examples per step")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    bias: StrictBool = True
    attention: Literal["flash", "math"] = "flash"
    tie_weights: StrictBool = False
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    moe_experts: int = Field(default=0, ge=0, le=1024, description="experts per feed-forward; 0: dense")
    moe_top_k: int = Field(default=1, ge=1, le=16)
    moe_capacity_factor: float = Field(default=1.25, gt=0, le=64)
    moe_aux_loss_coef: float = Field(default=0.01, ge=0, le=100)
    moe_z_loss_coef: float = Field(default=1e-3, ge=0, le=100)
    exit_layers: list[int] = Field(default_factory=list, max_length=10_000,
                                   description="blocks (0-based) followed by an exit head")
    exit_threshold: float = Field(default=0.9, ge=0, le=1)
    exit_loss_coef: float = Field(default=0.3, ge=0, le=100)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)

    @model_validator(mode="after")
    def _check(self) -> GPTProfileConfig:
        _heads_divide(self.n_embd, self.n_head, self.head_dim)
        if self.moe_experts and self.moe_top_k > self.moe_experts:
            raise ValueError(f"moe_top_k: at most moe_experts ({self.moe_experts}), got {self.moe_top_k}")
        for k, j in enumerate(self.exit_layers):
            if not 0 <= j < self.n_layer - 1:
                raise ValueError(f"exit_layers.{k}: a block index below n_layer - 1 ({self.n_layer - 1}), got {j}")
        return self


class ConvProfileConfig(BaseModel):
    """The fields of profiler.models.conv.ConvConfig a profile may set."""

    model_config = _STRICT

    channels: list[int] = Field(default_factory=lambda: [16, 32, 64], min_length=1, max_length=8)
    blocks: list[int] = Field(default_factory=lambda: [2, 2, 2], min_length=1, max_length=8)
    image_size: int = Field(default=32, ge=1, le=4096)
    in_channels: int = Field(default=3, ge=1, le=64)
    num_classes: int = Field(default=10, ge=1, le=1 << 20)
    batch_size: int = Field(default=8, ge=1, le=4096)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = Field(default=0, ge=0, le=2**32 - 1)

    @model_validator(mode="after")
    def _check(self) -> ConvProfileConfig:
        for name in ("channels", "blocks"):
            for k, v in enumerate(getattr(self, name)):
                if not 1 <= v <= (4096 if name == "channels" else 256):
                    raise ValueError(f"{name}.{k}: between 1 and {4096 if name == 'channels' else 256}, got {v}")
        if len(self.channels) != len(self.blocks):
            raise ValueError(f"blocks: one block count per group of channels ({len(self.channels)}), "
                             f"got {len(self.blocks)}")
        if self.image_size % (2 ** (len(self.channels) - 1)):
            raise ValueError(f"image_size: {self.image_size} must be divisible by "
                             f"2^{len(self.channels) - 1} (each group after the first halves it)")
        return self


class GPTSweepConfig(GPTRunConfig):
    """A sweep model's GPT settings: a run's, and its features (executor.sweep checks the names)."""

    features: str | None = Field(default=None, max_length=64, description="comma-separated, e.g. 'moe,flash'")


class ConvSweepConfig(ConvRunConfig):
    """A sweep model's conv settings: a run's, and its features (none apply: executor.sweep
    checks and refuses them)."""

    features: str | None = Field(default=None, max_length=64, description="comma-separated")


RUN_CONFIGS: dict[str, type[BaseModel]] = {"gpt": GPTRunConfig, "conv": ConvRunConfig, "hf": HFRunConfig}
SWEEP_CONFIGS: dict[str, type[BaseModel]] = {"gpt": GPTSweepConfig, "conv": ConvSweepConfig}
PROFILE_CONFIGS: dict[str, type[BaseModel]] = {"gpt": GPTProfileConfig, "conv": ConvProfileConfig}
