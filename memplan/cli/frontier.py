"""`memplan frontier`: the optimal planner's memory-time trade-off, with the baselines beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import app, check_output_path, console, echo_json, read_json, user_errors
from memplan.cli._remote import ServerOption, remote


@app.command("frontier")
@user_errors
def frontier_cmd(
    profile: Annotated[Path, typer.Argument(help="profile JSON (see `memplan profile`), or -")],
    points: Annotated[
        int | None, typer.Option(help="thin to about N points spread evenly in memory (the ends, "
                                 "and the point at each baseline's memory, are kept too)")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="write the frontier as a PNG here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the Frontier as JSON")] = False,
    offload_bandwidth: Annotated[
        str | None,
        typer.Option(help="host-device bandwidth (25GB/s, 25GiB/s or bytes/s): the frontier of "
                     "plans that may also offload, beside the one without"),
    ] = None,
    host_memory: Annotated[
        str | None,
        typer.Option(help="with --offload-bandwidth: host memory the offload may take (e.g. 64GiB)"),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(help="auto (default), exact, memo, banded or grouped: how long chains are "
                     "solved, each point with its certified gap (docs/planner.md)"),
    ] = None,
    server: ServerOption = None,
) -> None:
    """The Pareto set of (peak, time) from the store-all peak down to the least feasible budget."""
    from memplan import planner
    from memplan.cli.plan import _offload
    from memplan.planner.frontier import plot_frontier
    from memplan.planner.request import frontier_request
    from memplan.profiler.schema import load_profile

    prof = load_profile(read_json(profile, what="profile"))
    flags = {"points": "--points", "offload_bandwidth": "--offload-bandwidth",
             "host_memory_bytes": "--host-memory", "mode": "--mode"}
    given = {"points": points} if points is not None else {}
    if mode is not None:
        given["mode"] = mode
    given.update(_offload(offload_bandwidth, host_memory))
    try:  # validated once, here, as the service validates its body
        request = frontier_request(profile=prof, options=given)
    except planner.PlanError as err:
        name = (err.field or "points").removeprefix("options.")
        raise ValueError(f"{flags.get(name, '--' + name)}: {err.reason}") from None
    if plot is not None and plot.suffix.lower() != ".png":
        raise ValueError(f"--plot: {str(plot)!r} should end in .png")
    check_output_path(plot, "--plot")
    options = request.options.model_dump(exclude_unset=True)
    if server:
        from memplan.planner.frontier import Frontier

        client = remote(server)
        result = Frontier.model_validate(client.frontier(prof.model_dump(mode="json"), options=options))
        if plot is not None:
            plot.write_bytes(client.frontier(prof.model_dump(mode="json"), png=True, options=options))
    else:
        result = planner.frontier(prof, **options)
        if plot is not None:
            plot_frontier(result, plot)
    if json_out:
        echo_json(result)
        return
    _print(result, plot)


def _print(result, plot) -> None:
    from memplan.cli._tables import Col, fitted_table
    from memplan.planner.units import format_bytes

    out = console()
    rows = [[format_bytes(p.peak_bytes), str(p.peak_bytes), f"{p.time_s:.6g} s", f"+{p.overhead:.1%}"]
            for p in result.points]
    cols = [Col("peak"), Col("bytes", drop=1), Col("time"), Col("overhead")]
    if result.offload_bandwidth:  # what each point holds on the host, and the time without
        plain = result.recompute_only_points or []
        for row, p in zip(rows, result.points, strict=True):
            best = min((q.time_s for q in plain if q.peak_bytes <= p.peak_bytes), default=None)
            row += [format_bytes(p.host_peak_bytes), "-" if best is None else f"{best:.6g} s"]
        cols += [Col("host"), Col("no offload")]
    out.print(fitted_table(f"{result.profile_name}: memory-time frontier ({result.mode})", cols, rows))
    rows = [[b.label, format_bytes(b.peak_bytes), f"{b.time_s:.6g} s", f"+{b.overhead:.1%}",
             "yes" if b.dominated else "no"] for b in result.baselines]
    cols = [Col("strategy", number=False), Col("peak"), Col("time"), Col("overhead"),
            Col("dominated", number=False)]
    base = fitted_table("baselines", cols, rows)
    out.print(base)
    out.print(
        f"{result.n_pareto} Pareto points from {format_bytes(result.store_all_peak_bytes)} (store-all) "
        f"down to {format_bytes(result.least_peak_bytes)} (least feasible)"
        + (f"; plot written to {plot}" if plot else "")
    )
