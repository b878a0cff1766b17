"""`memplan plan` and `memplan simulate`: plan a profile for a budget, replay a schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import app, console, echo_json, read_json, user_errors
from memplan.cli._remote import ServerOption, remote


def _load_profile(path: Path):
    from memplan.profiler.schema import load_profile

    return load_profile(read_json(path, what="profile"))


# planner.plan's fields -> this command's options, for error messages
_OPTION = {
    "budget_bytes": "--budget", "memory_bytes": "--memory", "n_gpus": "--gpus",
    "zero_stage": "--zero-stage", "max_overhead": "--max-overhead", "k": "--k",
    "checkpoint_dtype": "--checkpoint-dtype", "tolerance": "--tolerance",
}


def _sizes(budget: str | None, memory: str | None) -> dict:
    """memplan.planner.plan's budget_bytes or memory_bytes from --budget or --memory (one at most)."""
    from memplan.units import parse_bytes

    if budget is not None and memory is not None:
        raise ValueError("--budget and --memory: give one (activation budget or device memory)")
    if budget is not None:
        return {"budget_bytes": parse_bytes(budget, field="--budget")}
    if memory is not None:
        return {"memory_bytes": parse_bytes(memory, field="--memory")}
    return {}


@app.command("plan")
@user_errors
def plan_cmd(
    profile: Annotated[Path, typer.Argument(help="profile JSON (see `memplan profile`), or -")],
    budget: Annotated[
        str | None, typer.Option(help="activation budget above fixed memory: 24GiB, 8e9, ...")
    ] = None,
    memory: Annotated[
        str | None, typer.Option(help="device memory instead: the budget is this minus fixed_bytes")
    ] = None,
    strategy: Annotated[str, typer.Option(help="store-all, uniform, sqrt, heuristic, optimal")] = "optimal",
    k: Annotated[int | None, typer.Option(help="uniform: checkpoint every k stages")] = None,
    max_overhead: Annotated[
        float | None,
        typer.Option(help="optimal: least memory for at most this slowdown (0.2 = 20%)"),
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option(help="precision policy the profile was measured under: fp32, bf16-mixed, "
                     "bf16, fp16-mixed (checked against the profile's dtype)"),
    ] = None,
    checkpoint_dtype: Annotated[
        str,
        typer.Option(help="storage dtype of kept activations: compute (as computed), auto, fp32, "
                     "bf16, fp16, fp8"),
    ] = "compute",
    tolerance: Annotated[
        float | None,
        typer.Option(help="largest relative gradient error lossy storage may add (default: the "
                     "policy's own, 0 for fp32)"),
    ] = None,
    gpus: Annotated[int, typer.Option(help="data-parallel GPUs (model states sharded by --zero-stage)")] = 1,
    zero_stage: Annotated[int, typer.Option(help="ZeRO stage 0-3: which model states are sharded")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="print the Plan as JSON")] = False,
    plot: Annotated[Path | None, typer.Option(help="draw the plan's memory timeline as a PNG here")] = None,
    server: ServerOption = None,
) -> None:
    """Plan checkpoints for PROFILE within a memory budget."""
    from memplan import planner
    prof = _load_profile(profile)
    if precision is not None:
        _check_precision(prof, precision)
    options = {"k": k} if k is not None else {}
    if max_overhead is not None:
        options["max_overhead"] = max_overhead
    sizes = _sizes(budget, memory)
    if server:
        if gpus != 1 or zero_stage != 0:
            sizes.update(n_gpus=gpus, zero_stage=zero_stage)
        body = remote(server).plan(prof.model_dump(mode="json"), strategy=strategy, options=options,
                                   extra={**sizes, "checkpoint_dtype": checkpoint_dtype,
                                          "tolerance": tolerance})
        plan = planner.Plan.model_validate(body)
    else:
        try:
            plan = planner.plan(prof, strategy=strategy, n_gpus=gpus, zero_stage=zero_stage,
                                checkpoint_dtype=checkpoint_dtype, tolerance=tolerance,
                                **sizes, **options)
        except planner.PlanError as err:  # name this command's option, not the library's field
            field, _, rest = str(err).partition(":")
            raise ValueError(f"{_OPTION.get(field, field)}:{rest}") from None
    if json_out:
        echo_json(plan)
    else:
        _print_plan(prof, plan)
    if plot is not None and plan.schedule:
        from memplan.planner.timeline import plan_timeline
        from memplan.planner.timeline_plot import plot_timeline

        typer.echo(f"timeline: {plot_timeline(plan_timeline(prof, plan), plot)}", err=True)
    if not plan.feasible:
        raise typer.Exit(1)


