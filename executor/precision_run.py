"""What a precision policy and a checkpoint storage cost in accuracy: gradient error against an fp32
reference, the divergence of the loss curve over many steps, and per-activation storage
sensitivities for the planner (planner/checkpoint_dtype.py).

NOTE [ The error metrics ]
`max_rel`: per parameter tensor max|g - g_ref| / max|g_ref|, the largest over tensors (the
executor's `grad_max_rel_diff`, and the metric the planner's `tolerance` bounds). `norm_rel`:
||g - g_ref||_2 / ||g_ref||_2 over all parameters together. Both over one step's gradients, taken
before any optimizer step, so two runs see the same weights. Loss curves: both runs train (AdamW,
the executor's settings) from the same initial weights on the same batch; the divergence is
|loss - loss_ref| / |loss_ref| per step.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from memplan.executor.report import ExecutorError
from memplan.executor.run import make_optimizer, optimizer_step
from memplan.executor.runner import ScheduleRunner
from memplan.planner.schema import Plan
from torch import nn

__all__ = [
    "POLICY_SETUP",
    "policy_autocast",
    "GradError",
    "grad_error",
    "plan_grads",
    "reference_grads",
    "measure_sensitivity",
    "with_sensitivity",
    "LossCurve",
    "train_curve",
    "fp32_curve",
]

log = logging.getLogger(__name__)

# policy -> (parameter dtype, autocast dtype or None); planner/precision.py has their bytes
POLICY_SETUP: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "fp32": (torch.float32, None),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "fp16-mixed": (torch.float32, torch.float16),
    "bf16": (torch.bfloat16, None),
}


def policy_autocast(policy: str) -> tuple[torch.dtype, torch.dtype | None]:
    """(parameter dtype, autocast dtype) of a policy; raises ExecutorError naming the known ones."""
    if policy not in POLICY_SETUP:
        raise ExecutorError(f"precision: unknown policy {policy!r}; choose one of {', '.join(POLICY_SETUP)}")
    return POLICY_SETUP[policy]


def _params(stages: Sequence[nn.Module]) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for s in stages:
        for p in s.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


@dataclass(frozen=True)
class GradError:
    """Relative gradient error (NOTE [ The error metrics ]); 0.0 and `bitwise` when equal."""

    max_rel: float
    norm_rel: float
    bitwise: bool


def grad_error(grads: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> GradError:
    """Error of `grads` against `ref` (same order and shapes), computed in float64."""
    if len(grads) != len(ref):
        raise ExecutorError(f"grads: {len(grads)} tensors against {len(ref)} in the reference")
    max_rel, num, den, bitwise = 0.0, 0.0, 0.0, True
    for g, r in zip(grads, ref, strict=True):
        g64, r64 = g.detach().double(), r.detach().double()
        if not bool(torch.isfinite(g64).all()):
            raise ExecutorError("gradients: non-finite values (the step overflowed); not comparable")
        diff = (g64 - r64).abs()
        bitwise = bitwise and bool(torch.equal(g.detach().to(r.dtype), r.detach()))
        scale = float(r64.abs().max()) if r64.numel() else 0.0
        if scale > 0:
            max_rel = max(max_rel, float(diff.max()) / scale)
        elif diff.numel() and float(diff.max()) > 0:
            max_rel = math.inf
        num += float((diff**2).sum())
        den += float((r64**2).sum())
    norm_rel = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)
    return GradError(max_rel=max_rel, norm_rel=norm_rel, bitwise=bitwise)


def plan_grads(
    stages: Sequence[nn.Module],
    example_input: Any,
    ops: Sequence,
    *,
    autocast_dtype: torch.dtype | None = None,
    storage: dict[int, str] | None = None,
    loss_scale: float | None = None,
) -> tuple[float, list[torch.Tensor]]:
    """One step of the schedule `ops` (storage map optional): (loss, the parameter gradients,
    unscaled, as fp32 copies). Leaves `.grad` as it found it (None or zero)."""
    params = _params(stages)
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    device = params[0].device if params else torch.device("cpu")
    runner = ScheduleRunner(stages, ops, device=device, autocast_dtype=autocast_dtype, storage=storage)
    runner.prepare()
    loss = float(runner.step(example_input, loss_scale=loss_scale))
    inv = 1.0 / loss_scale if loss_scale else 1.0
    grads = [(p.grad.float() * inv) if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
             for p in params]
    for p, g in zip(params, saved, strict=True):
        p.grad = g
    return loss, grads


def reference_grads(stages: Sequence[nn.Module], example_input: Any) -> tuple[float, list[torch.Tensor]]:
    """The fp32 reference: a float32 copy of the stages, one plain forward and backward."""
    ref = [s.float() for s in copy.deepcopy(list(stages))]  # one copy: shared state stays shared
    x = example_input
    for s in ref:
        x = s(x)
    x.backward()
    return float(x.detach()), [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                               for p in _params(ref)]


def measure_sensitivity(
    stages: Sequence[nn.Module],
    example_input: Any,
    *,
    autocast_dtype: torch.dtype | None = None,
    dtypes: Sequence[str] = ("bfloat16", "float8_e4m3fn"),
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, list[float | None]]:
    """Per storage dtype, per stage i in 1..L-1: the relative gradient error (`max_rel`) of storing
    a_i alone in that dtype, in the plan that recomputes everything after a_i from it (the longest
    segment a checkpoint at i can start, so the largest perturbation of the records). None where
    a_i cannot be stored (not a single floating tensor). Put it in a profile with `with_sensitivity`."""
    from memplan.executor.features.storage import supported
    from memplan.planner._build import one_level_ops

    L = len(stages)
    out: dict[str, list[float | None]] = {d: [None] * (L - 1) for d in dtypes}
    usable = [d for d in dtypes if supported(d)]
    for d in set(dtypes) - set(usable):
        log.warning("storage dtype %s is not supported by this torch build; not measured", d)
    total, done = (L - 1) * len(usable), 0
    for i in range(1, L):
        ops = one_level_ops([(1, i, True), (i + 1, L, True)], L)
        _, ref = plan_grads(stages, example_input, ops, autocast_dtype=autocast_dtype)
        for d in usable:
            try:
                _, got = plan_grads(stages, example_input, ops, autocast_dtype=autocast_dtype,
                                    storage={i: d})
            except ExecutorError:
                continue  # not storable: stays None
            out[d][i - 1] = grad_error(got, ref).max_rel
            done += 1
            if progress is not None:
                progress(done, total)
    return out


def with_sensitivity(profile, sensitivity: dict[str, list[float | None]]):
    """`profile` with `meta["storage_sensitivity"]` set (what planner.checkpoint_dtype reads)."""
    return profile.model_copy(update={"meta": {**profile.meta, "storage_sensitivity": sensitivity}})


@dataclass
class LossCurve:
    """Losses of `steps` training steps under a policy and plan, against the fp32 reference."""

    losses: list[float]
    reference: list[float]
    seconds: list[float] = field(default_factory=list)  # schedule seconds per step

    @property
    def divergence(self) -> list[float]:
        """|loss - loss_ref| / |loss_ref| per step."""
        return [abs(a - b) / abs(b) if b else abs(a - b) for a, b in zip(self.losses, self.reference, strict=True)]

    @property
    def final_rel(self) -> float:
        """(final loss - final fp32 loss) / final fp32 loss (signed)."""
        a, b = self.losses[-1], self.reference[-1]
        return (a - b) / abs(b) if b else a - b


def _adamw(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return make_optimizer(params, "adamw")


def train_curve(
    build: Callable[[torch.dtype], tuple[list[nn.Module], Any]],
    plan: Plan,
    *,
    policy: str,
    steps: int,
    reference: list[float] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> LossCurve:
    """Train `steps` steps of `build(param_dtype)`'s model (stages, batch) by `plan` under
    `policy`, and (unless `reference` losses are given) an fp32 unplanned copy from the same
    initial weights. fp16-mixed uses a GradScaler (init scale 2^10)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ExecutorError(f"steps: expected an integer of at least 1, got {steps!r}")
    if plan.stage_policies:  # its recompute lists live in the profile, which is not given here
        raise ExecutorError("plan.stage_policies: a loss curve runs whole-stage plans; plan a "
                            "profile without save policies (or use run_plan with its profile)")
    param_dtype, ac = policy_autocast(policy)
    stages, x = build(param_dtype)
    params = _params(stages)
    for p in params:
        p.grad = torch.zeros_like(p)
    device = params[0].device if params else torch.device("cpu")
    opt = _adamw(params)
    scaler = None
    if ac is torch.float16:
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
        scaler.scale(torch.ones((), device=device))
    runner = ScheduleRunner(stages, plan.ops(), device=device, autocast_dtype=ac,
                            storage=plan.checkpoint_dtypes)
    losses, seconds = [], []
    for step in range(1, steps + 1):
        for p in params:
            p.grad.zero_()
        runner.prepare()
        t0 = time.perf_counter()
        loss = float(runner.step(x, loss_scale=float(scaler.get_scale()) if scaler else None))
        seconds.append(time.perf_counter() - t0)
        if not math.isfinite(loss):
            raise ExecutorError(f"step {step}: the loss is {loss} under {policy}; the run diverged")
        losses.append(loss)
        optimizer_step(opt, scaler)  # (GradScaler.step unscales first, as unscale_ did here)
        if on_step is not None:
            on_step(step, steps)
    if reference is None:
        reference = fp32_curve(build, steps)
    return LossCurve(losses=losses, reference=list(reference[:steps]), seconds=seconds)


def fp32_curve(build: Callable[[torch.dtype], tuple[list[nn.Module], Any]], steps: int) -> list[float]:
    """Losses of the unplanned fp32 run of `build(torch.float32)` for `steps` AdamW steps."""
    stages, x = build(torch.float32)
    params = _params(stages)
    opt = _adamw(params)
    out = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        y = x
        for s in stages:
            y = s(y)
        y.backward()
        out.append(float(y.detach()))
        opt.step()
    return out
