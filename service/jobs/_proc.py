"""Process plumbing shared by the worker and the runner: parent-death signals (set at spawn and
checked at start), process identity (pid and start time), import by path."""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["die_with_parent", "import_object", "spawn_with_parent_death", "start_ticks", "cmdline"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - non-glibc systems
        return None


# resolved once, in the parent: the child between fork and exec only calls it (no dlopen there)
_PRCTL = _load_prctl()


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies (prctl PR_SET_PDEATHSIG), so a
    runner never outlives a worker killed with -9. Returns False where that is unavailable."""
    if _PRCTL is None:
        log.debug("prctl unavailable; relying on parent polling")
        return False
    return _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def spawn_with_parent_death(parent_pid: int, sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen` that, in the child between fork and exec, asks for
    `sig` when the parent dies and then exits at once (status 70) if the parent is already gone.

    NOTE [ A runner dies with its worker from its first instruction ]
    The parent-death signal survives exec, so set here it covers the child from before its first
    Python instruction; set by the child itself after its imports (as it once was), a worker killed
    during those imports left the runner alive, orphaned, while the next worker started the same
    job again. The signal is sent when the parent dies *after* prctl; the getppid() check right
    after it covers a parent that died between the fork and prctl (the child was then adopted by
    init, or a subreaper, and getppid() no longer returns `parent_pid`). The runner repeats the
    check at start (its own argument `--parent`) and its watchdog keeps checking, which also
    covers systems without prctl."""

    def _preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(70)

    return _preexec


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22), which with
    the pid names one process even after the pid is reused; None when there is no such process
    (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may itself hold spaces or parentheses
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def cmdline(pid: int) -> list[str]:
    """The process's argument vector ([] when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def import_object(path: str) -> Callable[..., Any]:
    """The object named 'package.module:attribute'. Raises ValueError naming the path."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"job function {path!r}: write it as 'package.module:function'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"job function {path!r} cannot be imported: {err}") from err
