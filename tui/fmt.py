"""Numbers as an operator reads them: short, fixed width where it matters, "-" for unknown."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeGuard

from rich.cells import cell_len, set_cell_size

from trainwarden.supervisor.journal_text import (
    compact_text,
    count_text,
    duration_text,
    loss_text,
    rate_text,
)
from trainwarden.supervisor.protocol import size_text

UNKNOWN = "-"


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite(value: Any) -> TypeGuard[int | float]:
    return is_number(value) and math.isfinite(value)


def integer(value: Any) -> str:
    """1234567 -> "1,234,567" (as `trainwarden status` writes it)."""
    return count_text(value)


def loss(value: Any) -> str:
    return loss_text(value)  # as `trainwarden events` writes it


def percent(fraction: Any, digits: int = 1) -> str:
    if not finite(fraction):
        return UNKNOWN
    return f"{fraction * 100:.{digits}f}%"


def compact(value: Any) -> str:
    """12880 -> "12.9k", 3.2e6 -> "3.20M"."""
    return compact_text(value)


def rate(value: Any) -> str:
    """Steps a minute: "3,515", "42.5"."""
    return rate_text(value)


def duration(seconds: Any) -> str:
    """Two units at most: "45s", "12m 05s", "3h 04m", "6d 02h"."""
    return duration_text(seconds)


def size(n: Any) -> str:
    """Binary units, the command line's too: "1.4 MiB"."""
    return size_text(n)


def gib(n: Any) -> str:
    return f"{n / 2**30:.1f}" if finite(n) else UNKNOWN


ELLIPSIS = "…"


def shorten(text: str, width: int) -> str:
    """`text` in at most `width` cells, its end replaced by "…" when it is longer."""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(width - 1, 0)) + ELLIPSIS


def fit(pieces: Sequence[str], width: int) -> str:
    """The pieces joined by spaces in at most `width` cells. When they do not fit, whole
    pieces are dropped from the end and "…" says so: a piece (a word, a key=value field)
    is never cut, so a number never shows as a shorter one."""
    text = " ".join(pieces)
    if cell_len(text) <= width:
        return text
    kept: list[str] = []
    used = 0
    for piece in pieces:
        needed = used + (1 if kept else 0) + cell_len(piece)
        if needed + 2 > width:  # leave room for " …"
            break
        kept.append(piece)
        used = needed
    if not kept and pieces:
        return _cut_outside_numbers(pieces[0], width)
    return " ".join([*kept, ELLIPSIS])


def _cut_outside_numbers(text: str, width: int) -> str:
    """The start of `text` and "…" in `width` cells, cut before a run of digits rather than
    inside it. A number that would end right at the "…" goes too, even whole: `226…` reads
    as a longer number cut short."""
    cut = set_cell_size(text, max(width - 1, 0)).rstrip()
    while cut and _in_number(cut[-1]) and (len(cut) >= len(text) or _in_number(text[len(cut)])):
        cut = cut[:-1]
    return cut.rstrip() + ELLIPSIS


def _in_number(char: str) -> bool:
    return char.isdigit() or char in ".,"
