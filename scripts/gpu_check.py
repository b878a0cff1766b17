#!/usr/bin/env python
"""Every GPU measurement memplan makes, in one run: profile accuracy, predicted against measured
peak memory (`torch.cuda.max_memory_allocated`) and step time, and gradients against the
unplanned step. Prints short tables and writes JSON.

    python scripts/gpu_check.py                       # on a CUDA machine, about 2 minutes
    python scripts/gpu_check.py --device cpu --tiny   # the same logic on tiny configs, anywhere

Sections (`--sections`, comma-separated; default all):
- rng: a kept CUDA generator state restored twice must give the same draws both times (the
  executor's RNG guard restores a stage's state once per recompute).
- models: GPT-2 small (B 8 and 32) and medium (B 4 and 16), T 1024, bf16, flash. Per model: the
  measured profile against the analytic one (bytes per stage, FLOPs, fixed bytes), a plain
  training step's peak and time against the store-all replay, then store-all, sqrt, optimal at
  sqrt's peak and optimal at 75% of the store-all peak, each run with `memplan.executor.run_plan`
  (targets: peak within 2%, time within 10%; overhead measured against store-all measured in the
  same run; gradients against the unplanned step, per step).
- policies: GPT-2 small (B 32) and medium (B 16) profiled with save policies; at 30%, 45% and
  60% of the store-all peak the optimal plan with policies and the whole-block one, both run
  (measured against predicted; the policy plan's measured time over the whole-block one's).
- offload: the host-device bandwidth (pinned copies each way, `measure_host_bandwidth`); GPT-2
  medium (B 16) in bf16 planned by optimal with and without that `offload_bandwidth` at 15% to
  65% of the store-all peak (predicted time of both, a table); at the budget where offload
  saves the most predicted time, the offload plan and the recompute-only plan are run by the
  schedule runner: peak (`max_memory_allocated`) and step time against the prediction, and
  gradients against the unplanned step. Skipped with the reason where no plan moves anything
  (or the planner takes no offload_bandwidth); on the CPU the plans are made with a stand-in
  bandwidth and the run is the refusal (a logic check).
- features: a small GPT with dropout 0.1, every feature alone and together (moe, flash, qat,
  prune, exit) under every strategy at 60% of the store-all peak and optimal at 30%, fp32; then
  bf16 autocast and fp16 with a gradient scaler: gradients, buffers and parameters against the
  unplanned run.
- peers: Hugging Face GPT-2 small (B 8) and medium (B 4), T 1024, in `--dtype` with sdpa
  attention (flash on CUDA), against the checkpointing a user can already reach for, each in the
  user's plain step: HF gradient checkpointing, `checkpoint_sequential`, torchtitan's every-2nd-layer
  and op-level selective checkpointing, `torch.compile` with activation memory budgets 0.5 and 0.2;
  then memplan's installed plans (whole blocks, save policies, save policies on compiled blocks
  with the min-cut policies) at each peer's measured peak (benchmarks/bench_peers.py's
  `run_family`, interleaved rounds): peaks by `max_memory_allocated`, step times as ratios to the
  unplanned step, gradients against it. On the CPU logic check the compiled contenders are left
  out (minutes of inductor compiling for a tiny model).
`--deterministic` runs with `torch.use_deterministic_algorithms(True, warn_only=True)` (set
CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment, as cuBLAS asks).

Needs torch and pydantic (numba for the optimal planner's compiled kernel, else its pure-Python
DP); torchao and torch-pruning for the qat and prune features. The JSON goes to --out, else
$OUT/gpu_check.json when $OUT is set, else ./gpu_check.json; it is rewritten after every record,
so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from memplan.executor.features import apply_features, model_options  # noqa: E402
from memplan.executor.run import run_plan  # noqa: E402
from memplan.profiler.analytic import gpt_analytic_profile  # noqa: E402
from memplan.profiler.bandwidth import measure_host_bandwidth  # noqa: E402
from memplan.profiler.measure import profile_chain  # noqa: E402
from memplan.profiler.memory import measure_memory  # noqa: E402
from memplan.profiler.models.gpt import GPT2_SIZES, GPTConfig, build_gpt, gpt_report  # noqa: E402

from memplan import planner  # noqa: E402

log = logging.getLogger("gpu_check")

# the batches of the first check (8, 4) leave an H200 waiting on the CPU part of the step; four
# times them keep it busy (docs/profiler.md, GPU check)
MODELS = {
    "gpt2": dict(GPT2_SIZES["gpt2"], block_size=1024, batch_size=8),
    "gpt2-medium": dict(GPT2_SIZES["gpt2-medium"], block_size=1024, batch_size=4),
    "gpt2-b32": dict(GPT2_SIZES["gpt2"], block_size=1024, batch_size=32),
    "gpt2-medium-b16": dict(GPT2_SIZES["gpt2-medium"], block_size=1024, batch_size=16),
}
TINY_MODELS = {
    "tiny-a": dict(n_layer=4, n_head=2, n_embd=32, block_size=16, vocab_size=64, batch_size=2),
    "tiny-b": dict(n_layer=6, n_head=4, n_embd=64, block_size=32, vocab_size=128, batch_size=2),
}
FEATURE_MODEL = dict(n_layer=6, n_embd=256, n_head=4, block_size=256, vocab_size=512, batch_size=8)
TINY_FEATURE_MODEL = dict(n_layer=4, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4)
FEATURE_SETS = [(), ("moe",), ("flash",), ("qat",), ("prune",), ("exit",),
                ("moe", "flash", "qat", "exit"), ("prune", "flash", "qat", "exit")]
# (strategy, budget as a fraction of the store-all peak): the last forces multi-level recomputes
FEATURE_PLANS = [("store-all", 0.6), ("uniform", 0.6), ("sqrt", 0.6), ("heuristic", 0.6),
                 ("optimal", 0.6), ("optimal", 0.3)]
ANALYTIC_FIELDS = ("output_bytes", "saved_bytes", "param_bytes", "flops")
OFFLOAD_MODEL = ("gpt2-medium-b16", MODELS["gpt2-medium-b16"])
TINY_OFFLOAD_MODEL = ("tiny-b", TINY_MODELS["tiny-b"])
OFFLOAD_FRACTIONS = (0.15, 0.25, 0.35, 0.45, 0.55, 0.65)
# the peers section: Hugging Face GPT-2 shapes (bench_peers.py's `build`: heads = width / 64)
PEER_MODELS = {
    "hf-gpt2": dict(layers=12, width=768, seq=1024, batch=8, vocab=50257),
    "hf-gpt2-medium": dict(layers=24, width=1024, seq=1024, batch=4, vocab=50257),
}
TINY_PEER_MODELS = {"hf-tiny": dict(layers=2, width=64, seq=32, batch=2, vocab=256)}
CPU_STAND_IN_BANDWIDTH = 1e9  # bytes/s: plans on the CPU (no bandwidth to measure) for the logic


class _Results:
    """Records by section, written to JSON after each one."""

    def __init__(self, path: Path, info: dict) -> None:
        self.path, self.data = path, {**info, "sections": {}}
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, section: str, record: dict) -> None:
        self.data["sections"].setdefault(section, []).append(record)
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _pct(measured: float, predicted: float) -> float:
    """(measured - predicted) / measured, in percent."""
    return 100.0 * (measured - predicted) / measured if measured else float("nan")


# ---------------------------------------------------------------------------------------------
# rng: restoring a kept generator state twice (the executor's RNG guard, a stage forwarded three
# times in a step)


def section_rng(dev: torch.device, res: _Results) -> None:
    """Draw after restoring a kept state, twice: handing the kept state itself to
    `graphsafe_set_state` (which shares it, so the first draw moves it) against handing a copy."""
    if dev.type != "cuda":
        return
    gen = torch.cuda.default_generators[dev.index if dev.index is not None else torch.cuda.current_device()]
    for label, handed in (("kept state itself", lambda s: s), ("a copy", lambda s: s.clone_state())):
        kept = gen.clone_state()
        draws = []
        for _ in range(2):
            gen.graphsafe_set_state(handed(kept))
            draws.append(torch.rand(1024, device=dev))
        res.add("rng", {"handed": label, "second_draw_equals_first": bool(torch.equal(*draws))})


# ---------------------------------------------------------------------------------------------
# models: GPT-2 sizes


def _analytic_check(prof, cfg: GPTConfig, dev: torch.device) -> dict:
    """Per field, how many stages' measured values equal the analytic profile's, and the worst
    relative difference (analytic - measured) / measured."""
    ana = gpt_analytic_profile(cfg, device=dev.type)
    out: dict = {"input_bytes": [prof.input_bytes, ana.input_bytes],
                 "fixed_bytes": [prof.fixed_bytes, ana.fixed_bytes]}
    for fld in ANALYTIC_FIELDS:
        pairs = [(getattr(m, fld), getattr(a, fld)) for m, a in zip(prof.layers, ana.layers, strict=True)]
        worst = max(pairs, key=lambda p: abs(p[1] - p[0]) / p[0] if p[0] else abs(p[1]))
        out[fld] = {"equal": sum(m == a for m, a in pairs), "of": len(pairs),
                    "worst_measured": worst[0], "worst_analytic": worst[1]}
    return out


def _plain_step(stages, x0, dev: torch.device, repeats: int = 5) -> tuple[int, float]:
    """Peak bytes (above the level before it, a_0 counted) and median seconds of a plain training
    step: the stages' forward then one backward, gradients allocated beforehand."""
    for s in stages:
        for p in s.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    times = []
    for _ in range(repeats + 1):
        _sync(dev)
        t0 = time.perf_counter()
        x = x0
        for s in stages:
            x = s(x)
        x.backward()
        del x
        _sync(dev)
        times.append(time.perf_counter() - t0)
    with measure_memory(dev) as meter:
        x = x0
        for s in stages:
            x = s(x)
        x.backward()
        del x
    for s in stages:
        for p in s.parameters():
            p.grad.zero_()
    return meter.peak_bytes + x0.untyped_storage().nbytes(), statistics.median(times[1:])


