"""`memplan plan` and `memplan simulate`: plan a profile for a budget, replay a schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import app, check_output_path, console, echo_json, read_json, user_errors
from memplan.cli._remote import ServerOption, remote


def _load_profile(path: Path):
    from memplan.profiler.schema import load_profile

    return load_profile(read_json(path, what="profile"))


# planner.plan's fields -> this command's options, for error messages
_OPTION = {
    "budget_bytes": "--budget", "memory_bytes": "--memory", "n_gpus": "--gpus",
    "zero_stage": "--zero-stage", "max_overhead": "--max-overhead", "k": "--k",
    "checkpoint_dtype": "--checkpoint-dtype", "tolerance": "--tolerance", "precision": "--precision",
    "offload_bandwidth": "--offload-bandwidth", "host_memory_bytes": "--host-memory",
    "mode": "--mode", "max_gap": "--max-gap",
}


def _size(text: str, option: str) -> int:
    from memplan.planner.units import parse_bytes

    return parse_bytes(text, field=option)  # "-1": "must be non-negative", one line


def _sizes(budget: str | None, memory: str | None) -> dict:
    """memplan.planner.plan's budget_bytes or memory_bytes from --budget or --memory (one at most)."""
    if budget is not None and memory is not None:
        raise ValueError("--budget and --memory: give one (activation budget or device memory)")
    if budget is not None:
        return {"budget_bytes": _size(budget, "--budget")}
    if memory is not None:
        return {"memory_bytes": _size(memory, "--memory")}
    return {}


def parse_bandwidth(text: str, option: str) -> float:
    """Bytes/s (float) from '25GB/s', '25GiB/s', '25GB' or '25e9'. Raises ValueError naming
    `option`; the bounds (above 0) are the request's to check."""
    from memplan.planner.units import parse_bytes

    raw = text.strip()
    if raw.lower().endswith("/s"):
        raw = raw[:-2]
    try:
        return float(parse_bytes(raw, field=option))
    except ValueError:
        raise ValueError(f"{option}: cannot read {text!r} as bytes per second; write e.g. "
                         "25GB/s, 25GiB/s or 25e9") from None


def _offload(bandwidth: str | None, host_memory: str | None) -> dict:
    """optimal's offload_bandwidth and host_memory_bytes from --offload-bandwidth and --host-memory."""
    out: dict = {}
    if bandwidth is not None:
        out["offload_bandwidth"] = parse_bandwidth(bandwidth, "--offload-bandwidth")
    if host_memory is not None:
        out["host_memory_bytes"] = _size(host_memory, "--host-memory")
    return out


def parse_fraction(text: str, option: str) -> float:
    """A fraction from '0.2' or '20%' (both 0.2). Raises ValueError naming `option`."""
    raw = text.strip()
    scale = 1.0
    if raw.endswith("%"):
        raw, scale = raw[:-1].strip(), 0.01
    try:
        value = float(raw) * scale
    except ValueError:
        raise ValueError(
            f"{option}: expected a fraction or a percentage (0.2 or 20%), got {text!r}"
        ) from None
    return value


def _option_name(field: str | None) -> str:
    """This command's option for a plan request's field (`options.k` -> `--k`)."""
    if not field:
        return "plan"
    name = field.removeprefix("options.")
    if name.startswith("profile"):
        return name
    return _OPTION.get(name, name)


def plan_request_of(prof, *, strategy: str, sizes: dict, options: dict, **fields):
    """The validated `PlanRequest` of this command's options; errors name the command's option."""
    from memplan.planner.request import plan_request
    from memplan.planner.schema import PlanError

    try:
        return plan_request(profile=prof, strategy=strategy, options=options, **sizes, **fields)
    except PlanError as err:
        raise ValueError(f"{_option_name(err.field)}: {_options_named(err.reason)}") from None


def _options_named(reason: str) -> str:
    """A reason's `options.<field>` mentions as this command's options (`--offload-bandwidth`)."""
    import re

    return re.sub(r"\boptions\.([a-z_]+)", lambda m: _OPTION.get(m.group(1), m.group(0)), reason)


