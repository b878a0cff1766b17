"""GPU presets: each device's memory and peak dense bf16 rate, from the vendors' data sheets.

One table serves every answer that names a device: `memplan capacity --device` (planner/capacity.py)
and the memory-aware sizing's time estimate (planner/scaling/memory_aware.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from memplan.planner.schema import PlanError

__all__ = ["DevicePreset", "DEVICES", "device_preset"]


@dataclass(frozen=True)
class DevicePreset:
    """A GPU's memory and its peak dense bf16 rate (vendor data sheets)."""

    name: str  # the product
    memory_bytes: int  # device memory, bytes (the vendor's nominal GiB; the driver and the
    # CUDA context take some of it: give --memory for the exact figure of a machine)
    peak_bf16_flops: float  # dense bf16 tensor FLOP/s (no sparsity)
    source: str  # where the numbers come from


_GiB = 1 << 30
DEVICES: dict[str, DevicePreset] = {
    "a100-40gb": DevicePreset("NVIDIA A100 40GB", 40 * _GiB, 312e12, "NVIDIA A100 datasheet (2021)"),
    "a100-80gb": DevicePreset("NVIDIA A100 80GB", 80 * _GiB, 312e12, "NVIDIA A100 datasheet (2021)"),
    "h100": DevicePreset("NVIDIA H100 SXM 80GB", 80 * _GiB, 989e12, "NVIDIA H100 datasheet (2023)"),
    "h200": DevicePreset("NVIDIA H200 SXM 141GB", 141 * _GiB, 989e12, "NVIDIA H200 datasheet (2024)"),
    "l40s": DevicePreset("NVIDIA L40S 48GB", 48 * _GiB, 362.05e12, "NVIDIA L40S datasheet (2023)"),
    "rtx4090": DevicePreset("NVIDIA GeForce RTX 4090 24GB", 24 * _GiB, 165.2e12,
                            "NVIDIA Ada Lovelace architecture whitepaper (bf16, fp32 accumulate)"),
    "mi300x": DevicePreset("AMD Instinct MI300X 192GB", 192 * _GiB, 1307.4e12, "AMD MI300X datasheet (2023)"),
}
_ALIASES = {"a100": "a100-80gb", "a100-80": "a100-80gb", "a100-40": "a100-40gb", "h100-80gb": "h100",
            "h200-141gb": "h200", "4090": "rtx4090", "rtx-4090": "rtx4090"}


def device_preset(name: str) -> DevicePreset:
    """The preset called `name` (case-insensitive; e.g. h100, a100-40gb). Raises PlanError naming
    the field `device` and the known presets."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DEVICES:
        raise PlanError(f"device: unknown preset {name!r}; choose one of {', '.join(DEVICES)}")
    return DEVICES[key]
