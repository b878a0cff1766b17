"""Each trap of recomputation corrupts training when its guard is off, and is closed when it is on."""

from __future__ import annotations

import pytest
import torch
from memplan.executor import run_plan
from memplan.executor.guards import GUARDS
from torch import nn

from memplan import planner
from tests.executor.models import measured_profile, mlp_chain


def _uniform(stages, x, k=2):
    prof = measured_profile(stages, x, repeats=1)
    return prof, planner.plan(prof, strategy="uniform", k=k)


def _without(name):
    return tuple(g for g in GUARDS if g != name)


def test_dropout_masks_need_the_rng_guard():
    stages, x = mlp_chain(4, width=32, batch=16, dropout=0.5, batchnorm=False)
    prof, plan = _uniform(stages, x)
    assert run_plan(stages, x, plan, profile=prof, steps=1).grad_max_abs_diff == 0.0
    stages, x = mlp_chain(4, width=32, batch=16, dropout=0.5, batchnorm=False)
    bad = run_plan(stages, x, plan, profile=prof, steps=1, guards=_without("rng"))
    assert bad.status == "mismatch" and bad.grad_max_rel_diff > 1e-3


def test_batchnorm_statistics_updated_once_per_step():
    stages, x = mlp_chain(4, width=32, batch=16, dropout=0.0, batchnorm=True)
    prof, plan = _uniform(stages, x)
    good = run_plan(stages, x, plan, profile=prof, steps=3)
    assert good.buffer_max_abs_diff == 0.0 and good.status == "ok"
    assert int(stages[0].bn.num_batches_tracked) == 3
    stages, x = mlp_chain(4, width=32, batch=16, dropout=0.0, batchnorm=True)
    bad = run_plan(stages, x, plan, profile=prof, steps=3, guards=_without("buffers"))
    assert bad.status == "mismatch" and bad.buffer_max_abs_diff > 0
    assert int(stages[0].bn.num_batches_tracked) == 6  # counted twice without the guard


class _Observed(nn.Module):
    """A Linear whose input passes a torch.ao fake-quantizer with a moving-average observer."""

    def __init__(self, width):
        super().__init__()
        from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver

        self.fq = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                               averaging_constant=0.5)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(self.fq(x))


def _observed_chain():
    stages, x = mlp_chain(3, width=32, batch=16, dropout=0.0, batchnorm=False)
    torch.manual_seed(1)
    return [stages[0], _Observed(32), _Observed(32), stages[1], stages[-1]], x


def test_quantization_observers_see_each_batch_once():
    stages, x = _observed_chain()
    prof, plan = _uniform(stages, x, k=3)
    assert plan.recomputed  # the observed stages are recomputed
    good = run_plan(stages, x, plan, profile=prof, steps=3)
    assert good.status == "ok" and good.buffer_max_abs_diff == 0.0 and good.grad_max_abs_diff == 0.0
    stages, x = _observed_chain()
    bad = run_plan(stages, x, plan, profile=prof, steps=3, guards=_without("buffers"))
    assert bad.status == "mismatch"


def test_forward_hooks_that_count_are_not_counted_twice():
    def run(guards):
        stages, x = mlp_chain(4, width=32, batch=16, batchnorm=False)
        calls = []
        for s in stages:
            s.register_forward_hook(lambda m, i, o: calls.append(m) if not isinstance(m, list) else None)
        prof, plan = _uniform(stages, x)
        calls.clear()
        r = run_plan(stages, x, plan, profile=prof, steps=1, compare=False, guards=guards)
        return sum(1 for m in calls if any(m is s for s in stages)), len(stages), r

    n, L, r = run(GUARDS)
    assert n == L and r.forward_counts.count(2) >= 2
    n_bad, L, _ = run(_without("hooks"))
    assert n_bad > L


def test_a_hook_that_replaces_the_output_still_runs_in_recomputes():
    stages, x = mlp_chain(4, width=32, batch=16, batchnorm=False)
    stages[1].register_forward_hook(lambda m, i, o: o * 0.5)
    prof, plan = _uniform(stages, x)
    assert run_plan(stages, x, plan, profile=prof, steps=1).grad_max_abs_diff == 0.0


class _Router(nn.Module):
    """Picks one of two experts per row; the choice flips on every call unless replayed (a stand-in
    for near ties and capacity drops that change between the forward and the recompute)."""

    def __init__(self, width):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(width, width), nn.Linear(width, width)])
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        from memplan.profiler.models.decisions import decide

        def route():
            self.calls += 1
            return (torch.arange(x.shape[0]) + self.calls) % 2 == 0

        pick = decide("route", route)
        return x + torch.where(pick[:, None], self.experts[0](x), self.experts[1](x))


def test_routing_decisions_are_replayed_in_recomputes():
    pytest.importorskip("memplan.profiler.models.decisions")

    def chain():
        stages, x = mlp_chain(3, width=32, batch=16, dropout=0.0, batchnorm=False)
        torch.manual_seed(2)
        return [stages[0], _Router(32), stages[1], stages[-1]], x

    stages, x = chain()
    prof, plan = _uniform(stages, x, k=2)
    assert plan.recomputed and 2 in plan.recomputed
    good = run_plan(stages, x, plan, profile=prof, steps=2, guards=_without("buffers"))
    assert good.grad_max_abs_diff == 0.0
    stages, x = chain()
    bad = run_plan(stages, x, plan, profile=prof, steps=2, guards=("rng", "hooks"))
    assert bad.status == "mismatch"
