"""auto_checkpoint: a plan installed in the user's own model and loop (issue 21).

Each model is profiled once through its own forward and loss; plans at 30%, 50% and 70% of its
store-all activation peak are installed; the user's plain loop runs on fresh batches. Facts
checked: the measured peak (exact CPU accounting) is within the budget and within 2% of the
prediction, gradients are bitwise equal to the unmodified model's (dropout and BatchNorm
included), the loss curve over 20 AdamW steps is identical, and remove_checkpoint gives back the
store-all peak.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from memplan.executor.apply import (
    InstallError,
    auto_checkpoint,
    find_blocks,
    install_plan,
    installable,
    measure_step,
    profile_model,
    remove_checkpoint,
)
from memplan.executor.report import InfeasiblePlanError
from memplan.planner import STRATEGIES, plan
from torch import nn

from tests.grads import grads, same
from tests.hf_tiny import lm_batch, tiny_lm

FRACTIONS = (0.3, 0.5, 0.7)


class ResBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the input (a ResNet basic block without downsampling)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class ResNet(nn.Module):
    """Stem, a ModuleList of residual blocks, pooling and a classifier; returns logits."""

    def __init__(self, c: int = 8, n: int = 10, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.ModuleList(ResBlock(c) for _ in range(n))
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.fc(x.mean((2, 3)))


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.1)) for _ in range(8)],
                         nn.Linear(64, 10))


def _resnet():
    torch.manual_seed(0)
    return ResNet()


def _batches(kind: str, n: int):
    """`n` fresh batches of one shape for model `kind`, and its loss_fn (None: the model's)."""
    g = torch.Generator().manual_seed(11)
    if kind == "sequential":
        return [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g))
                for _ in range(n)], F.cross_entropy
    if kind == "resnet":
        return [(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 10, (4,), generator=g))
                for _ in range(n)], F.cross_entropy
    return [lm_batch(4, 32, seed=100 + k) for k in range(n)], None


def _model(kind: str):
    if kind == "sequential":
        return _mlp()
    if kind == "resnet":
        return _resnet()
    model = tiny_lm(kind, "sdpa", n_layer=6, width=64, dropout=0.1 if kind == "gpt2" else 0.0)
    model.config.use_cache = False
    return model


KINDS = ("gpt2", "llama", "qwen2", "resnet", "sequential")


@pytest.fixture(scope="module", params=KINDS)
def profiled(request):
    kind = request.param
    torch.set_num_threads(1)
    model = _model(kind).train()
    batches, loss_fn = _batches(kind, 1)
    prof = profile_model(model, batches[0], loss_fn=loss_fn, repeats=1, warmup=0)
    return kind, model, prof


@pytest.mark.parametrize("fraction", FRACTIONS)
def test_installed_plan_fits_is_predicted_and_changes_no_gradient(profiled, fraction):
    kind, model, prof = profiled
    batches, loss_fn = _batches(kind, 2)
    store = plan(prof, strategy="store-all").predicted.peak_bytes
    budget = int(fraction * store)
    unplanned = measure_step(model, batches[0], loss_fn=loss_fn, time_steps=0).measured_peak_bytes
    ref = copy.deepcopy(model)  # the unmodified model
    p = auto_checkpoint(model, batches[0], budget=budget, loss_fn=loss_fn, profile=prof)
    try:
        assert p.recomputed  # the plan recomputes something at these budgets
        assert p.predicted.peak_bytes <= budget
        for batch in batches:  # fresh batches of the profiled shape
            torch.manual_seed(7)
            m = measure_step(model, batch, loss_fn=loss_fn, time_steps=0)
            got = grads(model)
            torch.manual_seed(7)
            measure_step(ref, batch, loss_fn=loss_fn, time_steps=0)
            want = grads(ref)
            assert same(got, want), kind
            assert m.measured_peak_bytes <= budget, m.message
            assert abs(m.peak_error_pct) <= 2.0, m.message
        # buffers (BatchNorm statistics) updated once per step, as in the unmodified model
        for a, b in zip(model.buffers(), ref.buffers(), strict=True):
            assert torch.equal(a, b)
    finally:
        assert remove_checkpoint(model) is p
    m = measure_step(model, batches[0], loss_fn=loss_fn, time_steps=0)
    assert m.measured_peak_bytes == unplanned  # the model's own peak is back
    assert abs(unplanned - store) <= 0.035 * store  # and the store-all replay predicts it


def test_identical_loss_curves_over_20_steps(profiled):
    kind, model, prof = profiled
    batches, loss_fn = _batches(kind, 20)
    store = plan(prof, strategy="store-all").predicted.peak_bytes
    ref = copy.deepcopy(model)
    auto_checkpoint(model, batches[0], budget=int(0.3 * store), loss_fn=loss_fn, profile=prof)
    try:
        curves = []
        for m in (model, ref):
            torch.manual_seed(3)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
            curve = []
            for batch in batches:  # the user's plain loop
                opt.zero_grad()
                if loss_fn is None:
                    loss = m(**batch).loss
                else:
                    loss = loss_fn(m(batch[0]), batch[1])
                loss.backward()
                opt.step()
                curve.append(loss.item())
            curves.append(curve)
        assert curves[0] == curves[1]
        assert len(set(curves[0])) > 1
    finally:
        remove_checkpoint(model)
        remove_checkpoint(ref)


