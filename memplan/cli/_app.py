"""The typer application every command module registers on, and the helpers they share."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

__all__ = ["app", "user_errors", "read_json", "echo_json", "console", "given_options",
           "check_output_path", "LeanLossOption", "ReuseLogitsOption"]

app = typer.Typer(
    name="memplan",
    help="Measure, plan, prove and size activation checkpointing for training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])

# the head's loss, for the commands that build or price a Hugging Face model (profile --hf-config,
# run --hf-config, capacity): one meaning everywhere, as memplan.lean_loss(model, reuse_logits=)
LeanLossOption = Annotated[bool, typer.Option(
    "--lean-loss", help="the model computes its loss with memplan.lean_loss: the logits and "
    "per-token log-sum-exps saved, no log-softmax (docs/apply.md, \"A lean loss\")")]
ReuseLogitsOption = Annotated[bool, typer.Option(
    "--reuse-logits", help="with --lean-loss: its backward writes the logits' gradient over the "
    "logits, one N x V tensor less at the head's peak (for loops that read only the loss)")]


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


def given_options(ctx: typer.Context, *params: str) -> list[str]:
    """The flags (`--n-layer`) of those of the command's `params` (their Python names) that the
    user set on the command line or through the environment, in the order given; defaults do not
    count. `ctx`: the command's `typer.Context`."""
    by_name = {p.name: p for p in ctx.command.params}
    set_by_user = ("COMMANDLINE", "ENVIRONMENT")
    return [max(by_name[n].opts, key=len) for n in params
            if getattr(ctx.get_parameter_source(n), "name", None) in set_by_user]


def check_output_path(path: Path | None, flag: str) -> None:
    """Refuse, before any work, an output path (`flag`'s) that cannot be written: in a folder that
    does not exist, or a folder itself. None (not asked for) passes."""
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"{flag}: {str(path)!r} is a folder; give a file name")
    if not path.parent.is_dir():
        raise ValueError(f"{flag}: the folder {str(path.parent)!r} does not exist; create it or "
                         "write elsewhere")


def read_json(path: Path, *, what: str) -> Any:
    """Parsed JSON from `path`; errors name the file, and the line and column of bad JSON."""
    if str(path) == "-":
        text = sys.stdin.read()
    else:
        if not path.exists():
            raise ValueError(f"{what}: no such file {str(path)!r}")
        if path.is_dir():
            raise ValueError(f"{what}: {str(path)!r} is a folder; give a JSON file")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ValueError(f"{what}: cannot read {str(path)!r} ({reason})") from None
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
