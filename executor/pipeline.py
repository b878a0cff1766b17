"""Profile, plan, run and compare a built-in model in one call (what `memplan run` and the demo do)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memplan.executor.report import (
    PEAK_TOLERANCE_PCT,
    ExecutorError,
    InfeasiblePlanError,
    RunReport,
)

__all__ = ["RunSpec", "run_builtin"]

log = logging.getLogger(__name__)

# A QAT run's peak on the CPU: torchao's fake quantizers replace their scale and zero point each
# forward, and the CPU accounting sees the new tensors but not the old ones (made before the
# measured step) freed: 5,120 bytes per `F` of a QAT block and 2,560 per `R`, to the step's end
# (docs/executor.md, "Results"), up to 3.4-4% of a tiny GPT's peak. The GPU's counters see both
# (within 0.24%), so only the CPU's judgement is widened.
QAT_CPU_PEAK_TOLERANCE_PCT = 5.0


@dataclass
class RunSpec:
    model: str = "gpt"  # "gpt" or "conv"
    n_layer: int = 6  # GPT blocks (conv: residual blocks per group)
    n_embd: int = 128  # GPT width
    n_head: int = 4  # GPT heads
    block_size: int = 64  # GPT sequence length
    vocab_size: int = 512  # GPT vocabulary
    batch_size: int = 8  # examples per step
    dropout: float = 0.1  # GPT dropout (exercises the RNG guard)
    budget_bytes: int | None = None  # activation budget; None: no limit
    strategy: str = "optimal"  # planner strategy
    features: Sequence[str] = field(default_factory=tuple)  # moe, flash, qat, prune, exit
    steps: int = 3  # training steps run and compared
    repeats: int = 3  # profiling repeats per stage
    autocast_dtype: str | None = None  # None, "bfloat16" or "float16"
    device: str = "cpu"  # "cpu" or "cuda[:i]": where the model is built, profiled and run
    # host-device bandwidth, bytes/s each way: the optimal plan may also move kept activations to
    # host memory (docs/chain-model.md section 10.9; CUDA only). None: no offload
    offload_bandwidth: float | None = None
    host_memory_bytes: int | None = None  # host memory offload may take, bytes; None: no limit


def _build(spec: RunSpec):
    from memplan.executor.features import model_options

    if spec.model == "gpt":
        from memplan.profiler.models.gpt import GPTConfig, build_gpt

        cfg = GPTConfig(n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head,
                        block_size=spec.block_size, vocab_size=spec.vocab_size,
                        batch_size=spec.batch_size, dropout=spec.dropout,
                        **model_options(spec.features, spec.n_layer))
        return build_gpt(cfg, device=spec.device)
    if spec.model == "conv":  # its features were checked for it (check_features in run_builtin)
        from memplan.profiler.models.conv import ConvConfig, build_conv

        return build_conv(ConvConfig(blocks=(spec.n_layer,) * 3, batch_size=spec.batch_size),
                          device=spec.device)
    raise ExecutorError(f"--model: unknown {spec.model!r}; use gpt or conv")


def _offload_options(spec: RunSpec) -> dict:
    """The planner options of `spec`'s offload fields (those given): the planner checks them and
    names the field (`options.offload_bandwidth`: a strategy other than optimal takes neither)."""
    return {name: value for name, value in (("offload_bandwidth", spec.offload_bandwidth),
                                            ("host_memory_bytes", spec.host_memory_bytes))
            if value is not None}


def _check_offload_device(plan, device: str) -> None:
    """Refuse, before the run, a plan with transfer ops on a device that is not CUDA (the runner
    would refuse it too: NOTE [ Offload in the executor ], 6); a plan that moves nothing runs
    anywhere. Raises `ExecutorError` naming --offload-bandwidth."""
    from memplan.executor.offload import RUN_CPU_REFUSAL, has_transfers

    if has_transfers(plan.ops()) and not str(device).startswith("cuda"):
        raise ExecutorError(RUN_CPU_REFUSAL)


def run_builtin(spec: RunSpec, *, progress: Callable[[str, int, int], None] | None = None
                ) -> tuple[RunReport, object, object]:
    """Build the model, apply features, profile (re-profile after pruning), plan and run.

    Returns (report, profile, plan). `progress(phase, done, total)` is called as work advances.
    Raises `ExecutorError` on bad input (a plan that offloads on a device other than CUDA among
    them), `InfeasiblePlanError` when nothing meets the budget, and the planner's `PlanError`
    naming its option (`options.offload_bandwidth` with a strategy other than optimal)."""
    import torch
    from memplan.executor.features import apply_features, check_features
    from memplan.executor.run import run_plan
    from memplan.profiler.measure import profile_chain

    from memplan import planner

    features = check_features(spec.features, spec.model)
    spec.features = features
    if spec.strategy not in planner.STRATEGIES:
        raise ExecutorError(f"--strategy: unknown {spec.strategy!r}; choose one of "
                            f"{', '.join(planner.STRATEGIES)}")
    dtype = {None: None, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(spec.autocast_dtype, "bad")
    if dtype == "bad":
        raise ExecutorError(f"--autocast: use bfloat16 or float16, got {spec.autocast_dtype!r}")
    if spec.device != "cpu" and not (spec.device.startswith("cuda") and torch.cuda.is_available()):
        raise ExecutorError(f"--device: {spec.device!r} is not available here; use cpu"
                            + (" or cuda" if torch.cuda.is_available() else ""))
    stages, x = _build(spec)
    extras: dict = {}
    prof_kw = dict(repeats=spec.repeats, warmup=1, name=spec.model, autocast_dtype=dtype,
                   device=spec.device)

    def prof_progress(done, total, what):
        if progress:
            progress("profile", done, total)

    if "prune" in features:  # plan the unpruned model too, to show what pruning changed
        before = profile_chain(stages, x, progress=prof_progress, **prof_kw)
        extras["before_prune_store_all_peak_bytes"] = planner.plan(before, strategy="store-all").predicted.peak_bytes
    notes, feat_extras = apply_features(stages, features)
    extras.update(feat_extras)
    prof = profile_chain(stages, x, progress=prof_progress, **prof_kw)
    plan = planner.plan(prof, budget_bytes=spec.budget_bytes, strategy=spec.strategy, **_offload_options(spec))
    if not plan.feasible:
        raise InfeasiblePlanError(f"--budget: {plan.message}")
    _check_offload_device(plan, spec.device)
    qat_cpu = "qat" in features and str(spec.device).startswith("cpu")
    if qat_cpu:
        notes.append(f"peak judged within {QAT_CPU_PEAK_TOLERANCE_PCT:g}%, not "
                     f"{PEAK_TOLERANCE_PCT:g}%: the CPU accounting counts QAT's replaced "
                     "fake-quantizer scales as allocations without their frees (docs/executor.md)")
    report = run_plan(stages, x, plan, profile=prof, steps=spec.steps, autocast_dtype=dtype,
                      features=features,
                      peak_tolerance_pct=QAT_CPU_PEAK_TOLERANCE_PCT if qat_cpu else PEAK_TOLERANCE_PCT,
                      on_step=(lambda d, t: progress("run", d, t)) if progress else None)
    if spec.model == "gpt":
        from memplan.profiler.models.gpt import gpt_report

        g = gpt_report(stages)
        extras["gpt"] = g
        used = {v["used"] for v in g["attention"].values()}
        if "flash" in features and used != {"flash"}:
            reasons = {v["fallback_reason"] for v in g["attention"].values() if v["fallback_reason"]}
            notes.append(f"flash requested, math path used: {'; '.join(sorted(reasons))}")
        elif used:
            notes.append(f"attention: {', '.join(sorted(used))}")
    report = report.model_copy(update={"notes": report.notes + notes, "extras": extras})
    return report, prof, plan
