"""Built-in model families, each a config dataclass and a builder returning `(stages, example_input)`.

    >>> from profiler.models import build_model
    >>> stages, x = build_model("gpt", n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64)

Loaded lazily: importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FAMILIES", "build_model", "model_config"]

# family -> (module, config class, builder)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "gpt": ("memplan.profiler.models.gpt", "GPTConfig", "build_gpt"),
    "conv": ("memplan.profiler.models.conv", "ConvConfig", "build_conv"),
}


def model_config(family: str, **fields: Any):
    """The family's config dataclass filled with `fields` (unknown fields: ValueError naming them)."""
    import dataclasses
    import importlib

    if family not in FAMILIES:
        raise ValueError(f"model: unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    module, cls_name, _ = FAMILIES[family]
    cls = getattr(importlib.import_module(module), cls_name)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: not a field of {cls_name}; known: {', '.join(sorted(known))}")
    return cls(**fields)


def build_model(family: str, *, device: str = "cpu", **fields: Any):
    """`(stages, example_input)` of a built-in family configured by `fields`."""
    import importlib

    cfg = model_config(family, **fields)
    module, _, builder = FAMILIES[family]
    return getattr(importlib.import_module(module), builder)(cfg, device=device)
