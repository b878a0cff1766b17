"""Exact allocated-memory accounting on the CPU and the GPU, the same way for every caller.

NOTE [ CPU memory accounting ]
The CPU caching-free allocator keeps no statistics, and process RSS or tracemalloc do not see
tensor storages. With `profile_memory=True`, the PyTorch profiler records every allocation and free
of the CPU allocator as a `[memory]` event with a signed byte count; summing them in order gives the
bytes allocated above the level at entry, and its running maximum the peak, exactly and repeatably.
On CUDA the caching allocator's own counters (`max_memory_allocated` after a reset) give the same
two numbers. The profiler's native start/stop lines go to stderr; they are silenced here because
they are noise in a CLI.

The rules, on the CPU:

1. Only blocks allocated inside the measured block count: freeing a tensor allocated before it
   changes nothing (PyTorch warns "Memory block of unknown size was allocated before the profiling
   started" for some of these). So measure a forward and its backward in one block, and split it
   with `meter.mark(label)`: a mark allocates and frees a sentinel of a size no tensor has, which
   shows where the phase starts in the event stream (and is left out of the counts).
   `meter.phases[label]` then gives the level at the phase's start, its peak and its end, all
   relative to the block's start. On CUDA a mark reads and resets the allocator's counters.
2. Rule 1 is enforced by address, not left to the profiler. The CPU allocator's reporter keeps a
   size per address for every block allocated while memory profiling is on, and forgets it only
   when the free happens while profiling is on. A block allocated in one measurement and freed
   outside any leaves its size behind; a later block at the same address, allocated outside and
   freed inside a measurement, is then reported as a free of that stale size, as often as malloc
   happens to reuse the address. So each free is matched by address to an allocation the block
   saw, and the rest are dropped.
3. A module that keeps tensors across forwards as plain attributes (torchao's fake quantizers
   keep their last scale and zero point) looks as if it grew by them at every forward inside a
   block: the new ones are allocated in it, the old ones were made before it and their free does
   not count. CUDA's counters have no such blind spot.
4. Python's cyclic garbage collector is paused inside the block, so that a reference cycle frees
   its tensors where the code drops it, not wherever a collection happens to run.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._profiler import _EventType

__all__ = ["MemoryMeter", "Phase", "measure_memory"]

_SENTINEL_BASE = 7_340_033  # odd sizes no tensor storage of ours has; one per mark
_FIRST = "start"


@dataclass
class Phase:
    """Bytes of one phase of a `measure_memory` block, relative to the block's start."""

    start_bytes: int = 0  # allocated level when the phase began
    peak_bytes: int = 0  # largest allocated level during the phase
    end_bytes: int = 0  # allocated level when it ended


@dataclass
class MemoryMeter:
    """Bytes allocated on one device during a `measure_memory` block, relative to its start."""

    device: str
    peak_bytes: int = 0  # largest allocated level above the start level
    end_bytes: int = 0  # allocated level at the end, above the start level (may be negative)
    start_bytes: int = 0  # absolute allocated level at the start (CUDA only; 0 on the CPU)
    phases: dict[str, Phase] = field(default_factory=dict)  # by label; the first is "start"
    _labels: list[str] = field(default_factory=list, repr=False)
    _cuda_marks: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def mark(self, label: str) -> None:
        """End the current phase and start one named `label` (unique within the block)."""
        if label in self._labels or label == _FIRST:
            raise ValueError(f"label: phase {label!r} already exists; give each mark a new label")
        dev = torch.device(self.device)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            self._cuda_marks.append(
                (torch.cuda.memory_allocated(dev), torch.cuda.max_memory_allocated(dev))
            )
            torch.cuda.reset_peak_memory_stats(dev)
        else:
            sentinel = torch.empty(_SENTINEL_BASE + 2 * len(self._labels), dtype=torch.uint8)
            del sentinel
        self._labels.append(label)


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    try:
        fd = os.dup(2)
    except OSError:  # no stderr to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(fd, 2)
    finally:
        os.close(fd)


@contextlib.contextmanager
def measure_memory(device: str | torch.device = "cpu") -> Iterator[MemoryMeter]:
    """Measure allocated bytes on `device` inside the block; fills the yielded `MemoryMeter` on exit.

    Not re-entrant on the CPU (one profiler at a time)."""
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: memory accounting supports 'cpu' and 'cuda', not {dev.type!r}")
    enabled = gc.isenabled()
    gc.disable()
    try:
        with _measure(dev) as meter:
            yield meter
    finally:
        if enabled:
            gc.enable()


def _deltas_of_blocks_seen(results: Any) -> list[int]:
    """The CPU allocator's signed byte counts in the profiled block, in order, less the frees of
    blocks allocated before it (NOTE [ CPU memory accounting ], rules 1 and 2)."""
    cpu = torch._C._autograd.DeviceType.CPU
    ptrs: dict[tuple[int, int], list[int]] = {}  # (start ns, bytes) -> addresses, in tree order
    stack = list(reversed(results.experimental_event_tree()))
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            f = e.extra_fields
            ptrs.setdefault((e.start_time_ns, f.alloc_size), []).append(f.ptr)
        stack.extend(reversed(e.children))
    live: set[int] = set()
    deltas = []
    for e in results.events():
        if e.name() != "[memory]" or e.device_type() != cpu:
            continue
        n = e.nbytes()
        at = ptrs.get((e.start_ns(), n))
        ptr = at.pop(0) if at else None
        if n > 0:
            live.add(ptr)
        elif ptr is not None:
            if ptr not in live:
                continue  # allocated before the block: a size the profiler kept from earlier
            live.discard(ptr)
        deltas.append(n)
    return deltas


@contextlib.contextmanager
def _measure(dev: torch.device) -> Iterator[MemoryMeter]:
    meter = MemoryMeter(device=str(dev))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        yield meter
        torch.cuda.synchronize(dev)
        meter.start_bytes = start
        marks = [*meter._cuda_marks, (torch.cuda.memory_allocated(dev), torch.cuda.max_memory_allocated(dev))]
        level = 0
        for label, (now, peak) in zip([_FIRST, *meter._labels], marks, strict=True):
            meter.phases[label] = Phase(level, peak - start, now - start)
            level = now - start
        meter.peak_bytes = max(p.peak_bytes for p in meter.phases.values())
        meter.end_bytes = level
        return
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_native_stderr():
        prof.__enter__()
    try:
        yield meter
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    sentinels = {_SENTINEL_BASE + 2 * k: label for k, label in enumerate(meter._labels)}
    deltas = _deltas_of_blocks_seen(prof.profiler.kineto_results)
    level = peak = 0
    phase = Phase()
    label = _FIRST
    k = 0
    while k < len(deltas):
        d = deltas[k]
        if d in sentinels and k + 1 < len(deltas) and deltas[k + 1] == -d:
            phase.peak_bytes, phase.end_bytes = max(phase.peak_bytes, level), level
            meter.phases[label] = phase
            label = sentinels.pop(d)
            phase = Phase(level, level, level)
            k += 2
            continue
        level += d
        peak = max(peak, level)
        phase.peak_bytes = max(phase.peak_bytes, level)
        k += 1
    phase.end_bytes = level
    meter.phases[label] = phase
    if sentinels:
        raise RuntimeError(
            f"memory accounting: the marks {sorted(sentinels.values())} were not found in the "
            "profiler's events; mark only inside the measure_memory block"
        )
    meter.peak_bytes, meter.end_bytes = peak, level
