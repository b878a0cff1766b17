"""The analytic profile under a mixed policy equals the measured one under autocast, stage by
stage (NOTE [ Autocast's saved tensors ] in profiler/analytic.py)."""

from __future__ import annotations

import pytest
from memplan.planner.precision import profile_policy
from memplan.profiler.analytic import gpt_analytic_profile
from memplan.profiler.measure import profile_chain
from memplan.profiler.models import build_model

SHAPES = [
    dict(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4),
    # tied embedding, a feed-forward width of its own, odd sizes
    dict(n_layer=2, n_embd=48, n_head=3, block_size=8, vocab_size=40, batch_size=3,
         tie_weights=True, ffn_hidden=80),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("policy", "autocast"), [("bf16-mixed", "bfloat16"),
                                                  ("fp16-mixed", "float16")])
def test_measured_under_autocast_equals_analytic(shape, policy, autocast):
    cfg = dict(shape, dropout=0.0, attention="flash")
    stages, x = build_model("gpt", **cfg)
    measured = profile_chain(stages, x, repeats=1, warmup=0, timing="stage",
                             autocast_dtype=autocast)
    analytic = gpt_analytic_profile(cfg, precision=policy)
    for m, a in zip(measured.layers, analytic.layers, strict=True):
        assert (m.output_bytes, m.saved_bytes, m.param_bytes) == \
            (a.output_bytes, a.saved_bytes, a.param_bytes), m.name
    assert measured.fixed_bytes == analytic.fixed_bytes
    assert measured.input_bytes == analytic.input_bytes
    assert measured.dtype == analytic.dtype == autocast
    assert profile_policy(measured) == profile_policy(analytic) == policy
