"""`memplan run`: profile, plan, run and compare a built-in model in one command."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import (
    LeanLossOption,
    ReuseLogitsOption,
    app,
    check_output_path,
    console,
    echo_json,
    given_options,
    user_errors,
)
from memplan.cli._remote import ServerOption, finished_result, remote


@app.command("run")
@user_errors
def run_cmd(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="built-in model: gpt or conv")] = "gpt",
    n_layer: Annotated[int, typer.Option(help="GPT blocks (conv: blocks per group)")] = 6,
    d_model: Annotated[int, typer.Option(help="GPT width")] = 128,
    n_head: Annotated[int, typer.Option(help="GPT attention heads")] = 4,
    seq: Annotated[int, typer.Option(help="GPT sequence length")] = 64,
    vocab: Annotated[int, typer.Option(help="GPT vocabulary size")] = 512,
    batch: Annotated[int, typer.Option(help="examples per step")] = 8,
    dropout: Annotated[float, typer.Option(help="GPT dropout")] = 0.1,
    budget: Annotated[str | None, typer.Option(help="activation budget: 2GiB, 8e9, ...")] = None,
    strategy: Annotated[str, typer.Option(help="store-all, uniform, sqrt, heuristic, optimal")] = "optimal",
    features: Annotated[str, typer.Option(help="comma list: moe,flash,qat,prune,exit")] = "",
    steps: Annotated[int, typer.Option(help="training steps run and compared")] = 3,
    autocast: Annotated[str | None, typer.Option(help="bfloat16 (bf16) or float16 (fp16) autocast")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda[:i]")] = "cpu",
    offload_bandwidth: Annotated[str | None, typer.Option(
        help="optimal: host-device bandwidth each way (25GB/s, 25GiB/s, 25e9): the plan may also "
        "move kept activations to host memory (CUDA only; on the CPU a plan that moves any is "
        "refused)")] = None,
    host_memory: Annotated[str | None, typer.Option(
        help="with --offload-bandwidth: host memory offloaded activations may take (e.g. 64GiB)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the RunReport as JSON")] = False,
    plot: Annotated[Path | None, typer.Option(help="draw predicted against measured memory per op "
                    "as a PNG here (and keep the timeline JSON, and on CUDA the allocator snapshot)")] = None,
    hf_config: Annotated[Path | None, typer.Option(
        "--hf-config", help="a Hugging Face causal LM's config.json: build it (random weights), "
        "auto_checkpoint it and run a plain training loop (uses --batch, --seq, --budget, "
        "--strategy, --steps)")] = None,
    policies: Annotated[bool, typer.Option(
        "--policies", help="--hf-config: also measure the blocks' save policies (selective "
        "recompute) so the plan may record blocks under them")] = False,
    compile_blocks: Annotated[bool, typer.Option(
        "--compile", help="--hf-config: compile each block (torch.compile per block) and plan on "
        "the compiled costs")] = False,
    lean: LeanLossOption = False,  # --hf-config only
    reuse: ReuseLogitsOption = False,
    server: ServerOption = None,
) -> None:
    """Profile, plan, run and compare a built-in model: predicted against measured.

    Exit codes: 0 the run matched its prediction, 1 a mismatch or a budget nothing meets
    (infeasible), 2 bad input (a plan that offloads on the CPU among it)."""
    from memplan.cli.plan import _OPTION, _offload
    from memplan.executor.pipeline import RunSpec, run_builtin
    from memplan.executor.report import InfeasiblePlanError
    from memplan.planner.request import check_offload_options
    from memplan.planner.units import parse_bytes

    # the short names the other options take (--checkpoint-dtype bf16, --precision bf16-mixed)
    autocast = {"bf16": "bfloat16", "fp16": "float16"}.get(autocast or "", autocast)
    offload = _offload(offload_bandwidth, host_memory)  # offload_bandwidth, host_memory_bytes
    if offload.get("offload_bandwidth") == 0:  # as POST /v1/runs refuses it (the planner: no offload)
        raise ValueError(f"--offload-bandwidth: must be above 0 bytes/s, got {offload_bandwidth!r}; "
                         "leave it out for no offload")
    # before profiling: what the planner would refuse only after it (NOTE [ offload options ])
    check_offload_options(strategy=strategy, offload_bandwidth=offload.get("offload_bandwidth"),
                          host_memory_bytes=offload.get("host_memory_bytes"), names=_OPTION)
    if hf_config is not None:
        # the config sets the model, and run_hf_config runs it on the CPU in this process
        ignored = given_options(ctx, "model", "n_layer", "d_model", "n_head", "vocab", "dropout",
                                "features", "autocast", "device", "plot", "server")
        if ignored:
            raise ValueError(f"{ignored[0]}: not an option with --hf-config (the config sets the "
                             "model, which runs locally on the CPU; it uses --batch, --seq, --budget, "
                             "--strategy, --steps, --policies, --compile, --lean-loss, "
                             "--reuse-logits and the offload options)")
        for flag, v in (("--batch", batch), ("--seq", seq), ("--steps", steps)):
            if v < 1:
                raise ValueError(f"{flag}: an integer >= 1, got {v}")
        if reuse and not lean:
            raise ValueError("--reuse-logits: it is an option of the lean loss; add --lean-loss, or "
                             "drop --reuse-logits")
        _run_hf(hf_config, batch=batch, seq=seq, budget=budget, strategy=strategy, steps=steps,
                json_out=json_out, policies=policies, compile_blocks=compile_blocks, lean=lean,
                reuse=reuse, offload=offload)
        return
    if policies or compile_blocks or lean or reuse:
        flag = ("--policies" if policies else "--compile" if compile_blocks else "--lean-loss" if lean
                else "--reuse-logits")
        raise ValueError(f"{flag}: only with --hf-config (the built-in models' plans run whole "
                         "stages with their own losses)")

    spec = RunSpec(model=model, n_layer=n_layer, n_embd=d_model, n_head=n_head, block_size=seq,
                   vocab_size=vocab, batch_size=batch, dropout=dropout,
                   budget_bytes=parse_bytes(budget, field="--budget") if budget else None,
                   strategy=strategy, features=[f for f in features.split(",") if f.strip()],
                   steps=steps, autocast_dtype=autocast, device=device, **offload)
    check_output_path(plot, "--plot")  # before the run
    if plot is not None:  # keep the profile and plan the run makes, to measure that plan per op
        if server:
            raise ValueError("--plot: measures a local run; leave out --server")
        from memplan.executor.timeline import keeping

        run_builtin = keeping(run_builtin, kept := {})
    if server:
        from memplan.executor.report import RunReport

        body = {"model": model, "budget_bytes": spec.budget_bytes, "strategy": strategy,
                "features": list(spec.features), "steps": steps, "autocast_dtype": autocast,
                "device": device,
                "config": {"n_layer": n_layer, "n_embd": d_model, "n_head": n_head,
                           "block_size": seq, "vocab_size": vocab, "batch_size": batch,
                           "dropout": dropout}}
        body.update(offload)  # only when given: a server without the fields still takes the rest
        report = RunReport.model_validate(finished_result(remote(server).run(body)))
        if json_out:
            echo_json(report)
        else:
            print_report(report)
    else:
        try:
            with _planner_options(), _run_options():
                if json_out:
                    report, _, _ = run_builtin(spec)
                else:
                    report = _run_with_progress(spec, run_builtin)
        except InfeasiblePlanError as err:  # infeasible is exit code 1, as for `memplan plan`
            typer.echo(f"infeasible: {err}", err=True)
            raise typer.Exit(1) from None
        if json_out:
            echo_json(report)
        else:
            print_report(report)
    if plot is not None:  # a local run (--server was refused above)
        from memplan.executor.timeline import plot_run

        for path in plot_run(spec, kept["profile"], kept["plan"], plot):
            typer.echo(f"kept: {path}", err=True)
    if report.status != "ok":
        raise typer.Exit(1)


@contextlib.contextmanager
def _planner_options() -> Iterator[None]:
    """The planner's `PlanError` naming this command's option (`options.offload_bandwidth` ->
    `--offload-bandwidth`, as `memplan plan` says it); a ValueError, so exit code 2."""
    from memplan.cli.plan import _option_name
    from memplan.planner.schema import PlanError

    try:
        yield
    except PlanError as err:
        raise ValueError(f"{_option_name(err.field)}: {err.reason}") from None


# the built-in run's fields (executor.pipeline.RunSpec, the model configs) -> this command's options
_RUN_OPTION = {"steps": "--steps", "n_layer": "--n-layer", "n_embd": "--d-model", "n_head": "--n-head",
               "block_size": "--seq", "vocab_size": "--vocab", "batch_size": "--batch",
               "dropout": "--dropout"}


@contextlib.contextmanager
def _run_options() -> Iterator[None]:
    """A ValueError that names a run field (`n_embd: ...`) names this command's option instead
    (`--d-model: ...`), as the user typed it."""
    try:
        yield
    except ValueError as err:
        field, sep, rest = str(err).partition(": ")
        if not sep or field not in _RUN_OPTION:
            raise
        raise ValueError(f"{_RUN_OPTION[field]}: {rest}") from None


def _run_hf(path: Path, *, batch: int, seq: int, budget: str | None, strategy: str, steps: int,
            json_out: bool, policies: bool = False, compile_blocks: bool = False,
            lean: bool = False, reuse: bool = False, offload: dict | None = None) -> None:
    """`--hf-config`: executor/install.py's run_hf_config, printed; exit 1 when infeasible or
    when the measured peak is more than 2% from the prediction. `offload`: run_hf_config's
    offload_bandwidth (bytes/s) and host_memory_bytes, those given."""
    from memplan.executor.install import run_hf_config
    from memplan.executor.report import InfeasiblePlanError
    from memplan.planner.units import format_bytes, parse_bytes

    try:
        with _planner_options():
            run = run_hf_config(path, batch_size=batch, seq=seq, strategy=strategy, steps=steps,
                                budget=parse_bytes(budget, field="--budget") if budget else None,
                                policies=policies, compile=compile_blocks, lean_loss=lean,
                                reuse_logits=reuse, **(offload or {}))
    except InfeasiblePlanError as err:
        typer.echo(f"infeasible: {err}", err=True)
        raise typer.Exit(1) from None
    if json_out:
        echo_json(run.as_dict())
    else:
        out = console()
        out.print(f"{run.model} ({run.n_params:,} parameters), {run.strategy} plan, recomputes "
                  f"stages {run.recomputed}; losses {', '.join(f'{v:.4f}' for v in run.losses)}")
        if run.stage_policies:
            out.print("save policies: " + ", ".join(f"stage {i} {p}"
                                                    for i, p in sorted(run.stage_policies.items())))
        out.print(f"peak activations: {format_bytes(run.predicted_peak_bytes)} predicted, "
                  f"{format_bytes(run.measured_peak_bytes)} measured ({run.peak_error_pct:+.2f}%); "
                  f"store-all {format_bytes(run.store_all_peak_bytes)}")
        out.print(f"step: {run.predicted_step_s * 1e3:.1f} ms predicted, "
                  f"{run.measured_step_s * 1e3:.1f} ms measured")
    if run.peak_error_pct is None or abs(run.peak_error_pct) > 2.0:
        raise typer.Exit(1)


def _run_with_progress(spec, run_builtin):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console(), transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(phase, done, total):
            if phase not in tasks:
                tasks[phase] = bar.add_task({"profile": "profiling stages", "run": "running steps"}[phase], total=total)
            bar.update(tasks[phase], completed=done, total=total)

        report, _, _ = run_builtin(spec, progress=progress)
    return report


def print_report(report) -> None:
    """The predicted-against-measured table and the comparison with the unplanned step."""
    from rich.table import Table

    from memplan.planner.units import format_bytes

    def pct(v):
        return "-" if v is None else f"{v:+.2f}%"

    out = console()
    t = Table(title=f"{report.strategy} plan, {report.n_stages} stages, {report.steps} steps "
                    f"({report.device}, {report.dtype})")
    for col in ("", "predicted", "measured", "error"):
        t.add_column(col, justify="right" if col else "left")
    t.add_row("peak activations", format_bytes(report.predicted_peak_bytes),
              format_bytes(report.measured_peak_bytes), pct(report.peak_error_pct))
    t.add_row("step time", f"{report.predicted_time_s * 1e3:.2f} ms" if report.predicted_time_s is not None else "-",
              f"{report.measured_time_s * 1e3:.2f} ms" if report.measured_time_s is not None else "-",
              pct(report.time_error_pct))
    t.add_row("fixed (params, grads, optimizer)", format_bytes(report.predicted_fixed_bytes),
              format_bytes(report.measured_fixed_bytes), "")
    out.print(t)
    if report.predicted_overhead is not None:
        out.print(f"recompute overhead (predicted): +{report.predicted_overhead:.1%}; "
                  f"forwards per stage: {report.forward_counts}")
    colour = "green" if report.status == "ok" else "red"
    out.print(f"[{colour}]{report.status}[/{colour}]: {report.message}")
    if report.grad_max_rel_diff is not None:
        out.print(f"gradients vs the unplanned step: max abs diff {report.grad_max_abs_diff:.3g}, "
                  f"max rel diff {report.grad_max_rel_diff:.3g} (tolerance {report.tolerance:.3g}); "
                  f"buffers {report.buffer_max_abs_diff:.3g}")
    for note in [*report.guard_notes, *report.notes]:
        out.print(f"  - {note}")
    exits = report.extras.get("gpt", {}).get("exit")
    if exits:
        out.print(f"  - early exit: {_exit_summary(exits)}")


def _exit_summary(exits: dict) -> str:
    """The early-exit record of the last step (profiler/models/gpt.py's `report["exit"]`) in words:
    how many sequences left at each exit, and the blocks and block FLOPs they ran."""
    runs = exits.get("per_sample_blocks") or []
    counts = ", ".join(f"{sum(bool(d) for d in ds)} of {len(ds)} after block {j}"
                       for j, ds in sorted(exits.get("decisions", {}).items(), key=lambda kv: int(kv[0])))
    ran, full = sum(exits.get("per_sample_block_flops") or []), exits.get("full_block_flops") or 0
    share = f"{ran / (full * len(runs)):.0%} of the full blocks' FLOPs" if full and runs else "-"
    return (f"sequences exited: {counts or 'none'}; blocks run per sequence "
            f"{min(runs, default=0)}-{max(runs, default=0)} ({share})")
