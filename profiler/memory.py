"""Exact allocated-memory accounting on the CPU and the GPU, the same way for every caller.

NOTE [ CPU memory accounting ]
The CPU caching-free allocator keeps no statistics, and process RSS or tracemalloc do not see
tensor storages. With `profile_memory=True`, the PyTorch profiler records every allocation and free
of the CPU allocator as a `[memory]` event with a signed byte count; summing them in order gives the
bytes allocated above the level at entry, and its running maximum the peak, exactly and repeatably.
On CUDA the caching allocator's own counters (`max_memory_allocated` after a reset) give the same
two numbers. The profiler's native start/stop lines go to stderr; they are silenced here because
they are noise in a CLI.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["MemoryMeter", "measure_memory"]


@dataclass
class MemoryMeter:
    """Bytes allocated on one device during a `measure_memory` block, relative to its start."""

    device: str
    peak_bytes: int = 0  # largest allocated level above the start level
    end_bytes: int = 0  # allocated level at the end, above the start level (may be negative)
    start_bytes: int = 0  # absolute allocated level at the start (CUDA only; 0 on the CPU)


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
    meter = MemoryMeter(device=str(dev))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        yield meter
        torch.cuda.synchronize(dev)
        meter.start_bytes = start
        meter.peak_bytes = torch.cuda.max_memory_allocated(dev) - start
        meter.end_bytes = torch.cuda.memory_allocated(dev) - start
        return
    if dev.type != "cpu":
        raise ValueError(f"device: memory accounting supports 'cpu' and 'cuda', not {dev.type!r}")
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_native_stderr():
        prof.__enter__()
    try:
        yield meter
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    level = peak = 0
    for event in prof.profiler.kineto_results.events():
        if event.name() == "[memory]" and event.device_type() == torch._C._autograd.DeviceType.CPU:
            level += event.nbytes()
            peak = max(peak, level)
    meter.peak_bytes, meter.end_bytes = peak, level
