"""A torchvision-style ResNet cut with `cut_blocks` (issue 19, item 5): its measured peak was 8.3%
and 2.9% off the prediction while RunReport.status said ok.

The cause: the runner passed d_i to torch.autograd.backward, whose arguments pin it for the whole
`B i`; the profiler measures a block's backward with d_i held by autograd only (freed once its
last reader ran). A GPT block reads d_i until its end (the residual), a ResNet block's final ReLU
hands a new gradient to its convolutions and is done with d_i, so every B i ran x_i above the
replay (NOTE [ d_i held by autograd only ] in executor/runner.py). Now exact to the byte, and a
peak beyond the stated tolerance is a mismatch.

torchvision is not installed here: its wheels for torch 2.13 are CUDA builds whose operators do
not load beside the CPU torch (`operator torchvision::nms does not exist`), so the model is
ResNet-18's layout written out: stem (7x7 conv, BatchNorm, inplace ReLU, max pool), BasicBlocks
(3x3 convs, BatchNorm, inplace ReLU, 1x1 downsample), head (average pool, flatten, linear)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memplan.executor import run_plan
from memplan.executor.report import PEAK_TOLERANCE_PCT
from memplan.profiler.cut import cut_blocks
from memplan.profiler.measure import profile_chain
from torch import nn

from memplan import planner


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock's layers and forward."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


def resnet18_chain(width=8, image=32, batch=4, classes=10):
    """ResNet-18's layout (2 BasicBlocks per group, 4 groups) at `width`, cut into stem, the 8
    blocks and head + cross-entropy."""
    torch.manual_seed(0)
    stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                         nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
    blocks, cin = [], width
    for g in range(4):
        cout = width * 2**g
        for j in range(2):
            blocks.append(BasicBlock(cin, cout, 2 if g > 0 and j == 0 else 1))
            cin = cout
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))
    x = torch.randn(batch, 3, image, image)
    y = torch.randint(0, classes, (batch,))
    return cut_blocks(stem, blocks, head, loss_fn=F.cross_entropy, targets=y), x


@pytest.mark.parametrize("shape", [dict(width=8, image=32, batch=4),
                                   pytest.param(dict(width=16, image=64, batch=2),
                                                marks=pytest.mark.slow)])
def test_resnet_peak_exact_every_strategy(shape):
    stages, x = resnet18_chain(**shape)
    prof = profile_chain(stages, x, repeats=1, warmup=0, timing="stage")
    plans = [planner.plan(prof, strategy=s) for s in ("store-all", "sqrt", "uniform")]
    plans.append(planner.plan(prof, budget_bytes=plans[1].predicted.peak_bytes))  # optimal
    for plan in plans:
        assert plan.feasible
        r = run_plan(stages, x, plan, profile=prof, steps=2)
        assert r.status == "ok", (plan.strategy, r.message)
        # to the byte, less the profiler's 4-byte seed scalar (its backward_temp_bytes counts
        # the scalar gradient of its Seed; no B op of a run allocates one). Before the fix
        # every B i ran x_i above the replay: 1,020 bytes over here, 8,188 at width 16
        assert 0 <= r.predicted_peak_bytes - r.measured_peak_bytes <= 4, plan.strategy
        assert r.grad_max_rel_diff <= 1e-6 and r.buffer_max_abs_diff == 0.0


def test_a_peak_beyond_the_tolerance_is_a_mismatch():
    stages, x = resnet18_chain()
    prof = profile_chain(stages, x, repeats=1, warmup=0, timing="stage")
    plan = planner.plan(prof, strategy="store-all")
    ok = run_plan(stages, x, plan, profile=prof, steps=1)
    assert ok.status == "ok" and ok.peak_tolerance_pct == PEAK_TOLERANCE_PCT
    # a profile that under-states one block's record by 5% of the peak: the prediction is off
    # (the fingerprint ignores saved bytes, so the run goes ahead), gradients still equal
    layers = list(prof.layers)
    layers[5] = layers[5].model_copy(
        update={"saved_bytes": layers[5].saved_bytes + ok.measured_peak_bytes // 20})
    wrong = prof.model_copy(update={"layers": layers})
    bad_plan = planner.plan(wrong, strategy="store-all")
    bad = run_plan(stages, x, bad_plan, profile=wrong, steps=1)
    assert bad.grad_max_rel_diff <= 1e-6
    assert abs(bad.peak_error_pct) > PEAK_TOLERANCE_PCT
    assert bad.status == "mismatch"
    assert bad.message.startswith(f"peak {bad.measured_peak_bytes} B measured, "
                                  f"{bad.predicted_peak_bytes} B predicted")
    unjudged = run_plan(stages, x, bad_plan, profile=wrong, steps=1, peak_tolerance_pct=None)
    assert unjudged.status == "ok"
