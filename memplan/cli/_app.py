"""The typer application every command module registers on, and the helpers they share."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

__all__ = ["app", "user_errors", "read_json", "echo_json", "console"]

app = typer.Typer(
    name="memplan",
    help="Measure, plan, prove and size activation checkpointing for training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def console():
    """A rich console on stdout (imported lazily: `memplan --help` stays instant)."""
    from rich.console import Console

    return Console(highlight=False)


def user_errors(fn: F) -> F:
    """Bad input becomes one line on stderr and exit code 2, never a traceback.

    Set MEMPLAN_DEBUG=1 to see the traceback instead."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, OSError, KeyError) as err:
            if os.environ.get("MEMPLAN_DEBUG"):
                raise
            msg = str(err) if not isinstance(err, KeyError) else f"missing key {err}"
            typer.echo(f"error: {msg}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def read_json(path: Path, *, what: str) -> Any:
    """Parsed JSON from `path`; errors name the file, and the line and column of bad JSON."""
    if str(path) == "-":
        text = sys.stdin.read()
    else:
        if not path.exists():
            raise ValueError(f"{what}: no such file {str(path)!r}")
        text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{what}: {path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        ) from None


def echo_json(data: Any) -> None:
    """Print `data` (a pydantic model or JSON-able value) as indented JSON on stdout."""
    if hasattr(data, "model_dump_json"):
        typer.echo(data.model_dump_json(indent=2))
    else:
        typer.echo(json.dumps(data, indent=2))
