"""A small pool of planning processes: the API's large plans run in a child process, which is
killed at the plan's time limit or when its client leaves (NOTE [ Planning processes ]).

`ComputePool.run(fn, *args, timeout_s=..., disconnected=...)` returns `fn(*args)` computed in a
child, or raises `ProblemError`: the function's own problem, 503 at the time limit, 500 when the
child died, and `ClientLeft` when the client went away.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

from memplan.service.problems import FieldError, ProblemError
from starlette.concurrency import run_in_threadpool

__all__ = ["ComputePool", "ClientLeft", "POLL_S", "START_TIMEOUT_S"]

log = logging.getLogger(__name__)

# NOTE [ Planning processes ]
# A thread cannot be stopped, so a plan whose estimated work (NOTE [ work estimate ] in
# planner/request.py) is above MEMPLAN_PLAN_PROCESS_MIN_STEPS, a capacity question and a fit run
# in a child process instead (NOTE [ Plans in the API process ] in service/routers/plans.py):
# 1. The children are fresh interpreters (`python -m memplan.service.compute_child`), never forks
#    of the API (its threads, locks and sockets), started lazily, at most `size` of them, each
#    reused for one task after another: the start (imports, the compiled kernel) costs seconds
#    (5-6 on the loaded 2-core machine), a task in a started child the pickling of its request and
#    answer (8 ms for a plan of 100 stages there).
# 2. A child dies with the API: PR_SET_PDEATHSIG fires when the *thread* that started it ends, so
#    children are started by the event loop's thread (never a pool thread, which ends when idle);
#    the child checks its parent right after setting it, and exits when the socket closes. (An
#    event loop run in a short-lived thread, as TestClient's without `with`, loses its children
#    with that thread: the next task finds its child dead and starts another.)
# 3. At the time limit (counted from the task's hand-over to a started child, not the child's
#    start, which START_TIMEOUT_S bounds) or when the client disconnects (polled every POLL_S
#    with `request.is_disconnected()`), the child is sent SIGTERM, SIGKILL after the grace, and
#    reaped before the answer (its pid is gone then); a new child is started in its place.
# 4. A child that dies during a task (a signal, an exit) is a 500 naming the signal; it is
#    replaced, and nothing else is affected. Its memory is limited (RLIMIT_AS, the setting
#    MEMPLAN_PLAN_PROCESS_MAX_BYTES): an allocation past it is a MemoryError there, answered as
#    the library's 422 `too-large` naming the limit, never the host running out.
# 5. Messages are tuples, pickled: the child sends ("ready", pid) once started, then for each task
#    ("ok", value), ("problem", a ProblemError's fields) or ("error", "Type: message"). Exceptions
#    are never pickled (ProblemError's constructor takes keywords, which unpickling loses).
POLL_S = 0.1
START_TIMEOUT_S = 120.0


class ClientLeft(Exception):
    """The client disconnected while its plan was computed (the child was killed)."""


class _Child:
    """One planning process and the API's end of its socket."""

    def __init__(self, max_bytes: int) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memplan.service.compute_child", str(os.getpid()),
                 str(theirs.fileno()), str(max_bytes)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Close the API's end, unwatched first: its fd number may be reused at once."""
        if not self.conn.closed:
            try:
                asyncio.get_running_loop().remove_reader(self.conn.fileno())
            except RuntimeError:  # no loop running (ComputePool.close at exit)
                pass
            self.conn.close()


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "an unknown cause"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


