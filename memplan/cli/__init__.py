"""`memplan <verb>`: one module per group of verbs, each a thin call into the library.

Command modules import only typer at the top; the library (and torch, where needed) is imported
inside each command, so that `memplan --help` is instant.
"""

from __future__ import annotations

import os

from memplan.cli import capacity as _capacity  # noqa: F401  (registers capacity)
from memplan.cli import frontier as _frontier  # noqa: F401  (registers frontier)
from memplan.cli import plan as _plan  # noqa: F401  (registers plan, simulate)
from memplan.cli import profile as _profile  # noqa: F401  (registers profile)
from memplan.cli import run as _run  # noqa: F401  (registers run)
from memplan.cli import serve as _serve  # noqa: F401  (registers serve, worker, info, runs)
from memplan.cli import size as _size  # noqa: F401  (registers size, fit)
from memplan.cli import sweep as _sweep  # noqa: F401  (registers sweep)
from memplan.cli._app import app

__all__ = ["app", "main"]


def quiet_torch_native_warnings() -> None:
    """Before torch loads: keep PyTorch's C++ warnings (e.g. the profiler's note on blocks
    allocated before it started, which memory accounting provokes by design) out of the output."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def main() -> None:
    """Entry point of the `memplan` console script."""
    quiet_torch_native_warnings()
    app()
