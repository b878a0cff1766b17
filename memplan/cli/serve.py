"""`memplan serve` (the REST service), `memplan worker` (a job worker alone), and the commands of
the endpoints no other command covers: `memplan runs list|show|cancel|watch`, `memplan info`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from memplan.cli._app import app, console, echo_json, user_errors
from memplan.cli._remote import remote

runs_app = typer.Typer(help="Validation runs on a memplan server: list, show, cancel, watch.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")

_SERVER_DEFAULT = "http://127.0.0.1:8000"
Server = Annotated[
    str,
    typer.Option("--server", envvar="MEMPLAN_SERVER", help="the server's URL (API key from $MEMPLAN_API_KEY)"),
]
RunId = Annotated[str, typer.Argument(help="the run's id")]
JsonOut = Annotated[bool, typer.Option("--json")]


def _env(**values: object) -> None:
    for key, value in values.items():
        if value is not None:
            os.environ[f"MEMPLAN_{key.upper()}"] = str(value)


@app.command("serve")
@user_errors
def serve_cmd(
    host: Annotated[str | None, typer.Option(help="address to bind (default 127.0.0.1; 0.0.0.0 in Docker)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default 8000)")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="folder of the job store (default .memplan)")] = None,
    worker: Annotated[bool, typer.Option(help="start the job worker beside the API")] = True,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level")] = "info",
) -> None:
    """Start the REST service (uvicorn service.app:app); every MEMPLAN_* variable applies."""
    if port is not None and not 0 <= port <= 65535:
        raise ValueError(f"--port: {port} is not a port number (0-65535)")
    _env(host=host, port=port, data_dir=data_dir, start_worker=None if worker else "false")
    import uvicorn

    from memplan.service.settings import Settings

    settings = Settings()
    # an open event stream would otherwise hold a SIGTERM'd server (and its worker) up for as
    # long as its client stays
    uvicorn.run("memplan.service.app:app", host=settings.host, port=settings.port, log_level=log_level,
                timeout_graceful_shutdown=settings.shutdown_grace_s)


@app.command("worker")
@user_errors
def worker_cmd(
    data_dir: Annotated[Path | None, typer.Option(help="folder of the job store (default .memplan)")] = None,
) -> None:
    """Run a job worker alone (beside `memplan serve --no-worker`, or as a hot standby)."""
    _env(data_dir=data_dir)
    from memplan.service.jobs.worker import main

    raise typer.Exit(main([]))


@app.command("info")
@user_errors
def info_cmd(
    server: Server = _SERVER_DEFAULT,
    json_out: Annotated[bool, typer.Option("--json", help="print the server's JSON")] = False,
) -> None:
    """A server's versions, device, limits and readiness."""
    with remote(server) as c:
        info = c.info()
    if json_out:
        echo_json(info)
        return
    out = console()
    dev = info.get("device") or {}
    out.print(f"memplan {info['versions'].get('memplan')} at {server}")
    out.print(f"device: {dev.get('kind', 'unknown')} {dev.get('name', '')}".rstrip())
    out.print(f"strategies: {', '.join(info['strategies'])}")
    out.print("limits: " + ", ".join(f"{k}={v}" for k, v in info["limits"].items()))


def _job_line(job: dict) -> str:
    err = (job.get("error") or {}).get("detail", "")
    return f"{job['id']}  {job['state']:<9}  {job['progress']:>5.0%}  {job['message']}" + (f"  ({err})" if err else "")


def _print_job(job: dict, json_out: bool) -> None:
    if json_out:
        echo_json(job)
    else:
        typer.echo(_job_line(job))


@runs_app.command("list")
@user_errors
def runs_list(
    server: Server = _SERVER_DEFAULT,
    state: Annotated[str | None, typer.Option(help="queued, running, succeeded, failed, cancelled")] = None,
    limit: Annotated[int, typer.Option(help="how many, newest first")] = 20,
    json_out: JsonOut = False,
) -> None:
    """The server's runs, newest first."""
    with remote(server) as c:
        page = c.jobs("runs", state=state, limit=limit)
    if json_out:
        echo_json(page)
        return
    for job in page["items"]:
        typer.echo(_job_line(job))


@runs_app.command("show")
@user_errors
def runs_show(run_id: RunId, server: Server = _SERVER_DEFAULT, json_out: JsonOut = False) -> None:
    """One run: state, progress, result or error."""
    with remote(server) as c:
        job = c.job("runs", run_id)
    _print_job(job, json_out)


@runs_app.command("cancel")
@user_errors
def runs_cancel(run_id: RunId, server: Server = _SERVER_DEFAULT, json_out: JsonOut = False) -> None:
    """Cancel a run (a running one is stopped and its device memory freed)."""
    with remote(server) as c:
        job = c.cancel("runs", run_id)
    _print_job(job, json_out)


@runs_app.command("watch")
@user_errors
def runs_watch(
    run_id: RunId,
    server: Server = _SERVER_DEFAULT,
    json_out: Annotated[bool, typer.Option("--json", help="print each event as a JSON line")] = False,
) -> None:
    """Follow a run's progress (server-sent events) until it ends; exit 1 unless it succeeded."""
    import json

    final: dict = {}
    with remote(server) as c:
        if json_out:
            for event, data in c.events(run_id):
                typer.echo(json.dumps({"event": event, "data": data}))
                if event == "end":
                    final = data
        else:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task(f"run {run_id[:8]}", total=1.0)
                for event, data in c.events(run_id):
                    if event == "progress":
                        bar.update(task, completed=data["progress"], description=data.get("message") or "running")
                    if event == "end":
                        final = data
            typer.echo(_job_line(final))
    if final.get("state") != "succeeded":
        raise typer.Exit(1)
