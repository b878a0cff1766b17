"""Sweeps: a grid of model configurations x budgets x strategies x precision policies, each cell
planned (and, where the executor can, run and compared), gathered into one report and plot.

A cell is independent of every other, so a backend fans the cells out (the service's job worker,
one after another; a Ray cluster, in parallel: `memplan.service.backends`); `sweep_cell(request, ctx)` is
the job function every backend calls, and `gather(spec, outcomes)` builds the report. `run_sweep`
runs the cells here, or through the map function its caller hands it (the CLI passes the Ray
backend's `map_cells`): the executor never imports the service above it.

NOTE [ Reproducible sweeps ]
Every byte a measured profile holds is exact and repeatable, but its times are not, and a planner
choosing the fastest schedule within a budget may choose another one when two are close in time.
`profile="analytic"` takes the profile from shapes (`memplan.profiler.analytic`: exact output and saved
bytes, times from FLOPs), so that the plans, their predictions and the measured peaks of a sweep
are the same on every run and every backend; `profile="measured"` (the default) measures each
configuration first, as `memplan run` does.

NOTE [ A cell profiles the model it runs ]
The analytic profile is made from the configuration of the model the cell has built
(`memplan_config` of its first stage, which `build_gpt` and `build_conv` record): the attention
path its features chose (math unless "flash"), experts, widths, dtype; the intra-op threads the
run has (the flash kernel's buffers are per thread); and, for the mixed policies, the autocast
dtype the run uses; for the policies the executor does not run (`bf16`, `zero-mixed`: 16-bit
weights and compute), the analytic profile of the pure bf16 model (a 16-bit chain: fp16's tensors
have bf16's sizes), whose fixed bytes `shard_profile` then prices by the policy. A measured cell
runs the model in fp32 or under autocast, so it cannot profile those two (refused: its
activations would be fp32's). A profile of another model than the one run predicts another peak (an
analytic profile assuming flash for a run on the math path: +13.9%), so nothing here restates a
setting. Features that change the model after it is built (qat, prune) and early exit (shapes
that depend on the data) have no analytic profile: such a cell asks for profile "measured".

NOTE [ When a run is ok ]
A run is "ok" when the executor finds its gradients, loss and buffers as the unplanned step's, its
measured peak is within `peak_tolerance_pct` of the prediction (default 1%: the replay is exact to
the byte on the CPU), and, when the spec sets `time_tolerance_pct`, its measured time within that
(`time_ratio` = measured / predicted seconds per step, reported either way). Time is not judged
by default because a small model's step time on a shared CPU is noise: a 2-layer, width-32 GPT
cell measured -578% to +83% off its measured profile's prediction with other jobs on the 2 cores.
Analytic profiles' times are FLOPs at an assumed rate (`flops_per_s`), not a prediction for this
machine, so their time is judged only when the spec gives `flops_per_s` too. A cell runs at least
two steps: the executor times every step but the last, whose memory it measures.

NOTE [ Precision policies in a run ]
The executor runs fp32 weights with AdamW, under autocast for the mixed policies: "fp32",
"bf16-mixed" (autocast bfloat16) and "fp16-mixed" (autocast float16 with a GradScaler). The other
policies ("bf16": pure bf16 states; "zero-mixed": 16-bit weights with fp32 masters) are planned
with their bytes per parameter (`memplan.planner.precision`) but not run; ask for `run=false`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from memplan.executor.features import check_features
from memplan.executor.report import ExecutorError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

__all__ = [
    "SweepModel", "SweepSpec", "SweepCell", "SweepReport", "RUNNABLE_PRECISIONS", "cells",
    "sweep_cell", "gather", "plot_sweep", "run_sweep", "MAX_CELLS", "Outcome", "MapCells",
]

log = logging.getLogger(__name__)

MAX_CELLS = 256
RUNNABLE_PRECISIONS = {"fp32": None, "bf16-mixed": "bfloat16", "fp16-mixed": "float16"}
_MODEL_KEYS = ("n_layer", "n_embd", "n_head", "block_size", "vocab_size", "batch_size", "dropout",
               "repeats", "features")
_NOT_ANALYTIC = ("qat", "prune", "exit")  # change the model after it is built, or data-dependent shapes
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)

Scalar = StrictBool | StrictInt | StrictFloat | StrictStr | None


class SweepModel(BaseModel):
    """One model configuration of the grid: a built-in family and its settings."""

    model_config = _STRICT

    model: Literal["gpt", "conv"] = "gpt"
    config: dict[str, Scalar] = Field(
        default_factory=dict, description=f"settings of executor.pipeline.RunSpec: {', '.join(_MODEL_KEYS)}"
    )
    label: str | None = Field(default=None, max_length=64, description="name in the report")


class SweepSpec(BaseModel):
    """The grid: every combination of `models` x `budgets_bytes` x `strategies` x `precisions`."""

    model_config = _STRICT

    models: list[SweepModel] = Field(min_length=1, max_length=32)
    budgets_bytes: list[int | None] = Field(
        default_factory=lambda: [None], min_length=1, max_length=64,
        description="activation budgets per GPU (bytes above the fixed bytes); null: no limit",
    )
    strategies: list[str] = Field(default_factory=lambda: ["optimal"], min_length=1, max_length=8)
    precisions: list[str] = Field(default_factory=lambda: ["fp32"], min_length=1, max_length=5)
    n_gpus: int = Field(default=1, ge=1, le=1_000_000, description="data-parallel GPUs")
    zero_stage: int = Field(default=0, ge=0, le=3, description="ZeRO stage sharding the states")
    profile: Literal["measured", "analytic"] = Field(
        default="measured", description="measure each configuration, or derive it from shapes")
    run: bool = Field(default=True, description="run each feasible plan and compare (else plan only)")
    steps: int = Field(default=2, ge=2, le=100, description="training steps per run: all but the "
                       "last timed, the last measured for memory (NOTE [ When a run is ok ])")
    device: str | None = Field(default=None, max_length=32, description="'cpu' or 'cuda[:i]'")
    peak_tolerance_pct: float = Field(
        default=1.0, ge=0, le=100, description="largest |measured - predicted| peak, % of measured, "
        "of a run that is ok")
    time_tolerance_pct: float | None = Field(
        default=None, ge=0, description="largest |measured - predicted| seconds per step, % of "
        "measured, of a run that is ok; null (the default): time reported, not judged (NOTE "
        "[ When a run is ok ])")
    flops_per_s: float | None = Field(
        default=None, gt=0, description="analytic profiles: this machine's rate (FLOPs per second) "
        "for their times; null: 1e12 and their time is not judged")


class SweepCell(BaseModel):
    """One cell's plan and, when it ran, what it measured."""

    model_config = _STRICT

    index: int
    label: str
    model: str
    config: dict[str, Scalar]
    budget_bytes: int | None
    strategy: str
    precision: str
    n_gpus: int
    zero_stage: int
    profile: str
    state: str = Field(description="'succeeded', 'failed' or 'cancelled' (the job's state)")
    error: str | None = None
    feasible: bool | None = None
    message: str = ""
    n_stages: int | None = None
    fixed_bytes_per_gpu: int | None = None
    predicted_peak_bytes: int | None = None
    predicted_total_bytes: int | None = None
    predicted_time_s: float | None = None
    predicted_overhead: float | None = None
    checkpoints: list[int] = Field(default_factory=list)
    ran: bool = False
    run_status: str | None = Field(default=None, description="'ok' or 'mismatch' (NOTE [ When a "
                                   "run is ok ])")
    run_message: str | None = Field(default=None, description="why a run is not ok, or what it matched")
    measured_peak_bytes: int | None = None
    peak_error_pct: float | None = None
    measured_time_s: float | None = Field(default=None, description="median seconds per step")
    time_ratio: float | None = Field(default=None, description="measured / predicted seconds per step")
    time_error_pct: float | None = None
    measured_fixed_bytes: int | None = None
    grad_max_abs_diff: float | None = None
    grad_max_rel_diff: float | None = None
    loss: float | None = None
    device: str | None = None


