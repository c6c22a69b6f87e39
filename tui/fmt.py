"""Numbers as an operator reads them: short, fixed width where it matters, "-" for unknown."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

UNKNOWN = "-"


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite(value: Any) -> TypeGuard[int | float]:
    return is_number(value) and math.isfinite(value)


def integer(value: Any) -> str:
    """1234567 -> "1,234,567"."""
    if not finite(value):
        return UNKNOWN
    return f"{int(value):,}"


def loss(value: Any) -> str:
    if isinstance(value, str):  # the journal writes non-finite losses as "nan"/"inf"
        return value
    if not is_number(value):
        return UNKNOWN
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4f}"


def percent(fraction: Any, digits: int = 1) -> str:
    if not finite(fraction):
        return UNKNOWN
    return f"{fraction * 100:.{digits}f}%"


def compact(value: Any) -> str:
    """12880 -> "12.9k", 3.2e6 -> "3.20M"."""
    if not finite(value):
        return UNKNOWN
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            scaled = value / threshold
            return f"{scaled:.2f}{suffix}" if scaled < 10 else f"{scaled:.1f}{suffix}"
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def duration(seconds: Any) -> str:
    """Two units at most: "45s", "12m 05s", "3h 04m", "6d 02h"."""
    if not finite(seconds):
        return UNKNOWN
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def size(n: Any) -> str:
    if not finite(n):
        return UNKNOWN
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def gib(n: Any) -> str:
    return f"{n / 2**30:.1f}" if finite(n) else UNKNOWN
