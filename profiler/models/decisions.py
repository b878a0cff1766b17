"""Decisions that must not change when a stage is recomputed (MoE routing, early exits).

NOTE [ Decisions under recomputation ]
A recomputed forward must take the same data-dependent decisions as the first one, or the
gradients of the recompute belong to a different function than the one whose loss was computed.
Near ties in a router's top-k, capacity drops that depend on token order, and confidence
thresholds are all at risk (a bf16 recompute, a different kernel, or a changed counter is enough).
Modules therefore compute every such decision through `decide(key, compute)`:

- with no active log (a plain step, profiling): `compute()` is called and returned;
- inside `recording(log)` (the first forward of a planned step): `compute()` is called, and the
  result is stored in the log under `key` (repeated keys are kept in call order) and returned;
- inside `replaying(log)` (a recompute): the stored tensor is returned without calling `compute`,
  the n-th call for a key getting the n-th stored tensor; after the last one the sequence starts
  over, so a stage recomputed twice replays the same decisions (`log.rewind()` resets it).

`is_replaying()` tells modules to skip side effects that must happen once per step (expert
token counters, exit counters, statistics). The executor decides when to record and replay.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

__all__ = ["DecisionLog", "DecisionError", "decide", "recording", "replaying", "is_replaying"]


class DecisionError(ValueError):
    """A replay asked for a decision the log does not hold."""


class DecisionLog:
    """Tensors by key, in the order they were decided."""

    def __init__(self) -> None:
        self._store: dict[str, list[torch.Tensor]] = {}
        self._cursor: dict[str, int] = {}

    def append(self, key: str, value: torch.Tensor) -> None:
        """Store `value` as the next decision for `key`."""
        self._store.setdefault(key, []).append(value)

    def next(self, key: str) -> torch.Tensor:
        """The next stored decision for `key` (call order, wrapping around); raises `DecisionError`
        when the log holds none for it."""
        values = self._store.get(key)
        if not values:
            raise DecisionError(
                f"decision {key!r}: the log holds no decision for it; record the forward "
                "(recording(log)) before replaying it"
            )
        k = self._cursor.get(key, 0)
        # wrap around: a stage recomputed twice (multi-level schedules) replays the same sequence
        self._cursor[key] = (k + 1) % len(values)
        return values[k]

    def rewind(self) -> None:
        """Start replaying from the first decision of every key again."""
        self._cursor.clear()

    def clear(self) -> None:
        """Forget every decision."""
        self._store.clear()
        self._cursor.clear()

    def keys(self) -> list[str]:
        """Keys in first-decided order."""
        return list(self._store)

    def count(self, key: str) -> int:
        """How many decisions are stored for `key`."""
        return len(self._store.get(key, ()))

    def nbytes(self) -> int:
        """Bytes held by the stored tensors (unique storages)."""
        from memplan.profiler.tensors import storage_bytes

        return storage_bytes(self._store.values())

    def __len__(self) -> int:
        return sum(len(v) for v in self._store.values())

    def __contains__(self, key: object) -> bool:
        return key in self._store

    def __repr__(self) -> str:
        return f"DecisionLog({len(self)} decisions, {len(self._store)} keys)"


class _State:
    # process-global, not thread-local: on a GPU autograd runs the backward (and so a checkpoint's
    # recompute) on its own device thread, which must see the mode the executor set
    mode: str | None = None
    log: DecisionLog | None = None


_state = _State()


def _mode() -> tuple[str | None, DecisionLog | None]:
    return _state.mode, _state.log


@contextlib.contextmanager
def _active(mode: str, log: DecisionLog) -> Iterator[DecisionLog]:
    if not isinstance(log, DecisionLog):
        raise TypeError(f"log: expected a DecisionLog, got {type(log).__name__}")
    prev = _mode()
    _state.mode, _state.log = mode, log
    try:
        yield log
    finally:
        _state.mode, _state.log = prev


def recording(log: DecisionLog) -> contextlib.AbstractContextManager[DecisionLog]:
    """Inside the block, every `decide` computes its decision and appends it to `log`."""
    return _active("record", log)


def replaying(log: DecisionLog) -> contextlib.AbstractContextManager[DecisionLog]:
    """Inside the block, every `decide` returns the decision stored in `log` (call order per key,
    wrapping around), and `is_replaying()` is True."""
    return _active("replay", log)


def is_replaying() -> bool:
    """True inside `replaying(...)`: modules skip once-per-step side effects (counters, statistics)."""
    return _mode()[0] == "replay"


def decide(key: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A decision tensor for `key` that a recompute replays instead of recomputing (see the NOTE)."""
    mode, log = _mode()
    if mode is None or log is None:
        return compute()
    if mode == "replay":
        return log.next(key)
    value = compute()
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"decision {key!r}: compute() must return a tensor, got {type(value).__name__}")
    log.append(key, value)
    return value