class SweepReport(BaseModel):
    """Every cell, and per (model, precision) the cells on the memory-time Pareto front."""

    model_config = _STRICT

    n_cells: int
    succeeded: int
    failed: int
    cancelled: int
    feasible: int
    ran: int
    runs_ok: int = Field(description="runs whose gradients matched the unplanned step and whose "
                         "peak and time met their tolerances")
    max_abs_peak_error_pct: float | None = Field(description="over the cells that ran")
    pareto: dict[str, list[int]] = Field(
        description="'label / precision' -> indices of the cells on the front of (total bytes, time)")
    cells: list[SweepCell]


def _check_spec(spec: SweepSpec) -> None:
    from memplan.planner.precision import POLICIES

    from memplan import planner

    for k, s in enumerate(spec.strategies):
        if s not in planner.STRATEGIES:
            raise ExecutorError(f"strategies[{k}]: unknown {s!r}; choose from {', '.join(planner.STRATEGIES)}")
    for k, p in enumerate(spec.precisions):
        if p not in POLICIES:
            raise ExecutorError(f"precisions[{k}]: unknown {p!r}; choose from {', '.join(POLICIES)}")
        if spec.run and p not in RUNNABLE_PRECISIONS:
            raise ExecutorError(
                f"precisions[{k}]: {p!r} can be planned but not run by the executor (it runs "
                f"{', '.join(RUNNABLE_PRECISIONS)}); set run to false for a plan-only sweep")
        if spec.profile != "analytic" and p not in RUNNABLE_PRECISIONS:
            raise ExecutorError(
                f"precisions[{k}]: {p!r} needs profile 'analytic' (a measured cell runs the model "
                "in fp32 or under autocast, so its activations would be fp32's)")
    for k, b in enumerate(spec.budgets_bytes):
        if b is not None and b < 0:
            raise ExecutorError(f"budgets_bytes[{k}]: must be >= 0 bytes or null, got {b}")
    for k, m in enumerate(spec.models):
        bad = sorted(set(m.config) - set(_MODEL_KEYS))
        if bad:
            raise ExecutorError(f"models[{k}].config.{bad[0]}: not a model setting; known: {', '.join(_MODEL_KEYS)}")
        if spec.profile == "analytic" and float(m.config.get("dropout", 0.1) or 0) > 0:
            raise ExecutorError(f"models[{k}].config.dropout: the analytic profile covers dropout 0; "
                                "set it to 0 or use profile 'measured'")
        feats = m.config.get("features")
        if feats is not None and not isinstance(feats, str):
            raise ExecutorError(f"models[{k}].config.features: a comma-separated string, e.g. "
                                f"'flash,moe', not {feats!r}")
        try:
            names = check_features((feats or "").split(","), m.model)
        except ValueError as err:
            raise ExecutorError(f"models[{k}].config.features: {str(err).split(': ', 1)[-1]}") from None
        bad_f = [f for f in names if f in _NOT_ANALYTIC]
        if spec.profile == "analytic" and bad_f:
            raise ExecutorError(f"models[{k}].config.features: {', '.join(bad_f)} has no analytic "
                                "profile (NOTE [ A cell profiles the model it runs ]); use profile "
                                "'measured'")
        mixed = [p for p in spec.precisions if RUNNABLE_PRECISIONS.get(p)]
        if spec.profile == "analytic" and m.model == "gpt" and mixed and (
                "flash" not in names or "moe" in names):
            raise ExecutorError(f"models[{k}].config.features: the analytic profile prices "
                                f"{mixed[0]} (autocast) on the flash path with a dense MLP only; add "
                                "'flash' (without 'moe'), or use profile 'measured'")
    n = len(spec.models) * len(spec.budgets_bytes) * len(spec.strategies) * len(spec.precisions)
    if n > MAX_CELLS:
        raise ExecutorError(f"models x budgets_bytes x strategies x precisions: {n} cells, more than "
                            f"{MAX_CELLS}; split the sweep")


