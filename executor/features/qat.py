"""Quantization-aware training on the stages' Linear layers.

torchao's `QATConfig` (int8 per-token dynamic activations, int4 grouped weights; fake quantization,
so training stays in float) when torchao is installed; otherwise torch.ao's `FakeQuantize` with a
moving-average observer before each Linear. The torchao fake quantizers are stateless (dynamic
scales); the torch.ao observers are buffers, which the executor's buffer guard freezes inside
recomputed segments (each observer sees each batch once per step).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["apply_qat"]

log = logging.getLogger(__name__)


def _group_size(linears: list[nn.Linear]) -> int:
    for g in (128, 64, 32, 16, 8):
        if all(m.in_features % g == 0 for m in linears):
            return g
    return 1


def _linears(stage: nn.Module) -> list[nn.Linear]:
    return [m for m in stage.modules() if type(m) is nn.Linear]


def apply_qat(stages: Sequence[nn.Module], *, backend: str = "auto", skip_first_last: bool = True) -> str:
    """Fake-quantize the Linear layers of `stages` in place (the embedding and head stages are
    left in float when `skip_first_last`). Returns a one-line note naming the backend used."""
    chosen = list(stages[1:-1] if skip_first_last and len(stages) > 2 else stages)
    if backend in ("auto", "torchao"):
        try:
            from torchao.quantization import quantize_
            from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig
        except ImportError:
            if backend == "torchao":
                raise ValueError("features: qat with backend 'torchao' needs `pip install torchao`") from None
        else:
            linears = [m for s in chosen for m in _linears(s)]
            group = _group_size(linears)
            act = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
            weight = IntxFakeQuantizeConfig(torch.int4, group_size=group)
            for s in chosen:
                quantize_(s, QATConfig(activation_config=act, weight_config=weight, step="prepare"))
            return (f"qat: torchao QATConfig on {len(linears)} Linear layers "
                    f"(int8 per-token activations, int4 weights in groups of {group})")
    if backend not in ("auto", "torch.ao"):
        raise ValueError(f"qat backend: use 'auto', 'torchao' or 'torch.ao', got {backend!r}")
    from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver

    n = 0
    for s in chosen:
        for parent in list(s.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    fq = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
                    setattr(parent, name, nn.Sequential(fq, child))
                    n += 1
    return f"qat: torch.ao FakeQuantize (moving-average min/max observers) before {n} Linear layers"
