"""Tiny models for the profiler tests (milliseconds each)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

# one intra-op thread: on a shared 2-core machine, more threads make tiny ops 100x slower
torch.set_num_threads(1)

TINY_GPT = dict(n_layer=2, n_embd=32, n_head=4, block_size=16, vocab_size=64, batch_size=2)


@pytest.fixture
def tiny_gpt():
    from memplan.profiler.models.gpt import GPTConfig

    def make(**kw):
        return GPTConfig(**{**TINY_GPT, **kw})

    return make


def step_peak_bytes(stages, x0) -> int:
    """Peak bytes of one plain training step (forward, loss, backward) above the level before it,
    with parameter gradients allocated beforehand, plus the input (the chain model counts a_0)."""
    from memplan.profiler.memory import measure_memory

    params = {id(p): p for s in stages for p in s.parameters()}.values()
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    with measure_memory("cpu") as meter:
        x = x0
        for stage in stages:
            x = stage(x)
        x.backward()
        del x
    return meter.peak_bytes + x0.untyped_storage().nbytes()