class ComputePool:
    """At most `size` planning processes, each limited to `max_bytes` of address space (0: no
    limit) and killed `kill_grace_s` after a SIGTERM it ignores."""

    def __init__(self, size: int, *, max_bytes: int, kill_grace_s: float) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.kill_grace_s = kill_grace_s
        self._idle: list[_Child] = []
        self._slots: asyncio.Semaphore | None = None
        self.started = 0  # children started, for the log and the tests
        self.killed = 0

    def pids(self) -> list[int]:
        """The pids of the idle children (busy ones are their requests')."""
        return [c.pid for c in self._idle]

    async def run(
        self, fn: Callable[..., Any], *args: Any, timeout_s: float,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> Any:
        """`fn(*args)` in a child (NOTE [ Planning processes ]): its value, or ProblemError (the
        function's own; 503 at `timeout_s` seconds; 500 when the child died), or ClientLeft when
        `disconnected()` turned true first. `fn` and `args` must pickle (module-level)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        acquire = asyncio.ensure_future(self._slots.acquire())
        try:
            await self._wait(acquire, None, disconnected)
        except BaseException:
            if acquire.done() and not acquire.cancelled():
                self._slots.release()  # acquired just as the client left
            raise
        child: _Child | None = None
        try:
            child = self._take()
            if not child.ready:
                starting, child = child, None  # _start keeps it, or kills it, whatever happens
                await self._start(starting, disconnected)
                child = starting
            await run_in_threadpool(child.conn.send, (fn, args))
            try:
                await self._wait(self._readable(child), time.monotonic() + timeout_s, disconnected)
            except TimeoutError:
                busy, child = child, None
                await self._replace(busy, "its time limit")
                raise ProblemError(
                    503, f"the plan was not done within this server's {timeout_s:g} s "
                    "(MEMPLAN_PLAN_TIMEOUT_S) and was stopped; try again later with smaller "
                    "options, or compute it locally (`memplan plan`, `memplan capacity`, "
                    "`memplan fit`), where no limit applies",
                    kind="timeout", headers={"Retry-After": str(max(1, int(timeout_s)))},
                ) from None
            try:
                kind, value = await run_in_threadpool(child.conn.recv)
            except (EOFError, OSError):
                busy, child = child, None
                raise await self._crashed(busy) from None
            self._idle.append(child)
            child = None
            return self._answer(kind, value)
        except ClientLeft:
            if child is not None:
                busy, child = child, None
                await self._replace(busy, "its client left")
            raise
        finally:
            if child is not None:  # cancelled, or an error between hand-over and answer
                await asyncio.shield(self._replace(child, "an interrupted request"))
            self._slots.release()

    def _take(self) -> _Child:
        while self._idle:
            child = self._idle.pop()
            if child.alive():
                return child
            log.warning("planning process %d had died while idle (%s); starting another",
                        child.pid, _signal_name(child.proc.returncode))
            child.close()
        return self._spawn()

    def _spawn(self) -> _Child:
        child = _Child(self.max_bytes)  # on the event loop's thread (NOTE [ Planning processes ], 2)
        self.started += 1
        log.info("planning process %d started (%d so far)", child.pid, self.started)
        return child

    async def _start(self, child: _Child, disconnected: Callable[[], Awaitable[bool]] | None) -> None:
        """Wait for `child`'s ready message. A 503 when it dies or does not start in time (it is
        killed); when the client leaves first (or the request is cancelled), it goes back to the
        pool still starting, for the next request."""
        why = None
        try:
            await self._wait(self._readable(child), time.monotonic() + START_TIMEOUT_S, disconnected)
        except TimeoutError:
            why = f"not ready within {START_TIMEOUT_S:g} s"
        except BaseException:
            self._idle.append(child)
            raise
        else:
            try:
                kind, _ = await run_in_threadpool(child.conn.recv)
            except (EOFError, OSError):
                kind = "closed"
            except BaseException:
                await asyncio.shield(self._kill(child))
                raise
            if kind == "ready":
                child.ready = True
                return
        if why is None:
            await asyncio.sleep(0.05)  # its exit, if it is exiting
            why = ("it ended with " + _signal_name(child.proc.returncode) if not child.alive()
                   else "its first message was not 'ready'")
        await self._kill(child)
        log.error("planning process %d did not start: %s", child.pid, why)
        raise ProblemError(
            503, f"the planning process did not start ({why}; the server's log has its "
            "output); try again later",
            kind="unavailable", headers={"Retry-After": "5"},
        )

    def _readable(self, child: _Child) -> asyncio.Future:
        """A future done when the child's socket has a message, or has closed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fd = child.conn.fileno()

        def ready() -> None:
            loop.remove_reader(fd)
            if not fut.done():
                fut.set_result(None)

        def unwatch(_: asyncio.Future) -> None:
            # runs later (call_soon): once the socket is closed, `fd` may be another's
            if not child.conn.closed:
                loop.remove_reader(fd)

        loop.add_reader(fd, ready)
        fut.add_done_callback(unwatch)
        return fut

    @staticmethod
    async def _wait(fut: asyncio.Future, deadline: float | None,
                    disconnected: Callable[[], Awaitable[bool]] | None) -> None:
        """Until `fut` is done: TimeoutError past `deadline` (monotonic seconds), ClientLeft when
        `disconnected()`; `fut` is cancelled on either."""
        try:
            while True:
                wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait({fut}, timeout=wait)
                if done:
                    fut.result()
                    return
                if disconnected is not None and await disconnected():
                    raise ClientLeft
        except BaseException:
            fut.cancel()
            raise

    async def _kill(self, child: _Child) -> None:
        """SIGTERM, SIGKILL after the grace, then reaped: the pid is gone when this returns."""
        child.close()
        if child.alive():
            child.proc.terminate()
            deadline = time.monotonic() + self.kill_grace_s
            while child.alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if child.alive():
                child.proc.kill()
        deadline = time.monotonic() + 10.0
        while child.alive():  # reaped by poll(); a SIGKILL takes effect in milliseconds
            if time.monotonic() > deadline:  # stuck in the kernel: the next poll() reaps it
                log.error("planning process %d has not died 10 s after SIGKILL", child.pid)
                break
            await asyncio.sleep(0.005)

    async def _replace(self, child: _Child, why: str) -> None:
        """Kill `child` for `why` and start another in its place."""
        await self._kill(child)
        self.killed += 1
        log.warning("planning process %d stopped: %s", child.pid, why)
        self._idle.append(self._spawn())

    async def _crashed(self, child: _Child) -> ProblemError:
        """The 500 for `child`, which died during a task, once it is reaped and replaced."""
        await self._kill(child)
        why = _signal_name(child.proc.returncode)
        log.error("planning process %d died of %s during a task", child.pid, why)
        self._idle.append(self._spawn())
        return ProblemError(
            500, f"the planning process died of {why} while computing this request; the "
            "server is unaffected and has started another: report the request (it may find a bug "
            "in the planner), or plan locally with `memplan plan`", kind="plan-crashed",
        )

    def _answer(self, kind: str, value: Any) -> Any:
        if kind == "ok":
            return value
        if kind == "problem":
            detail = value["detail"]
            if value.get("kind") == "too-large" and self.max_bytes:
                detail += (f" (a planning process may use {self.max_bytes} bytes: "
                           "MEMPLAN_PLAN_PROCESS_MAX_BYTES)")
            raise ProblemError(
                value["status"], detail, kind=value.get("kind"), headers=value.get("headers"),
                errors=[FieldError(**e) for e in value.get("errors") or ()] or None,
                **(value.get("extra") or {}),
            )
        log.error("planning process: %s", value)
        raise ProblemError(500, "internal error in the planning process; the server's log has "
                           "the details", kind="internal")

    def close(self) -> None:
        """Kill every idle child now (synchronously); busy ones end with their requests."""
        while self._idle:
            child = self._idle.pop()
            child.close()
            if child.alive():
                child.proc.kill()
            child.proc.wait()