def test_remove_checkpoint_restores_the_model_exactly():
    model = _model("llama")
    batch = lm_batch(2, 8)
    hooks = lambda m: [(len(x._forward_hooks), len(x._forward_pre_hooks)) for x in m.modules()]  # noqa: E731
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = hooks(model)
    auto_checkpoint(model, batch, budget=None, max_overhead=0.5, repeats=1)
    assert hooks(model) != before
    remove_checkpoint(model)
    assert hooks(model) == before
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert remove_checkpoint(model) is None  # nothing installed any more


def test_every_strategy_makes_installable_plans(profiled):
    """Issue 21: the plans of every strategy (one-level and multi-level) can all be installed; the
    heuristic never recomputes the last stage (planner/heuristic.py). A schedule that does (`F L`
    then `R L` before the loss), which a model's forward cannot run, is refused with that reason."""
    from memplan.planner._build import one_level_ops

    kind, model, prof = profiled
    store = plan(prof, strategy="store-all").predicted.peak_bytes
    n = 0
    for strategy in STRATEGIES:
        for fraction in (0.2, 0.3, 0.5, 0.7, 1.0):
            p = plan(prof, strategy=strategy, budget_bytes=int(fraction * store))
            if not p.feasible:
                continue
            assert installable(p, prof.n_stages) is None, (strategy, fraction, p.schedule)
            n += 1
    assert n >= 10
    L = prof.n_stages
    tail = one_level_ops([(1, L - 1, False), (L, L, True)], L)
    reason = installable(tail, L)
    assert reason and "last stage" in reason


def test_a_plan_made_earlier_installs_and_another_models_is_refused():
    model = _model("llama")
    batches, _ = _batches("llama", 2)
    prof = profile_model(model, batches[0], repeats=1, warmup=0)
    p = plan(prof, budget_bytes=int(0.5 * plan(prof, strategy="store-all").predicted.peak_bytes))
    text = p.model_dump_json()  # as from the CLI, the API or another machine
    install_plan(model, text, batches[1])
    try:
        m = measure_step(model, batches[1], time_steps=0)
        assert abs(m.peak_error_pct) <= 2.0, m.message
    finally:
        remove_checkpoint(model)
    other = tiny_lm("llama", "sdpa", n_layer=6, width=32)
    with pytest.raises(InstallError, match="plan.profile_fingerprint"):
        install_plan(other, p, batches[0])
    with pytest.raises(InstallError, match="plan.profile_fingerprint"):
        install_plan(model, p, lm_batch(4, 16))  # another batch shape


def test_bad_input_is_refused_clearly():
    model = _model("llama")
    batch = lm_batch(2, 8)
    with pytest.raises(InstallError, match="blocks: the model has no submodule"):
        find_blocks(model, "model.nothing")
    with pytest.raises(InstallError, match="example_batch: with loss_fn give"):
        profile_model(_mlp(), torch.randn(2, 64), loss_fn=F.cross_entropy)
    with pytest.raises(InfeasiblePlanError, match="budget"):
        auto_checkpoint(model, batch, budget=16, repeats=1)
    with pytest.raises(ValueError, match="budget"):
        auto_checkpoint(model, batch, budget="-3", repeats=1)
    assert installable([("F", 1), ("R", 2), ("loss",), ("B", 2), ("R", 1), ("B", 1)], 2) is None
    assert "forward phase" in installable([("R", 1), ("F", 2), ("R", 2), ("loss",), ("B", 2), ("B", 1)], 2)
    assert "last stage" in installable([("R", 1), ("F", 2), ("loss",), ("B", 1)], 2)


def test_a_prefix_forwarded_without_a_record_keeps_its_side_values_as_predicted():
    # NOTE [ Measured in context ]: the rotary tables and positions a Llama prefix makes are held
    # for the blocks' recomputes from its first forward on, whatever the schedule; counted in
    # x_0, a schedule that starts with `F 1` is predicted to the byte (charged to the prefix's
    # record it was predicted 64 KiB low at these sizes)
    torch.set_num_threads(1)
    model = tiny_lm("llama", "sdpa", n_layer=4, width=128).train()
    model.config.use_cache = False
    batch = lm_batch(2, 64, seed=3)
    prof = profile_model(model, batch, repeats=1, warmup=0)
    call_bytes = prof.meta["apply"]["call_bytes"]
    rotary = 2 * 64 * (128 // model.config.num_attention_heads) * 4  # cos and sin, fp32
    assert prof.input_bytes >= call_bytes + rotary
    store = plan(prof, strategy="store-all").predicted.peak_bytes
    starts = set()
    for frac in (0.3, 0.35, 0.4, 0.5, 0.6):
        p = plan(prof, strategy="optimal", budget_bytes=int(frac * store))
        if not p.feasible:
            continue
        starts.add(p.ops()[0][0])
        install_plan(model, p, batch, profile=prof)
        try:
            m = measure_step(model, batch, time_steps=0)
        finally:
            remove_checkpoint(model)
        assert abs(m.measured_peak_bytes - p.predicted.peak_bytes) <= 64, (frac, p.ops(), m.message)
    assert starts == {"F", "R"}, starts  # both kinds of start were measured
