"""`--server URL`: the one option every command with an endpoint takes, and its client.

In a command module (one parameter, one branch):

    from memplan.cli._remote import ServerOption, remote

    def plan_cmd(..., server: ServerOption = None):
        if server:
            data = remote(server).plan(profile_dict, budget_bytes=..., strategy=...)
"""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["ServerOption", "remote", "finished_result"]

ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar="MEMPLAN_SERVER",
        help="run on a memplan server (URL, e.g. http://gpu-node:8000; API key from $MEMPLAN_API_KEY)",
    ),
]


def remote(server: str):
    """A `memplan.client.Client` for `server` (imported lazily: `memplan --help` stays instant)."""
    from memplan.client import Client

    return Client(server)


def finished_result(job: dict) -> dict:
    """The `result` of a finished job, or a ValueError (one line, exit code 2) saying why it has none."""
    if job["state"] == "succeeded":
        return job["result"]
    err = job.get("error") or {}
    raise ValueError(f"server: job {job['id']} {job['state']}: {err.get('detail', job.get('message', ''))}")