def cells(spec: SweepSpec | dict) -> list[dict[str, Any]]:
    """The grid's cells in order, each the request `sweep_cell` takes. Raises ExecutorError."""
    spec = spec if isinstance(spec, SweepSpec) else SweepSpec.model_validate(spec)
    _check_spec(spec)
    out = []
    grid = itertools.product(enumerate(spec.models), spec.precisions, spec.strategies, spec.budgets_bytes)
    for index, ((k, m), precision, strategy, budget) in enumerate(grid):
        out.append({
            "index": index, "label": m.label or f"{m.model}#{k}", "model": m.model,
            "config": dict(m.config), "budget_bytes": budget, "strategy": strategy,
            "precision": precision, "n_gpus": spec.n_gpus, "zero_stage": spec.zero_stage,
            "profile": spec.profile, "run": spec.run, "steps": spec.steps, "device": spec.device,
            "peak_tolerance_pct": spec.peak_tolerance_pct,
            "time_tolerance_pct": spec.time_tolerance_pct, "flops_per_s": spec.flops_per_s,
        })
    return out


def _runspec(req: dict[str, Any]):
    from memplan.executor.pipeline import RunSpec

    cfg = dict(req.get("config") or {})
    cfg["features"] = tuple(check_features(str(cfg.get("features") or "").split(","), req["model"]))
    return RunSpec(model=req["model"], budget_bytes=req.get("budget_bytes"), strategy=req["strategy"],
                   steps=max(2, int(req.get("steps", 2))), **cfg)


