"""Write the example profiles from the analytic profiler (profiler.analytic): a 24-layer GPT-like
decoder and a ResNet-like chain whose activations shrink with depth. Bytes follow from the shapes
(what PyTorch saves, see docs/profiler.md); times from FLOPs at a stated bf16 throughput.
Run:
    python examples/make_examples.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from memplan.profiler.analytic import conv_analytic_profile, gpt_analytic_profile  # noqa: E402

GPU_FLOPS_PER_S = 300e12  # a stated utilisation of a modern GPU in bf16 (transformer matmuls)
CONV_FLOPS_PER_S = 150e12  # convolutions run at a lower utilisation


def gpt24():
    """GPT-2 medium's shape with a 1024-wide residual stream: 24 layers, 16 heads, batch 8 of
    1024 tokens, bf16 with flash attention, on a GPU."""
    cfg = dict(n_layer=24, n_embd=1024, n_head=16, block_size=1024, vocab_size=50304, batch_size=8,
               dtype="bfloat16", attention="flash")
    return gpt_analytic_profile(cfg, device="cuda", flops_per_s=GPU_FLOPS_PER_S, name="gpt24-example")


def resnet_like():
    """ResNet-34's groups (3, 4, 6, 3 blocks of 64..512 channels) at 112 x 112 after the stem,
    batch 64, 1000 classes, bf16, on a GPU."""
    cfg = dict(channels=(64, 128, 256, 512), blocks=(3, 4, 6, 3), image_size=112, num_classes=1000,
               batch_size=64, dtype="bfloat16")
    return conv_analytic_profile(cfg, device="cuda", flops_per_s=CONV_FLOPS_PER_S, name="resnet-like-example")


if __name__ == "__main__":
    for name, prof in (("gpt24.json", gpt24()), ("resnet_like.json", resnet_like())):
        (HERE / name).write_text(prof.model_dump_json(indent=1) + "\n")
