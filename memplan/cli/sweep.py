"""`memplan sweep`: a grid of model configurations x budgets x strategies x precision policies,
planned and run cell by cell (here, on a Ray cluster, or on a memplan server), in one report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import app, check_output_path, console, echo_json, read_json, user_errors
from memplan.cli._remote import ServerOption, remote


@app.command("sweep")
@user_errors
def sweep_cmd(
    spec: Annotated[Path, typer.Argument(help="sweep JSON: models, budgets_bytes, strategies, "
                                         "precisions, n_gpus, zero_stage, profile, run, steps; or -")],
    ray: Annotated[str | None, typer.Option(
        "--ray", envvar="MEMPLAN_RAY_ADDRESS",
        help="run the cells as tasks on this Ray cluster (host:port or auto; needs memplan[ray])")] = None,
    plot: Annotated[Path | None, typer.Option(help="write the frontier plot as a PNG here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    server: ServerOption = None,
    wait_s: Annotated[float, typer.Option("--wait", help="with --server: give up after this many seconds")] = 3600.0,
) -> None:
    """Plan (and run) every cell of the grid and gather one report; each cell is independent, so
    --ray or --server fans them out."""
    from pydantic import ValidationError

    from memplan.executor.sweep import SweepReport, SweepSpec, plot_sweep, run_sweep
    from memplan.profiler.schema import format_validation_error

    if plot is not None and plot.suffix.lower() != ".png":
        raise ValueError(f"--plot: {str(plot)!r} should end in .png")
    check_output_path(plot, "--plot")  # before the sweep's runs
    try:
        body = SweepSpec.model_validate(read_json(spec, what="sweep"))
    except ValidationError as err:
        raise ValueError(format_validation_error(err, what="sweep")) from None
    if server:
        report = _on_server(server, body, plot, wait_s)
    else:
        from rich.progress import Progress

        with Progress(transient=True, console=console()) as bar:
            task = bar.add_task("sweep", total=None)
            map_cells = None
            if ray:  # the executor takes the map function; the Ray backend lives in the service
                from functools import partial

                from memplan.service.backends.ray_backend import map_cells as ray_map

                map_cells = partial(ray_map, address=ray)
            report = run_sweep(body, map_cells=map_cells,
                               progress=lambda done, total: bar.update(task, completed=done, total=total))
        if plot is not None:
            plot_sweep(report, plot)
    report = SweepReport.model_validate(report)
    if json_out:
        echo_json(report)
    else:
        _print(report, plot)
    if report.failed and not report.succeeded:  # no cell answered: not exit 0 (README, exit codes)
        typer.echo(f"sweep: every cell failed ({report.failed}); each cell's error says why", err=True)
        raise typer.Exit(1)


def _on_server(server: str, body, plot: Path | None, wait_s: float) -> dict:
    with remote(server) as c:
        sweep = c._json("POST", "/v1/sweeps", json=body.model_dump(mode="json"))
        deadline = time.monotonic() + wait_s
        while sweep["report"] is None:
            if time.monotonic() > deadline:
                raise ValueError(f"--wait: sweep {sweep['id']} not finished after {wait_s:g} s "
                                 f"({sweep['finished']}/{sweep['n_cells']} cells)")
            time.sleep(1.0)
            sweep = c._json("GET", f"/v1/sweeps/{sweep['id']}")
        if plot is not None:
            plot.write_bytes(c._request("GET", sweep["plot_url"]).content)
        return sweep["report"]


def _print(report, plot) -> None:
    from rich.table import Table

    from memplan.planner.units import format_bytes

    out = console()
    t = Table(title=f"sweep: {report.n_cells} cells, {report.ran} run, {report.runs_ok} ok")
    for col in ("#", "model", "precision", "strategy", "budget", "fixed/GPU", "peak", "measured",
                "error", "overhead", "run"):
        t.add_column(col, justify="left" if col in ("model", "precision", "strategy", "run") else "right")
    front = {i for v in report.pareto.values() for i in v}

    def fmt(b: int | None) -> str:
        return format_bytes(b) if b is not None else "-"

    for c in report.cells:
        t.add_row(
            f"{c.index}{'*' if c.index in front else ''}", c.label, c.precision, c.strategy,
            fmt(c.budget_bytes) if c.budget_bytes is not None else "none", fmt(c.fixed_bytes_per_gpu),
            fmt(c.predicted_peak_bytes) if c.feasible else "[red]infeasible[/red]",
            fmt(c.measured_peak_bytes),
            f"{c.peak_error_pct:+.2f}%" if c.peak_error_pct is not None else "-",
            f"+{c.predicted_overhead:.1%}" if c.predicted_overhead is not None else "-",
            c.run_status or (c.error or "-") if c.state == "succeeded" else f"[red]{c.state}: {c.error}[/red]",
        )
    out.print(t)
    out.print("* on the Pareto front of its model and precision (bytes per GPU, time)"
              + (f"; plot written to {plot}" if plot else ""))