def _analytic(stages, req: dict[str, Any], precision: str):
    """The analytic profile of the model `stages` were built as (NOTE [ A cell profiles the model
    it runs ]), for the run's threads and, under a mixed policy, its autocast."""
    import torch
    from memplan.profiler import analytic

    built = dict(getattr(stages[0], "memplan_config", None) or {})
    family = built.pop("family", None)
    # the compute the cell's policy runs: autocast (mixed), or 16-bit throughout (NOTE [ A cell
    # profiles the model it runs ]); fp32: the model as built
    mixed = ({"precision": precision} if RUNNABLE_PRECISIONS.get(precision)
             else {"precision": "bf16"} if precision not in RUNNABLE_PRECISIONS else {})
    rate = {"flops_per_s": req["flops_per_s"]} if req.get("flops_per_s") else {}
    if family == "gpt":
        return analytic.gpt_analytic_profile(built, device="cpu", cpu_threads=torch.get_num_threads(),
                                             **mixed, **rate)
    if family == "conv":
        return analytic.conv_analytic_profile(built, device="cpu", **mixed, **rate)
    raise ExecutorError(f"model: {req['model']!r} records no configuration to profile analytically; "
                        "use profile 'measured'")


def _judge(report, req: dict[str, Any]) -> dict[str, Any]:
    """The cell's run status and message from the executor's report and the tolerances (NOTE
    [ When a run is ok ])."""
    problems = [report.message] if report.status != "ok" else []
    peak_tol = float(req.get("peak_tolerance_pct", 1.0))
    if report.peak_error_pct is None or abs(report.peak_error_pct) > peak_tol:
        problems.append(f"peak {report.measured_peak_bytes} B measured, {report.predicted_peak_bytes} B "
                        f"predicted ({_pct(report.peak_error_pct)}; tolerance {peak_tol:g}%)")
    time_tol = req.get("time_tolerance_pct")
    ratio = (report.measured_time_s / report.predicted_time_s
             if report.predicted_time_s and report.measured_time_s else None)
    judged = time_tol is not None and (req.get("profile") != "analytic" or req.get("flops_per_s"))
    if judged and (report.time_error_pct is None or abs(report.time_error_pct) > float(time_tol)):
        measured = "not" if report.measured_time_s is None else f"{report.measured_time_s:.4g} s"
        problems.append(f"time {measured} measured, {report.predicted_time_s:.4g} s "
                        f"predicted ({_pct(report.time_error_pct)}; tolerance {float(time_tol):g}%)")
    message = "; ".join(problems) or (
        f"{report.message}; peak {_pct(report.peak_error_pct)}"
        + (f", time {_pct(report.time_error_pct)}" if judged else
           ", time not judged (analytic times are FLOPs at an assumed rate)" if time_tol is not None
           else ", time not judged"))
    return dict(run_status="mismatch" if problems else "ok", run_message=message, time_ratio=ratio,
                time_error_pct=report.time_error_pct)


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:+.3g}%"