def _check_precision(prof, precision: str) -> None:
    from memplan.planner.precision import get_policy

    policy = get_policy(precision)
    if policy.compute_dtype != prof.dtype:
        raise ValueError(
            f"--precision: {precision} computes in {policy.compute_dtype} but the profile was "
            f"measured in {prof.dtype}; profile the model under {precision} (memplan profile "
            "--autocast ...) or pass the matching policy"
        )


@app.command("simulate")
@user_errors
def simulate_cmd(
    profile: Annotated[Path, typer.Argument(help="profile JSON")],
    schedule: Annotated[Path, typer.Argument(help="schedule JSON: a list of ops, or a Plan")],
    json_out: Annotated[bool, typer.Option("--json", help="print the replay as JSON")] = False,
) -> None:
    """Replay SCHEDULE over PROFILE: validity, time, peak and the memory timeline."""
    from memplan.planner.simulate import simulate

    prof = _load_profile(profile)
    raw = read_json(schedule, what="schedule")
    ops = raw.get("schedule") if isinstance(raw, dict) else raw
    if ops is None:
        raise ValueError("schedule: the JSON object has no 'schedule' field (give a Plan or a list)")
    sim = simulate(prof, ops)
    data = {
        "valid": sim.valid,
        "error": sim.error,
        "error_index": sim.error_index,
        "time_s": sim.time_s,
        "peak_bytes": sim.peak_bytes,
        "total_peak_bytes": sim.total_peak_bytes,
        "recompute_s": sim.recompute_s,
        "overhead": sim.overhead,
        "timeline": sim.timeline,
    }
    if json_out:
        echo_json(data)
    else:
        from memplan.units import format_bytes

        out = console()
        if sim.valid:
            out.print(
                f"valid: time {sim.time_s:.6g} s (+{sim.overhead:.1%}), peak {format_bytes(sim.peak_bytes)}"
                f" ({sim.peak_bytes} B; {format_bytes(sim.total_peak_bytes)} with fixed memory)"
            )
        else:
            out.print(f"invalid: {sim.error}")
    if not sim.valid:
        raise typer.Exit(1)


def _print_plan(prof, plan) -> None:
    from rich.table import Table

    from memplan.units import format_bytes

    out = console()
    counts = [0] * prof.n_stages
    for op in plan.schedule:
        if op[0] in ("F", "R"):
            counts[op[1] - 1] += 1
    checkpoints = set(plan.checkpoints)
    if plan.schedule:
        table = Table(title=f"{prof.name}: {plan.strategy} plan")
        for col in ("stage", "name", "role", "output kept", "forward", "saved"):
            table.add_column(col, justify="right" if col in ("stage", "forward", "saved") else "left")
        for i, layer in enumerate(prof.layers, start=1):
            n = counts[i - 1]
            role = "recorded" if n == 1 else f"recomputed (x{n})"
            table.add_row(
                str(i), layer.name, role,
                ("checkpoint" + (f" ({plan.checkpoint_dtypes[i]})" if i in plan.checkpoint_dtypes else ""))
                if i in checkpoints else "",
                f"{layer.forward_s * 1e3:.3f} ms", format_bytes(layer.saved_bytes),
            )
        out.print(table)
    status = "[green]feasible[/green]" if plan.feasible else "[red]infeasible[/red]"
    out.print(f"{plan.strategy}: {status}. {plan.message}".rstrip(". ") + ".")
    if plan.budget_bytes is not None:
        out.print(f"budget: {format_bytes(plan.budget_bytes)} ({plan.budget_bytes} B) of activations")
    if plan.predicted:
        p = plan.predicted
        out.print(
            f"predicted peak: {format_bytes(p.peak_bytes)} ({p.peak_bytes} B), "
            f"{format_bytes(p.total_peak_bytes)} with fixed memory; "
            f"step time {p.time_s:.6g} s, recompute {p.recompute_s:.6g} s (+{p.overhead:.1%})"
        )
