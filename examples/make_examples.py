"""Write the example profiles: a 24-layer GPT-like decoder and a ResNet-like chain whose
activations shrink with depth. Sizes come from shapes (bf16, Korthikanti et al. 2022 per-layer
saved bytes s*b*h*(34 + 5*a*s/h)); times from FLOPs at a stated throughput. Run:
    python examples/make_examples.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOPS_PER_S = 300e12  # a stated utilisation of a modern GPU in bf16


def gpt24() -> dict:
    b, s, h, a, layers, vocab = 8, 1024, 1024, 16, 24, 50304
    act = 2 * b * s * h  # one bf16 hidden state
    block_flops = 2 * b * s * (12 * h * h) + 2 * b * a * s * s * (h // a) * 2
    stages = [{
        "name": "embed", "kind": "embed", "forward_s": 2 * act / 2e12, "backward_s": 4 * act / 2e12,
        "output_bytes": act, "saved_bytes": 0, "param_bytes": 2 * vocab * h,
    }]
    for i in range(layers):
        stages.append({
            "name": f"block.{i}", "kind": "block",
            "forward_s": block_flops / FLOPS_PER_S, "backward_s": 2 * block_flops / FLOPS_PER_S,
            "output_bytes": act, "saved_bytes": b * s * h * (34 + 5 * a * s // h) - act,
            "forward_temp_bytes": 2 * b * a * s * s, "backward_temp_bytes": 4 * b * a * s * s,
            "param_bytes": 2 * 12 * h * h, "flops": block_flops,
        })
    head_flops = 2 * b * s * h * vocab
    stages.append({
        "name": "head", "kind": "head", "forward_s": head_flops / FLOPS_PER_S,
        "backward_s": 2 * head_flops / FLOPS_PER_S, "output_bytes": 4,
        "saved_bytes": 2 * b * s * vocab + 4 * b * s * vocab, "forward_temp_bytes": 4 * b * s * vocab,
        "backward_temp_bytes": 4 * b * s * vocab, "param_bytes": 2 * h, "flops": head_flops,
    })
    params = 12 * h * h * layers + vocab * h
    return {"name": "gpt24-example", "device": "cuda", "dtype": "bfloat16",
            "input_bytes": 8 * b * s, "fixed_bytes": 16 * params, "layers": stages,
            "meta": {"source": "examples/make_examples.py (analytic, illustrative)"}}


def resnet_like() -> dict:
    b = 64
    stages, c, hw = [], 64, 112
    for stage, blocks in enumerate((3, 4, 6, 3)):
        for k in range(blocks):
            act = 2 * b * c * hw * hw
            flops = 2 * b * hw * hw * 9 * c * c * 2
            stages.append({
                "name": f"layer{stage + 1}.{k}", "kind": "block",
                "forward_s": flops / 150e12, "backward_s": 2 * flops / 150e12,
                "output_bytes": act, "saved_bytes": 5 * act, "forward_temp_bytes": act,
                "backward_temp_bytes": 2 * act, "param_bytes": 2 * 18 * c * c, "flops": flops,
            })
        c, hw = c * 2, hw // 2
    stages.append({"name": "head", "kind": "head", "forward_s": 1e-4, "backward_s": 2e-4,
                   "output_bytes": 4, "saved_bytes": 2 * b * c, "param_bytes": 2 * c * 1000})
    return {"name": "resnet-like-example", "device": "cuda", "dtype": "bfloat16",
            "input_bytes": 2 * b * 3 * 224 * 224, "fixed_bytes": 16 * 25_000_000, "layers": stages,
            "meta": {"source": "examples/make_examples.py (analytic, illustrative)"}}


if __name__ == "__main__":
    for name, prof in (("gpt24.json", gpt24()), ("resnet_like.json", resnet_like())):
        (HERE / name).write_text(json.dumps(prof, indent=1) + "\n")