def sweep_cell(request: dict[str, Any], ctx: Any = None) -> SweepCell:
    """One cell: build the model, profile it (measured or analytic), price its fixed bytes for
    `n_gpus` at `zero_stage` and the precision policy, plan it, and (when asked and possible) run
    the plan for `steps` steps and compare with the unplanned step. Returns a `SweepCell`.
    (A job function: `ctx.progress(fraction, message)` is called as it advances.)"""
    import torch
    from memplan.executor.pipeline import _build
    from memplan.executor.run import run_plan
    from memplan.planner.sharding import shard_profile

    from memplan import planner

    def progress(f: float, msg: str) -> None:
        if ctx is not None:
            ctx.progress(f, msg)

    req = dict(request)
    device = req.get("device") or getattr(ctx, "device", None) or "cpu"
    if device != "cpu":
        raise ExecutorError(f"device: the executor's sweeps run on the CPU in this build, not {device!r}")
    spec = _runspec(req)
    precision = req["precision"]
    autocast = RUNNABLE_PRECISIONS.get(precision)
    dtype = {None: None, "bfloat16": torch.bfloat16, "float16": torch.float16}[autocast]
    base = {k: req[k] for k in ("index", "label", "model", "config", "budget_bytes", "strategy",
                                "precision", "n_gpus", "zero_stage", "profile")}
    progress(0.05, "building")
    stages, x = _build(spec)
    if req["profile"] == "analytic":
        prof = _analytic(stages, req, precision)
    else:
        from memplan.executor.features import apply_features

        apply_features(stages, spec.features)
        from memplan.profiler.measure import profile_chain

        prof = profile_chain(stages, x, repeats=spec.repeats, warmup=1, name=spec.model,
                             autocast_dtype=dtype,
                             progress=lambda d, t, w: progress(0.1 + 0.4 * d / max(t, 1), f"profile {w}"))
    # runnable policies are fp32 weights with fp32 AdamW: the bytes the profile measured
    policy = None if precision in RUNNABLE_PRECISIONS else precision
    sharded = shard_profile(prof, n_gpus=req["n_gpus"], zero_stage=req["zero_stage"], policy=policy)
    plan = planner.plan(sharded, budget_bytes=req["budget_bytes"], strategy=req["strategy"])
    pred = plan.predicted
    cell = SweepCell(
        **base, state="succeeded", feasible=plan.feasible, message=plan.message,
        n_stages=plan.n_stages, fixed_bytes_per_gpu=sharded.fixed_bytes,
        predicted_peak_bytes=pred.peak_bytes if pred else None,
        predicted_total_bytes=pred.total_peak_bytes if pred else None,
        predicted_time_s=pred.time_s if pred else None,
        predicted_overhead=pred.overhead if pred else None, checkpoints=list(plan.checkpoints),
        device=device,
    )
    if not (req.get("run", True) and plan.feasible and plan.schedule):
        progress(1.0, "planned")
        return cell
    if precision not in RUNNABLE_PRECISIONS:
        raise ExecutorError(f"precision: {precision!r} cannot be run; set run to false")
    progress(0.5, "running")
    report = run_plan(stages, x, plan, profile=prof, steps=spec.steps, autocast_dtype=dtype,
                      features=spec.features,
                      on_step=lambda d, t: progress(0.5 + 0.5 * d / t, f"step {d}/{t}"))
    return cell.model_copy(update=dict(
        ran=True, **_judge(report, req), measured_peak_bytes=report.measured_peak_bytes,
        peak_error_pct=report.peak_error_pct, measured_time_s=report.measured_time_s,
        measured_fixed_bytes=report.measured_fixed_bytes, grad_max_abs_diff=report.grad_max_abs_diff,
        grad_max_rel_diff=report.grad_max_rel_diff, loss=report.loss,
    ))


def _pareto(cells_: list[SweepCell]) -> list[int]:
    pts = sorted((c.predicted_total_bytes, c.predicted_time_s, c.index) for c in cells_
                 if c.feasible and c.predicted_total_bytes is not None)
    out, best = [], float("inf")
    for _total, t, i in pts:
        if t < best * (1 - 1e-9):
            out.append(i)
            best = t
    return out