def _run_record(name: str, label: str, plan, rep, store_measured_s: float | None) -> dict:
    pred = plan.predicted
    return {
        "model": name, "plan": label, "strategy": plan.strategy, "status": rep.status,
        "predicted_peak_bytes": rep.predicted_peak_bytes, "measured_peak_bytes": rep.measured_peak_bytes,
        "peak_error_pct": rep.peak_error_pct,
        "predicted_time_s": rep.predicted_time_s, "measured_time_s": rep.measured_time_s,
        "time_error_pct": rep.time_error_pct,
        "predicted_overhead": pred.overhead,
        "measured_overhead": (rep.measured_time_s / store_measured_s - 1) if store_measured_s else 0.0,
        "grad_max_rel_diff": rep.grad_max_rel_diff, "tolerance": rep.tolerance,
        "grad_max_rel_diff_per_step": [r.grad_max_rel_diff for r in rep.step_records],
        "param_max_abs_diff": rep.param_max_abs_diff, "loss": rep.loss, "reference_loss": rep.reference_loss,
        "predicted_fixed_bytes": rep.predicted_fixed_bytes, "measured_fixed_bytes": rep.measured_fixed_bytes,
        "max_forwards": max(rep.forward_counts), "message": rep.message,
    }


def section_models(models: dict, dev: torch.device, res: _Results, *, dtype: str, steps: int) -> None:
    for name, fields in models.items():
        try:
            _model_runs(name, fields, dev, res, dtype=dtype, steps=steps)
        except Exception as exc:  # one model's failure must not hide the other's numbers
            res.add("runs", {"model": name, "plan": "-", "status": "error", "message": _error_text(exc)})
            log.error("model %s: %s", name, traceback.format_exc())
        _free(dev)


