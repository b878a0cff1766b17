"""The child side of the planning processes (service/compute.py): `python -m
memplan.service.compute_child PARENT_PID FD MAX_BYTES`.

It dies with the API, limits its own memory, loads the planner once, says it is ready, then runs
one task at a time from the socket `FD`: a task is `(function, args)` pickled by
`multiprocessing.connection`, and its answer one of the messages of NOTE [ Planning processes ]
in service/compute.py, 5 (never a pickled exception).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
from typing import Any

__all__ = ["main", "answer"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the thread that started it ends (Linux), and exit now when that
    parent is already gone (the signal only covers deaths after the call)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _limit_memory(max_bytes: int) -> None:
    """Address space of this process at most `max_bytes` (0: no limit): allocations past it are
    a MemoryError (numpy's and numba's arrays too), not the host's memory running out."""
    if max_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))


def _warm() -> None:
    """Import the routers' planning functions and load the compiled kernel with a tiny plan, so
    that a request's time limit is spent on its own plan."""
    import memplan.service.routers.plans  # noqa: F401 - what the tasks name
    from memplan.planner.request import plan_request

    from memplan import planner

    layers = [{"name": f"l{i}", "forward_s": 1e-3, "backward_s": 2e-3, "output_bytes": 100,
               "saved_bytes": 400} for i in range(4)]
    planner.plan_for(plan_request(profile={"name": "warm", "input_bytes": 100, "layers": layers},
                                  budget_bytes=1000))


def answer(fn: Any, args: tuple) -> tuple[str, Any]:
    """`fn(*args)` as a message: ("ok", value), ("problem", ProblemError's fields) or ("error",
    "Type: message")."""
    from memplan.service.problems import ProblemError

    try:
        return ("ok", fn(*args))
    except ProblemError as err:
        return ("problem", {
            "status": err.status, "detail": err.detail, "kind": err.kind, "headers": err.headers,
            "errors": [e.model_dump() for e in err.errors or ()], "extra": err.extra,
        })
    except MemoryError:
        # outside call_library (which answers its own MemoryError as a 422 too)
        return ("problem", {"status": 422, "kind": "too-large", "detail": "the input is too large "
                            "to compute in this server's memory; use smaller options or fewer "
                            "stages"})
    except Exception as err:  # noqa: BLE001 - answered as a 500, logged by the API
        return ("error", f"{type(err).__name__}: {err}")


def main(argv: list[str]) -> int:
    """Serve tasks until the API closes the socket; returns the exit status."""
    parent, fd, max_bytes = int(argv[0]), int(argv[1]), int(argv[2])
    _die_with_parent(parent)
    _limit_memory(max_bytes)
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    _warm()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):  # the API closed its end (or exited): nothing left to do
            return 0
        try:
            conn.send(answer(fn, args))
        except (BrokenPipeError, ConnectionResetError):
            return 0
        except Exception as err:  # noqa: BLE001 - the value did not pickle (or not in memory)
            conn.send(answer(_raise, (err,)))


def _raise(err: BaseException) -> None:
    raise err


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
