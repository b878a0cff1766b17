"""Features applied to built stages before profiling: quantization-aware training and pruning.

Model-level features (mixture of experts, flash attention, early exit) are options of the model
family (profiler.models.gpt.GPTConfig); `model_options` maps feature names to them.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["FEATURES", "apply_features", "model_options", "check_features"]

FEATURES = ("moe", "flash", "qat", "prune", "exit")


def check_features(features: Sequence[str], model: str = "gpt") -> list[str]:
    """The feature names, validated for `model` (gpt or conv): one error naming the unknown one, a
    pair that does not go together, or any on the conv model (the features are options of the GPT
    model family; qat fake-quantizes Linear layers between the first and last stage, and the conv
    model has none there, so it would quantize nothing)."""
    out = []
    for f in features:
        f = f.strip()
        if not f:
            continue
        if f not in FEATURES:
            raise ValueError(f"--features: unknown {f!r}; choose from {', '.join(FEATURES)}")
        out.append(f)
    if "prune" in out and "moe" in out:
        raise ValueError("--features: prune removes dense MLP channels (and heads); it does not apply with moe")
    if model == "conv" and out:
        raise ValueError(f"--features: {', '.join(out)} apply to the GPT model only (qat quantizes "
                         "Linear layers, and the conv model has none between its first and last "
                         "stage); remove them or use the gpt model")
    return out


def model_options(features: Sequence[str], n_layer: int) -> dict:
    """GPTConfig options for the model-level features."""
    opts: dict = {"attention": "flash" if "flash" in features else "math"}
    if "moe" in features:
        opts.update(moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0)
    if "exit" in features and n_layer >= 2:
        opts.update(exit_layers=(max(0, n_layer // 2 - 1),), exit_threshold=0.05)
    return opts


def apply_features(stages, features: Sequence[str]) -> tuple[list[str], dict]:
    """Apply the stage-level features (qat, prune) in place. Returns notes and metrics."""
    notes: list[str] = []
    extras: dict = {}
    if "prune" in features:
        from memplan.executor.features.prune import prune_model

        note, metrics = prune_model(stages)  # 25% of the heads (floor) and of the FFN channels
        notes.append(note)
        extras["prune"] = metrics
    if "qat" in features:
        from memplan.executor.features.qat import apply_qat

        notes.append(apply_qat(stages))
    return notes, extras