def _model_runs(name: str, fields: dict, dev: torch.device, res: _Results, *, dtype: str, steps: int) -> None:
    cfg = GPTConfig(**fields, dtype=dtype, attention="flash")
    stages, x0 = build_gpt(cfg, device=dev)
    t0 = time.perf_counter()
    # profiled twice: first as a user would, on a GPU that may have been idle; then again after
    # the plain steps have run it for a while (the runs below use the second)
    first = profile_chain(stages, x0, device=dev, repeats=5, warmup=2, name=name)
    profile_s = time.perf_counter() - t0
    plain_peak, plain_s = _plain_step(stages, x0, dev, repeats=20)
    prof = profile_chain(stages, x0, device=dev, repeats=5, warmup=2, name=name)
    store = planner.plan(prof, strategy="store-all")
    first_s = planner.plan(first, strategy="store-all").predicted.time_s
    res.add("profiles", {
        "model": name, "profile_s": profile_s, "attention": prof.meta.get("attention_backend"),
        "first_profile_store_all_s": first_s, "first_profile_time_error_pct": _pct(plain_s, first_s),
        "fallback": prof.meta.get("attention_fallback"), "n_stages": prof.n_stages,
        "fixed_bytes": prof.fixed_bytes, "analytic": _analytic_check(prof, cfg, dev),
        "store_all_predicted_peak_bytes": store.predicted.peak_bytes,
        "plain_step_peak_bytes": plain_peak,
        "plain_peak_error_pct": _pct(plain_peak, store.predicted.peak_bytes),
        "store_all_predicted_s": store.predicted.time_s, "plain_step_s": plain_s,
        "plain_time_error_pct": _pct(plain_s, store.predicted.time_s),
        "profile": prof.model_dump(mode="json"),
    })
    log.info("%s: profiled in %.1f s (attention %s); plain step %.2f ms, peak %.1f MiB",
             name, profile_s, prof.meta.get("attention_backend"), plain_s * 1e3, plain_peak / 2**20)
    sqrt = planner.plan(prof, strategy="sqrt")
    plans = [("store-all", store), ("sqrt", sqrt),
             ("optimal@sqrt", planner.plan(prof, budget_bytes=sqrt.predicted.peak_bytes)),
             ("optimal@75%", planner.plan(prof, budget_bytes=store.predicted.peak_bytes * 3 // 4))]
    store_s = None
    for label, plan in plans:
        if not plan.schedule:
            res.add("runs", {"model": name, "plan": label, "status": "infeasible", "message": plan.message})
            continue
        rep = run_plan(stages, x0, plan, profile=prof, steps=steps)
        store_s = rep.measured_time_s if label == "store-all" else store_s
        res.add("runs", _run_record(name, label, plan, rep, store_s))
        _free(dev)


def section_policies(models: dict, dev: torch.device, res: _Results, *, dtype: str, steps: int) -> None:
    """Save policies (docs/chain-model.md section 10.8) on each model: profiled with the built-in
    candidates, then at 30%, 45% and 60% of the store-all peak the optimal plan with policies and
    the whole-block optimal plan, both run: measured against predicted, and the measured step time
    of the policy plan over the whole-block one's (below 1: the policies pay)."""
    for name, fields in models.items():
        try:
            cfg = GPTConfig(**fields, dtype=dtype, attention="flash")
            stages, x0 = build_gpt(cfg, device=dev)
            t0 = time.perf_counter()
            prof = profile_chain(stages, x0, device=dev, repeats=5, warmup=2, name=name,
                                 policies=True)
            res.add("policy_profiles", {
                "model": name, "profile_s": time.perf_counter() - t0,
                "policies": {la.name: [[p.name, p.saved_bytes, p.backward_s] for p in la.policies]
                             for la in prof.layers if la.policies}})
            store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
            whole = prof.with_policies(None)
            for frac in (0.3, 0.45, 0.6):
                budget = int(store * frac)
                measured = {}
                for label, p_use in (("policies", prof), ("whole blocks", whole)):
                    plan = planner.plan(p_use, budget_bytes=budget)
                    if not plan.schedule:
                        res.add("policy_runs", {"model": name, "plan": f"{label}@{frac:.0%}",
                                                "status": "infeasible", "message": plan.message})
                        continue
                    rep = run_plan(stages, x0, plan, profile=prof, steps=steps)
                    measured[label] = rep.measured_time_s
                    rec = _run_record(name, f"{label}@{frac:.0%}", plan, rep, None)
                    rec["stage_policies"] = dict(plan.stage_policies)
                    res.add("policy_runs", rec)
                    _free(dev)
                if len(measured) == 2:
                    res.add("policy_ratios", {"model": name, "budget_frac": frac,
                                              "time_policies_over_whole": measured["policies"]
                                              / measured["whole blocks"]})
        except Exception as exc:
            res.add("policy_runs", {"model": name, "plan": "-", "status": "error",
                                    "message": _error_text(exc)})
            log.error("policies %s: %s", name, traceback.format_exc())
        _free(dev)


# ---------------------------------------------------------------------------------------------
# offload: host bandwidth, plans with and without it, the best one run


def _runner_step(stages, x0, plan, dev: torch.device, steps: int) -> dict:
    """Run `plan` by the schedule runner for `steps` steps (the first untimed, the last under
    memory measurement): measured peak (bytes above the level before the step, a_0 counted) and
    median step seconds, with the loss and gradients of the last step."""
    from memplan.executor.runner import ScheduleRunner

    for s in stages:
        for p in s.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    runner = ScheduleRunner(stages, plan.ops(), device=dev)
    times = []
    for step in range(steps):
        for s in stages:
            for p in s.parameters():
                p.grad.zero_()
        runner.prepare()
        if step == steps - 1:
            torch.manual_seed(0)
            with measure_memory(dev) as meter:
                loss = runner.step(x0)
            break
        _sync(dev)
        t0 = time.perf_counter()
        runner.step(x0)
        _sync(dev)
        if step > 0:
            times.append(time.perf_counter() - t0)
    grads = [p.grad.detach().clone() for s in stages for p in s.parameters()]
    off = runner.offload
    return {"peak": meter.peak_bytes + x0.untyped_storage().nbytes(),
            "seconds": statistics.median(times) if times else float("nan"), "loss": float(loss),
            "grads": grads, "moved_bytes": off.moved_bytes if off is not None else 0}


def _plain_grads(stages, x0) -> list:
    for s in stages:
        for p in s.parameters():
            if p.grad is not None:
                p.grad.zero_()
    torch.manual_seed(0)
    x = x0
    for s in stages:
        x = s(x)
    x.backward()
    return [p.grad.detach().clone() for s in stages for p in s.parameters()]


def _grad_rel(a: list, b: list) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        d = (x.float() - y.float()).abs().max().item()
        m = y.float().abs().max().item()
        worst = max(worst, d / m if m else d)
    return worst


def section_offload(model: tuple[str, dict], dev: torch.device, res: _Results, *, dtype: str,
                    steps: int) -> None:
    """NOTE in the module's docstring (offload). One record per budget (the plans' predictions),
    then one per run plan, or a skip record with the reason."""
    from memplan.executor.offload import CPU_REFUSAL
    from memplan.executor.report import ExecutorError

    name, fields = model
    try:
        bw = measure_host_bandwidth(dev)
        res.add("offload_bandwidth", {"device": str(dev), "device_to_host_Bps": bw and bw[0],
                                      "host_to_device_Bps": bw and bw[1]})
        # the planner's one bandwidth for both directions: the slower one (each runs alone)
        plan_bw = min(bw) if bw else CPU_STAND_IN_BANDWIDTH
        cfg = GPTConfig(**fields, dtype=dtype, attention="flash")
        stages, x0 = build_gpt(cfg, device=dev)
        prof = profile_chain(stages, x0, device=dev, repeats=5, warmup=2, name=name)
        store = planner.plan(prof, strategy="store-all").predicted
        best = None
        for frac in OFFLOAD_FRACTIONS:
            budget = int(store.peak_bytes * frac)
            plain = planner.plan(prof, strategy="optimal", budget_bytes=budget)
            try:
                off = planner.plan(prof, strategy="optimal", budget_bytes=budget,
                                   offload_bandwidth=plan_bw)
            except TypeError as exc:  # the planner has no offload_bandwidth yet
                res.add("offload", {"model": name, "status": "skipped",
                                    "message": f"the planner takes no offload_bandwidth ({exc})"})
                return
            moves = sum(op[0] in ("offload", "offload_record") for op in off.ops())
            rec = {"model": name, "budget_frac": frac, "budget_bytes": budget,
                   "bandwidth_Bps": plan_bw, "transfers": moves,
                   "recompute_only_s": plain.predicted.time_s if plain.feasible else None,
                   "offload_s": off.predicted.time_s if off.feasible else None,
                   "offload_peak_bytes": off.predicted.peak_bytes if off.feasible else None,
                   "host_peak_bytes": getattr(off.predicted, "host_peak_bytes", None) if off.feasible else None,
                   "transfer_wait_s": getattr(off.predicted, "transfer_wait_s", None) if off.feasible else None}
            res.add("offload_plans", rec)
            if off.feasible and moves:
                gain = (plain.predicted.time_s if plain.feasible else float("inf")) - off.predicted.time_s
                if best is None or gain > best[0]:
                    best = (gain, frac, plain, off)
        if best is None:
            res.add("offload", {"model": name, "status": "skipped",
                                "message": "no plan moves anything at these budgets (transfers do "
                                           "not pay at this bandwidth)"})
            return
        _, frac, plain, off = best
        if dev.type != "cuda":
            try:
                _runner_step(stages, x0, off, dev, 2)
                msg = "ran on the CPU: the refusal is missing"
                status = "error"
            except ExecutorError as exc:
                status = "refused" if str(exc) == CPU_REFUSAL else "error"
                msg = str(exc)
            res.add("offload", {"model": name, "plan": f"offload@{frac:.0%}", "status": status,
                                "message": msg})
            return
        ref = _plain_grads(stages, x0)
        for label, plan in ((f"offload@{frac:.0%}", off), (f"recompute-only@{frac:.0%}", plain)):
            if not plan.feasible:
                res.add("offload", {"model": name, "plan": label, "status": "infeasible",
                                    "message": plan.message})
                continue
            got = _runner_step(stages, x0, plan, dev, max(3, steps))
            pred = plan.predicted
            res.add("offload", {
                "model": name, "plan": label, "status": "ok",
                "predicted_peak_bytes": pred.peak_bytes, "measured_peak_bytes": got["peak"],
                "peak_error_pct": _pct(got["peak"], pred.peak_bytes),
                "predicted_time_s": pred.time_s, "measured_time_s": got["seconds"],
                "time_error_pct": _pct(got["seconds"], pred.time_s),
                "transfer_wait_s": getattr(pred, "transfer_wait_s", None),
                "host_peak_bytes": getattr(pred, "host_peak_bytes", None),
                "moved_bytes": got["moved_bytes"], "grad_max_rel_diff": _grad_rel(got["grads"], ref),
                "loss": got["loss"]})
            _free(dev)
    except Exception as exc:
        res.add("offload", {"model": name, "status": "error", "message": _error_text(exc)})
        log.error("offload %s: %s", name, traceback.format_exc())
    _free(dev)


def _free(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# features: every feature alone and together, every strategy, three precisions


def _feature_model(fields: dict, features: tuple, dev: torch.device):
    cfg = GPTConfig(**fields, dropout=0.1, **model_options(features, fields["n_layer"]))
    stages, x = build_gpt(cfg, device=dev)
    notes, _ = apply_features(stages, features)
    return stages, x, notes


def _feature_runs(fields, features, dev, res, *, autocast, plans, tag) -> None:
    stages, x, notes = _feature_model(fields, features, dev)
    prof = profile_chain(stages, x, device=dev, repeats=2, warmup=1, autocast_dtype=autocast)
    store = planner.plan(prof, strategy="store-all").predicted.peak_bytes
    for strategy, fraction in plans:
        plan = planner.plan(prof, strategy=strategy, budget_bytes=int(store * fraction))
        if not plan.schedule:
            plan = planner.plan(prof, strategy=strategy)
        rep = run_plan(stages, x, plan, profile=prof, steps=3, autocast_dtype=autocast, features=features)
        used = sorted({v["used"] for v in gpt_report(stages)["attention"].values()})
        res.add("features", {
            "features": "+".join(features) or "none", "precision": tag, "strategy": strategy,
            "budget_fraction": fraction, "planned_budget_bytes": plan.budget_bytes,
            "status": rep.status, "bitwise": rep.message.startswith("gradients, loss, buffers and parameters bitwise"),
            "grad_max_rel_diff": rep.grad_max_rel_diff, "buffer_max_abs_diff": rep.buffer_max_abs_diff,
            "param_max_abs_diff": rep.param_max_abs_diff, "tolerance": rep.tolerance,
            "peak_error_pct": rep.peak_error_pct, "time_error_pct": rep.time_error_pct,
            "max_forwards": max(rep.forward_counts), "attention": used, "notes": notes,
            "message": rep.message,
        })


def section_features(fields: dict, dev: torch.device, res: _Results) -> None:
    for features in FEATURE_SETS:
        try:
            _feature_runs(fields, features, dev, res, autocast=None, plans=FEATURE_PLANS, tag="fp32")
        except Exception as exc:  # one feature's failure must not hide the others' numbers
            res.add("features", {"features": "+".join(features) or "none", "precision": "fp32",
                                 "status": "error", "message": _error_text(exc)})
            log.error("features %s: %s", features, traceback.format_exc())
        _free(dev)
    together = FEATURE_SETS[-2]
    for dtype, tag in ((torch.bfloat16, "bf16 autocast"), (torch.float16, "fp16 autocast + scaler")):
        try:
            _feature_runs(fields, together, dev, res, autocast=dtype, plans=FEATURE_PLANS[2:], tag=tag)
        except Exception as exc:
            res.add("features", {"features": "+".join(together), "precision": tag, "status": "error",
                                 "message": _error_text(exc)})
            log.error("features %s %s: %s", together, tag, traceback.format_exc())
        _free(dev)


def _bench_peers():
    """benchmarks/bench_peers.py as a module (benchmarks/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_peers.py"
    spec = importlib.util.spec_from_file_location("bench_peers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def section_peers(models: dict, dev: torch.device, res: _Results, *, dtype: str, rounds: int) -> None:
    """Hugging Face GPT-2 against the peers' checkpointing and memplan's installed plans at each
    peer's peak (module docstring, "peers"): one record per contender, its peak (bytes) and its
    step time as a ratio to the unplanned step's."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        res.add("peers", {"model": "-", "contender": "-", "status": "skipped",
                          "message": "transformers is not installed"})
        return
    bench = _bench_peers()
    for name, shape in models.items():
        args = argparse.Namespace(
            **shape, rounds=rounds, repeats=3, frontier_points=2, no_compile=dev.type != "cuda",
            no_policies=False, variants=["memplan", "memplan-sel", "memplan-sel-c"],
            lean_loss=False, device=dev.type, dtype=dtype)
        try:
            t0 = time.perf_counter()
            rec = bench.run_family("gpt2", args)
        except Exception as exc:
            res.add("peers", {"model": name, "contender": "-", "status": "error",
                              "message": _error_text(exc)})
            log.error("peers %s: %s", name, traceback.format_exc())
            _free(dev)
            continue
        for contender, r in rec["peers"].items():
            res.add("peers", {"model": name, "contender": contender, "status": "ok", **r})
        for contender, r in rec["infeasible"].items():
            res.add("peers", {"model": name, "contender": contender, "status": "infeasible", **r})
        for contender, why in rec["errors"].items():
            if contender == "compile" and args.no_compile:
                why = "left out of the CPU logic check (minutes of inductor compiling)"
            res.add("peers", {"model": name, "contender": contender, "status": "not run",
                              "message": why})
        log.info("peers %s: %.0f s (profiles %s)", name, time.perf_counter() - t0, rec["profile_s"])
        _free(dev)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


# ---------------------------------------------------------------------------------------------
# tables


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_tables(data: dict) -> None:
    secs = data["sections"]
    if secs.get("peers"):
        print("\npeers (step time / the unplanned step's: median [95% interval]; peak above the "
              "level before the step)")
        for r in secs["peers"]:
            if r["status"] != "ok":
                print(f"{r['model']:<15} {r['contender']:<28} {r['status']}: {r.get('message', '')}")
                continue
            lo, hi = r["time_ratio_ci95"]
            pols = ", ".join(f"{k} x{v}" for k, v in r.get("policies", {}).items())
            pred = (f" (predicted {_mib(r['predicted_peak_bytes'])})"
                    if r.get("predicted_peak_bytes") is not None else "")
            print(f"{r['model']:<15} {r['contender']:<28} {_mib(r['peak_bytes']):>9} MiB{pred} "
                  f"{r['time_ratio_median']:.3f} [{lo:.3f}, {hi:.3f}] grad diff "
                  f"{r['max_grad_diff']:.2g} {pols}")
    for r in secs.get("rng", []):
        print(f"rng: restoring twice, handing {r['handed']}: second draw equals the first: "
              f"{r['second_draw_equals_first']}")
    if secs.get("profiles"):
        print("\nprofile vs analytic (stages equal / all) and a plain step vs the store-all replay")
        print(f"{'model':<15} {'out':>6} {'saved':>6} {'param':>6} {'flops':>6} {'fixed ok':>8} "
              f"{'plain peak MiB':>14} {'err %':>7} {'plain ms':>9} {'err %':>7}")
        for r in secs["profiles"]:
            a = r["analytic"]
            cells = [f"{a[k]['equal']}/{a[k]['of']}" for k in ANALYTIC_FIELDS]
            print(f"{r['model']:<15} {cells[0]:>6} {cells[1]:>6} {cells[2]:>6} {cells[3]:>6} "
                  f"{str(a['fixed_bytes'][0] == a['fixed_bytes'][1]):>8} {_mib(r['plain_step_peak_bytes']):>14} "
                  f"{r['plain_peak_error_pct']:>7.2f} {r['plain_step_s'] * 1e3:>9.2f} {r['plain_time_error_pct']:>7.2f}"
                  f" (first profile {r['first_profile_time_error_pct']:.2f})")
    if secs.get("runs"):
        print("\nplans run (peak MiB above fixed memory; error = (measured - predicted) / measured)")
        print(f"{'model':<15} {'plan':<13} {'pred':>8} {'meas':>8} {'err %':>6} {'pred ms':>8} "
              f"{'meas ms':>8} {'err %':>6} {'ovh pred':>8} {'ovh meas':>8} {'grad rel':>9} {'step 1':>8} status")
        for r in secs["runs"]:
            if r["status"] in ("infeasible", "error"):
                print(f"{r['model']:<15} {r['plan']:<13} {r['status']}: {r['message']}")
                continue
            print(f"{r['model']:<15} {r['plan']:<13} {_mib(r['predicted_peak_bytes']):>8} "
                  f"{_mib(r['measured_peak_bytes']):>8} {_f(r['peak_error_pct'], '6.2f')} "
                  f"{r['predicted_time_s'] * 1e3:>8.2f} {r['measured_time_s'] * 1e3:>8.2f} "
                  f"{_f(r['time_error_pct'], '6.1f')} {r['predicted_overhead']:>8.1%} "
                  f"{r['measured_overhead']:>8.1%} {_f(r['grad_max_rel_diff'], '9.2g')} "
                  f"{_f(r['grad_max_rel_diff_per_step'][0], '8.2g')} {r['status']}")
    for r in secs.get("offload_bandwidth", []):
        print(f"\nhost bandwidth on {r['device']}: device->host {_f(r['device_to_host_Bps'] and r['device_to_host_Bps'] / 1e9, '.2f')} GB/s, "
              f"host->device {_f(r['host_to_device_Bps'] and r['host_to_device_Bps'] / 1e9, '.2f')} GB/s")
    if secs.get("offload_plans"):
        print("optimal with and without offload (predicted ms; transfers: offload ops)")
        for r in secs["offload_plans"]:
            print(f"{r['model']:<15} {r['budget_frac']:>5.0%} recompute-only {_f(r['recompute_only_s'] and r['recompute_only_s'] * 1e3, '8.2f')} "
                  f"offload {_f(r['offload_s'] and r['offload_s'] * 1e3, '8.2f')} transfers {r['transfers']}")
    for r in secs.get("offload", []):
        if r["status"] != "ok":
            print(f"offload {r['model']} {r.get('plan', '-')}: {r['status']}: {r['message']}")
            continue
        print(f"{r['model']:<15} {r['plan']:<20} peak {_mib(r['predicted_peak_bytes'])} pred {_mib(r['measured_peak_bytes'])} "
              f"meas MiB ({r['peak_error_pct']:+.2f}%), step {r['predicted_time_s'] * 1e3:.2f} pred "
              f"{r['measured_time_s'] * 1e3:.2f} meas ms ({r['time_error_pct']:+.1f}%), grad rel {r['grad_max_rel_diff']:.2g}")
    if secs.get("features"):
        print("\nfeatures (every strategy at 60% of the store-all peak, optimal at 30% too): worst of the plans")
        print(f"{'features':<24} {'precision':<22} {'ok':>5} {'bitwise':>7} {'grad rel':>9} "
              f"{'|peak err| %':>12} {'max fwd':>7} attention")
        groups: dict = {}
        for r in secs["features"]:
            groups.setdefault((r["features"], r["precision"]), []).append(r)
        for (feat, prec), rows in groups.items():
            if any(r["status"] == "error" for r in rows):
                print(f"{feat:<24} {prec:<22} error: {rows[-1]['message']}")
                continue
            ok = sum(r["status"] == "ok" for r in rows)
            bit = sum(bool(r["bitwise"]) for r in rows)
            rel = max(r["grad_max_rel_diff"] or 0.0 for r in rows)
            peak = max(abs(r["peak_error_pct"] or 0.0) for r in rows)
            fwd = max(r["max_forwards"] for r in rows)
            att = ",".join(sorted({a for r in rows for a in r["attention"]}))
            print(f"{feat:<24} {prec:<22} {ok:>2}/{len(rows):<2} {bit:>3}/{len(rows):<3} {rel:>9.2g} "
                  f"{peak:>12.3f} {fwd:>7} {att}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny configs (a logic check, not a measurement)")
    ap.add_argument("--dtype", default="bfloat16", help="parameter dtype of the GPT-2 models (default bfloat16)")
    ap.add_argument("--steps", type=int, default=6, help="steps per plan in the models section (time: median of 2..steps-1)")
    ap.add_argument("--sections", default="rng,models,features,policies,offload,peers",
                    help="rng, models, features, policies, offload, peers (comma-separated)")
    ap.add_argument("--peer-rounds", type=int, default=5, help="peers: interleaved timing rounds")
    ap.add_argument("--models", default=None, help="comma-separated names from the models section (default all)")
    ap.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True, warn_only=True)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: CUDA is not available; use --device cpu --tiny", file=sys.stderr)
        return 2
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - {"rng", "models", "features", "policies", "offload", "peers"}
    if unknown:
        print(f"error: --sections: unknown {sorted(unknown)}; choose from rng, models, features, "
              "policies, offload, peers", file=sys.stderr)
        return 2
    models = TINY_MODELS if args.tiny else MODELS
    if args.models:
        names = [m.strip() for m in args.models.split(",") if m.strip()]
        if set(names) - set(models):
            print(f"error: --models: unknown {sorted(set(names) - set(models))}; choose from "
                  f"{', '.join(models)}", file=sys.stderr)
            return 2
        models = {m: models[m] for m in names}
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    out = args.out or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json"))
    from memplan.planner._optimal_kernel import available

    res = _Results(out, {
        "date": time.strftime("%Y-%m-%d"), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "compiled_planner": available(), "dtype": args.dtype, "tiny": args.tiny,
        "deterministic": args.deterministic, "sections_run": sections,
    })
    t_start = time.perf_counter()
    if "rng" in sections:
        section_rng(device, res)
    if "models" in sections:
        section_models(models, device, res, dtype=args.dtype, steps=args.steps)
    if "features" in sections:
        section_features(TINY_FEATURE_MODEL if args.tiny else FEATURE_MODEL, device, res)
    if "policies" in sections:
        small = {k: v for k, v in models.items() if k in ("gpt2-b32", "gpt2-medium-b16", "tiny-a")}
        section_policies(small or models, device, res, dtype=args.dtype, steps=args.steps)
    if "offload" in sections:
        section_offload(TINY_OFFLOAD_MODEL if args.tiny else OFFLOAD_MODEL, device, res,
                        dtype=args.dtype, steps=args.steps)
    if "peers" in sections:
        section_peers(TINY_PEER_MODELS if args.tiny else PEER_MODELS, device, res,
                      dtype=args.dtype, rounds=args.peer_rounds)
    res.data["elapsed_s"] = time.perf_counter() - t_start
    res.path.write_text(json.dumps(res.data, indent=1, default=str) + "\n")
    print_tables(res.data)
    print(f"\n{res.data['device_name']}, torch {torch.__version__}; {res.data['elapsed_s']:.0f} s; "
          f"targets: peak within 2%, time within 10%; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