def _plan_with_progress(planner, request):
    """`planner.plan_for(request)`, with a progress bar on a terminal while the offload DP (pure
    Python: seconds to minutes on long chains) runs."""
    if not getattr(request.options, "offload_bandwidth", None):
        return planner.plan_for(request)
    from memplan.cli.size import _progress
    from memplan.planner._optimal_offload import PROGRESS

    bar, update = _progress("planning with offload")
    token = PROGRESS.set(update)
    try:
        with bar:
            return planner.plan_for(request)
    finally:
        PROGRESS.reset(token)


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
        str | None,
        typer.Option(help="optimal: least memory for at most this slowdown (0.2 or 20%)"),
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option(help="precision policy: fp32, bf16-mixed, bf16, fp16-mixed; prices the model "
                     "states (bytes per parameter) and must be the profile's own"),
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
    offload_bandwidth: Annotated[
        str | None,
        typer.Option(help="optimal: host-device bandwidth each way (25GB/s, 25GiB/s or bytes/s); "
                     "the plan may also move kept activations to host memory and back"),
    ] = None,
    host_memory: Annotated[
        str | None,
        typer.Option(help="optimal with --offload-bandwidth: host memory offloaded activations may "
                     "take (64GiB, ...; default: no limit)"),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(help="optimal: auto (default), exact, memo (exact, memoised by content), "
                     "banded or slotted (certified gap), grouped; docs/planner.md"),
    ] = None,
    max_gap: Annotated[
        str | None,
        typer.Option(help="optimal, banded or slotted: refine until the certified gap to the "
                     "optimum is at most this (0.01 or 1%; default 1%)"),
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
    options: dict = {"k": k} if k is not None else {}
    if max_overhead is not None:
        options["max_overhead"] = parse_fraction(max_overhead, "--max-overhead")
    if mode is not None:
        options["mode"] = mode
    if max_gap is not None:
        options["max_gap"] = parse_fraction(max_gap, "--max-gap")
    options.update(_offload(offload_bandwidth, host_memory))
    check_output_path(plot, "--plot")
    # validated once, here: the same request is sent to a server or planned locally
    request = plan_request_of(prof, strategy=strategy, sizes=_sizes(budget, memory),
                              options=options, n_gpus=gpus, zero_stage=zero_stage,
                              precision=precision, checkpoint_dtype=checkpoint_dtype,
                              tolerance=tolerance)
    if server:
        body = request.model_dump(mode="json", exclude_unset=True, exclude={"profile"})
        body.pop("strategy", None)
        body.pop("options", None)
        plan = planner.Plan.model_validate(remote(server).plan(
            prof.model_dump(mode="json"), strategy=strategy, options=request.option_kwargs(),
            extra=body))
    else:
        try:
            plan = _plan_with_progress(planner, request)
        except planner.PlanError as err:  # name this command's option, not the library's field
            raise ValueError(f"{_option_name(err.field)}: {err.reason}") from None
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


def _stage_map(value, field: str, what: str) -> dict[int, str] | None:
    """A Plan's {stage: name} map read from JSON (keys are strings there), or None when absent;
    ValueError naming `field` when it is not one. The replay checks the stages and names."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected an object {{stage: {what}}}, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        try:
            out[int(k)] = v
        except (TypeError, ValueError):
            raise ValueError(f"{field}: {k!r} is not a stage number") from None
    return out


@app.command("simulate")
@user_errors
def simulate_cmd(
    profile: Annotated[Path, typer.Argument(help="profile JSON")],
    schedule: Annotated[Path, typer.Argument(help="schedule JSON: a list of ops, or a Plan")],
    offload_bandwidth: Annotated[
        str | None,
        typer.Option(help="host-device bandwidth for transfer ops (25GB/s, ...; default: a Plan's "
                     "own options.offload_bandwidth)"),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the replay as JSON")] = False,
) -> None:
    """Replay SCHEDULE over PROFILE: validity, time, peak and the memory timeline."""
    from memplan.planner.simulate import simulate

    prof = _load_profile(profile)
    raw = read_json(schedule, what="schedule")
    ops = raw.get("schedule") if isinstance(raw, dict) else raw
    if ops is None:
        raise ValueError("schedule: the JSON object has no 'schedule' field (give a Plan or a list)")
    made_for = raw.get("profile_fingerprint") if isinstance(raw, dict) else None
    if made_for and made_for != prof.fingerprint():  # as memplan run and install_plan refuse it
        raise ValueError(f"schedule: the plan was made for another model (profile_fingerprint "
                         f"{made_for}, this profile's is {prof.fingerprint()}); replay it over the "
                         "profile it was made from, or give its 'schedule' list alone to replay "
                         "the ops over any profile")
    policies = _stage_map(raw.get("stage_policies") if isinstance(raw, dict) else None,
                          "stage_policies", "policy name")
    storage = _stage_map(raw.get("checkpoint_dtypes") if isinstance(raw, dict) else None,
                         "checkpoint_dtypes", "dtype name")
    bw = None
    if offload_bandwidth is not None:
        bw = parse_bandwidth(offload_bandwidth, "--offload-bandwidth")
        if not bw > 0:
            raise ValueError(f"--offload-bandwidth: must be above 0 bytes/s, got {offload_bandwidth!r}")
    elif isinstance(raw, dict) and isinstance(raw.get("options"), dict):
        bw = raw["options"].get("offload_bandwidth")  # a Plan planned with offload
    extra = {"offload_bandwidth": float(bw)} if bw is not None else {}
    sim = simulate(prof, ops, storage=storage, policies=policies, **extra)
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
    if bw is not None:
        data.update(offload_bandwidth=float(bw), host_peak_bytes=sim.host_peak_bytes,
                    transfer_wait_s=sim.transfer_wait_s, offloaded_bytes=sim.offloaded_bytes)
    if json_out:
        echo_json(data)
    else:
        from memplan.planner.units import format_bytes

        out = console()
        if sim.valid:
            out.print(
                f"valid: time {sim.time_s:.6g} s (+{sim.overhead:.1%}), peak {format_bytes(sim.peak_bytes)}"
                f" ({sim.peak_bytes} B; {format_bytes(sim.total_peak_bytes)} with fixed memory)"
            )
            if bw is not None:
                out.print(f"offload at {format_rate(float(bw))}: host peak "
                          f"{format_bytes(sim.host_peak_bytes)} ({sim.host_peak_bytes} B), transfer "
                          f"wait {sim.transfer_wait_s:.6g} s")
        else:
            out.print(f"invalid: {sim.error}")
    if not sim.valid:
        raise typer.Exit(1)


def _print_plan(prof, plan) -> None:
    from memplan.cli._tables import Col, fitted_table
    from memplan.planner.units import format_bytes

    out = console()
    counts = [0] * prof.n_stages
    for op in plan.schedule:
        if op[0] in ("F", "R"):
            counts[op[1] - 1] += 1
    checkpoints = set(plan.checkpoints)
    moved = offloaded_by_stage(plan.schedule)
    if plan.schedule:
        rows = []
        for i, layer in enumerate(prof.layers, start=1):
            n = counts[i - 1]
            kept = ("checkpoint" + (f" ({plan.checkpoint_dtypes[i]})" if i in plan.checkpoint_dtypes
                                    else "")) if i in checkpoints else ""
            policy = plan.stage_policies.get(i, "all")
            rec = layer.policy(policy) if policy in layer.policy_names else layer
            row = [str(i), layer.name, "recorded" if n == 1 else f"recomputed (x{n})", kept,
                   f"{rec.forward_s * 1e3:.3f} ms", format_bytes(rec.saved_bytes)]
            if prof.has_policies:
                row.insert(3, policy)
            if moved:
                row.insert(len(row) - 2, ", ".join(moved.get(i, [])))
            rows.append(row)
        cols = [Col("stage"), Col("name", number=False), Col("role", number=False),
                Col("output kept", number=False), Col("forward", drop=2), Col("saved", drop=1)]
        if prof.has_policies:  # the save policy of each recorded forward (section 10.8)
            cols.insert(3, Col("saves", number=False))
        if moved:  # what rides to host memory and back (docs/chain-model.md section 10.9)
            cols.insert(len(cols) - 2, Col("offloaded", number=False))
        table = fitted_table(f"{prof.name}: {plan.strategy} plan", cols, rows)
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
        for line in offload_lines(plan):
            out.print(line)


def offloaded_by_stage(schedule) -> dict[int, list[str]]:
    """Stage i -> what the schedule moves to host memory ("output" for a_i, "record" for the
    record of stage i), in schedule order; empty when it moves nothing."""
    names = {"offload": "output", "offload_record": "record"}
    out: dict[int, list[str]] = {}
    for op in schedule or ():
        what = names.get(op[0])
        if what is not None and what not in out.setdefault(op[1], []):
            out[op[1]].append(what)
    return {i: sorted(moved, key=("output", "record").index) for i, moved in out.items()}


def format_rate(bytes_per_s: float) -> str:
    """'25 GB/s' style (decimal units, as links are quoted), bytes per second in."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.4g} {unit}"
    return f"{bytes_per_s:.4g} B/s"


def offload_lines(plan) -> list[str]:
    """The lines a plan with offload adds to its summary: the bandwidth it was planned for, the
    host peak (bytes) and the transfer wait (seconds the compute waited for copies)."""
    from memplan.planner.units import format_bytes

    bw = (plan.options or {}).get("offload_bandwidth")
    p = plan.predicted
    if bw is None or p is None:
        return []
    host = getattr(p, "host_peak_bytes", 0) or 0
    wait = getattr(p, "transfer_wait_s", 0.0) or 0.0
    n = sum(1 for op in plan.schedule if op[0] in ("offload", "offload_record"))
    limit = (plan.options or {}).get("host_memory_bytes")
    lines = [f"offload at {format_rate(bw)} each way: {n} tensors moved to host memory"
             + ("" if n else " (recompute and keeping were no slower)")]
    if n:
        lines.append(f"host peak: {format_bytes(host)} ({host} B)"
                     + (f" of {format_bytes(limit)} allowed" if limit is not None else ""))
        lines.append(f"transfer wait: {wait:.6g} s (compute waiting for copies, in the step time)")
    return lines
