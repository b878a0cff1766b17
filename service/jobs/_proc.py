"""Process plumbing shared by the worker and the runner: parent-death signals, import by path."""

from __future__ import annotations

import ctypes
import importlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["die_with_parent", "import_object"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies (prctl PR_SET_PDEATHSIG), so a
    runner never outlives a worker killed with -9. Returns False where that is unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - non-glibc systems
        log.debug("prctl unavailable; relying on parent polling")
        return False


def import_object(path: str) -> Callable[..., Any]:
    """The object named 'package.module:attribute'. Raises ValueError naming the path."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"job function {path!r}: write it as 'package.module:function'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"job function {path!r} cannot be imported: {err}") from err
