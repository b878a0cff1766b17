"""Host-device bandwidth: what the planner's `offload_bandwidth` is, measured on the device.

NOTE [ Measuring host bandwidth ]
1. Each direction copies `nbytes` between a device buffer and a pinned host buffer (page-locked:
   the copy engine reads it directly, as the executor's offload copies do) with
   non_blocking=True on a side stream, timed by CUDA events recorded on that stream around the
   copy; one untimed copy each way first (the driver maps the buffers on first use).
2. `repeats` timed copies per direction; the median's bytes per second is the answer (a slow
   outlier from another process's traffic does not move it).
3. The two directions are measured one after the other, not at once: the executor's offloads
   and fetches run on separate copy engines, and the chain model's rule (docs/chain-model.md
   section 10.9) uses one bandwidth for each direction alone.
4. On the CPU there is no device memory to move from: None, with the reason logged.
"""

from __future__ import annotations

import logging
import statistics

import torch

__all__ = ["measure_host_bandwidth", "DEFAULT_NBYTES"]

log = logging.getLogger(__name__)

DEFAULT_NBYTES = 256 * 2**20


def measure_host_bandwidth(device: torch.device | str, *, nbytes: int = DEFAULT_NBYTES,
                           repeats: int = 5) -> tuple[float, float] | None:
    """Copy `nbytes` between `device` and pinned host memory `repeats` times each way
    (NOTE [ Measuring host bandwidth ]).

    Returns (device-to-host, host-to-device) bandwidth in bytes per second (medians), or None
    when `device` is not a CUDA device or CUDA is not available (the reason is logged). Raises
    ValueError when `nbytes` or `repeats` is not a positive integer."""
    for name, v in (("nbytes", nbytes), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: a positive integer, got {v!r}")
    dev = torch.device(device)
    if dev.type != "cuda":
        log.info("host bandwidth: not measured on %s (no device memory to offload from; a CUDA "
                 "device is needed)", dev)
        return None
    if not torch.cuda.is_available():
        log.info("host bandwidth: not measured: CUDA is not available")
        return None
    side = torch.cuda.Stream(dev)
    device_buf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    host_buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    torch.cuda.current_stream(dev).synchronize()

    def timed(dst: torch.Tensor, src: torch.Tensor) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side):
            start.record(side)
            dst.copy_(src, non_blocking=True)
            end.record(side)
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # ms -> s

    timed(host_buf, device_buf)  # warm-up each way (NOTE point 1)
    timed(device_buf, host_buf)
    d2h = [timed(host_buf, device_buf) for _ in range(repeats)]
    h2d = [timed(device_buf, host_buf) for _ in range(repeats)]
    del device_buf, host_buf
    out = (nbytes / statistics.median(d2h), nbytes / statistics.median(h2d))
    log.info("host bandwidth on %s: device->host %.3g GB/s, host->device %.3g GB/s (%d bytes, "
             "median of %d)", dev, out[0] / 1e9, out[1] / 1e9, nbytes, repeats)
    return out