def gather(requests: list[dict[str, Any]], outcomes: list[tuple[str, dict | None, str | None]]) -> SweepReport:
    """The report of a sweep from its cells' requests and outcomes (state, result, error detail)."""
    done: list[SweepCell] = []
    for req, (state, result, error) in zip(requests, outcomes, strict=True):
        if state == "succeeded" and result is not None:
            done.append(SweepCell.model_validate(result))
        else:
            base = {k: req[k] for k in ("index", "label", "model", "config", "budget_bytes",
                                        "strategy", "precision", "n_gpus", "zero_stage", "profile")}
            done.append(SweepCell(**base, state=state, error=error or state))
    groups: dict[str, list[SweepCell]] = {}
    for c in done:
        groups.setdefault(f"{c.label} / {c.precision}", []).append(c)
    errs = [abs(c.peak_error_pct) for c in done if c.ran and c.peak_error_pct is not None]
    return SweepReport(
        n_cells=len(done),
        succeeded=sum(c.state == "succeeded" for c in done),
        failed=sum(c.state == "failed" for c in done),
        cancelled=sum(c.state == "cancelled" for c in done),
        feasible=sum(bool(c.feasible) for c in done),
        ran=sum(c.ran for c in done), runs_ok=sum(c.run_status == "ok" for c in done),
        max_abs_peak_error_pct=max(errs) if errs else None,
        pareto={k: _pareto(v) for k, v in groups.items()},
        cells=done,
    )


def plot_sweep(report: SweepReport, path: str | Path) -> Path:
    """Per (model, precision): each cell's predicted (total bytes per GPU, recompute overhead), the
    Pareto front as a staircase, and the measured total (fixed + measured peak) where it ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    markers = {"store-all": "s", "sqrt": "^", "uniform": "x", "heuristic": "+", "optimal": "o"}
    by_index = {c.index: c for c in report.cells}
    mib = 1 / 2**20
    for g, (key, front) in enumerate(report.pareto.items()):
        color = f"C{g % 10}"
        members = [c for c in report.cells if f"{c.label} / {c.precision}" == key and c.feasible]
        for strategy in dict.fromkeys(c.strategy for c in members):
            pts = [c for c in members if c.strategy == strategy]
            ax.plot([c.predicted_total_bytes * mib for c in pts], [c.predicted_overhead * 100 for c in pts],
                    markers.get(strategy, "o"), color=color, ls="none", ms=6,
                    label=f"{key}: {strategy}")
        ran = [c for c in members if c.ran and c.measured_peak_bytes is not None]
        if ran:
            ax.plot([(c.fixed_bytes_per_gpu + c.measured_peak_bytes) * mib for c in ran],
                    [c.predicted_overhead * 100 for c in ran], "o", mfc="none", color=color, ms=11,
                    label=f"{key}: measured")
        fr = [by_index[i] for i in front]
        if fr:
            ax.step([c.predicted_total_bytes * mib for c in fr], [c.predicted_overhead * 100 for c in fr],
                    where="post", color=color, lw=1)
    ax.set_xlabel("bytes per GPU: fixed + activation peak (MiB)")
    ax.set_ylabel("recompute overhead (% of store-all time)")
    ax.set_title(f"sweep: {report.n_cells} cells, {report.ran} run, {report.runs_ok} ok")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _outcome(fn: Callable[[], Any]) -> tuple[str, dict | None, str | None]:
    try:
        res = fn()
        return "succeeded", res.model_dump(mode="json") if hasattr(res, "model_dump") else res, None
    except (ValueError, KeyError) as err:
        return "failed", None, str(err)


Outcome = tuple[str, dict | None, str | None]  # (state, the cell's result, error detail)
MapCells = Callable[..., list[Outcome]]


def run_sweep(
    spec: SweepSpec | dict,
    *,
    map_cells: MapCells | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepReport:
    """Run every cell of `spec` and gather the report (a `SweepReport`): here, one after another,
    or through `map_cells(requests, progress=progress)`, which runs `sweep_cell` on each request
    wherever it likes and returns an `Outcome` per request, in order (the Ray backend's
    `map_cells` with its address bound, a task per cell)."""
    reqs = cells(spec)
    if map_cells is not None:
        outcomes = map_cells(reqs, progress=progress)
    else:
        outcomes = []
        for k, req in enumerate(reqs):
            outcomes.append(_outcome(lambda req=req: sweep_cell(req)))
            if progress:
                progress(k + 1, len(reqs))
    return gather(reqs, outcomes)
