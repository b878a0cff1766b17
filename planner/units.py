"""Human byte sizes in and out: '24GiB', '1.5e9', '512MB' <-> integers. Pure Python, shared by the planner's
requests, the CLI and the service (the lowest layer that reads sizes from people)."""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["parse_bytes", "format_bytes"]

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "p": 10**15, "pb": 10**15, "e": 10**18, "eb": 10**18,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50, "eib": 2**60,
}
_PATTERN = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, *, field: str = "budget") -> int:
    """Bytes (int) from '24GiB', '80GB', '1.5e9' or an integer. Raises ValueError naming `field`."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{field}: must be at least 0 bytes, got {text}")
        return text
    m = _PATTERN.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(
            f"{field}: cannot read {text!r} as a size; write e.g. 24GiB, 80GB, 512MiB or 1500000000"
        )
    unit = _UNITS[m.group(2).lower()]
    value = float(m.group(1)) * unit
    if value < 0:
        raise ValueError(f"{field}: must be non-negative (at least 0 bytes), got {text!r}")
    if not math.isfinite(value):
        raise ValueError(f"{field}: {text!r} is not a finite size")
    if value < 2**64:  # exact (a float has 53 bits: 2^53 + 1 bytes would come back changed)
        return round(Fraction(m.group(1)) * unit)
    return int(value)  # past every ceiling: the caller refuses it, the digits do not matter


def format_bytes(n: int | float | None) -> str:
    """'1.50 GiB' style (binary units), or '-' for None."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
