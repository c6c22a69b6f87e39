"""Queries over a history's steps and losses at one moment: decimated to buckets that
keep min, mean, max and the count of non-finite losses, from any thread."""

from __future__ import annotations

import contextlib
import math
import mmap
from typing import Any

import numpy as np

from trainwarden.supervisor.core.shapes import LossBuckets

QUERY_CHUNK_ROWS = 1 << 20
"""Rows a query reduces at a time: its temporaries stay a few MB however long the range."""


class HistoryView:
    """Steps and losses of a history at one moment, in parts whose steps increase across
    them; nothing here changes after it is made, so any thread may query it."""

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.parts = parts

    def query(
        self, start: int | None = None, end: int | None = None, points: int = 1000
    ) -> LossBuckets:
        """Steps start..end (inclusive) decimated to at most `points` buckets of equal step width.

        Per bucket: its first step and the min, mean and max of its finite losses (None
        when it has none) plus `nonfinite`, how many nan/inf losses it holds, so a
        divergence stays visible at any zoom without putting nan into JSON.
        """
        if points < 1:
            raise ValueError(f"points must be >= 1, got {points}")
        ranges = []
        for steps, losses in self.parts:
            i0 = 0 if start is None else int(np.searchsorted(steps, start, side="left"))
            i1 = len(steps) if end is None else int(np.searchsorted(steps, end, side="right"))
            if i1 > i0:
                ranges.append((steps, losses, i0, i1))
        count = sum(i1 - i0 for _, _, i0, i1 in ranges)
        if not count:
            return _buckets([], [], [], [], [], None, None, 0)
        first = int(ranges[0][0][ranges[0][2]])
        last = int(ranges[-1][0][ranges[-1][3] - 1])
        if count <= points:  # nothing to decimate: each step is its own bucket
            steps_out = [s for steps, _, i0, i1 in ranges for s in steps[i0:i1].tolist()]
            values = [
                x if math.isfinite(x) else None
                for _, losses, i0, i1 in ranges
                for x in losses[i0:i1].tolist()
            ]
            nonfinite = [int(x is None) for x in values]
            return _buckets(steps_out, values, values, values, nonfinite, first, last, count)
        span = last - first + 1
        # Python ints for the edges: span * k may not fit in 64 bits.
        edges = np.array([first + span * k // points for k in range(points)], dtype=np.int64)
        low = np.full(points, np.inf)
        high = np.full(points, -np.inf)
        total = np.zeros(points)
        finite_n = np.zeros(points, np.int64)
        rows_n = np.zeros(points, np.int64)
        first_of = np.full(points, -1, np.int64)
        for steps, losses, i0, i1 in ranges:
            for a in range(i0, i1, QUERY_CHUNK_ROWS):
                b = min(a + QUERY_CHUNK_ROWS, i1)
                _reduce(
                    steps[a:b], losses[a:b], edges, low, high, total, finite_n, rows_n, first_of
                )
                _release(steps)
                _release(losses)
        used = np.flatnonzero(rows_n)
        has_finite = finite_n[used] > 0
        mean = np.divide(total[used], finite_n[used], out=np.zeros(len(used)), where=has_finite)

        def finite_or_none(values: np.ndarray) -> list[float | None]:
            return [
                v if ok else None
                for v, ok in zip(values.tolist(), has_finite.tolist(), strict=True)
            ]

        return _buckets(
            first_of[used].tolist(),
            finite_or_none(low[used]),
            finite_or_none(mean),
            finite_or_none(high[used]),
            (rows_n[used] - finite_n[used]).tolist(),
            first,
            last,
            count,
        )


def _release(column: np.ndarray) -> None:
    """Drop a mapped column's pages from this process's resident memory (they stay in the
    page cache, a later read maps them again): a scan over weeks of steps would otherwise
    leave them all counted in the daemon's RSS."""
    holder: Any = column
    while holder is not None and not isinstance(holder, mmap.mmap):
        holder = getattr(holder, "base", None)
    if holder is not None:
        with contextlib.suppress(OSError, ValueError):
            holder.madvise(mmap.MADV_DONTNEED)


def _buckets(
    step: list[int],
    low: list[float | None],
    mean: list[float | None],
    high: list[float | None],
    nonfinite: list[int],
    first: int | None,
    last: int | None,
    count: int,
) -> LossBuckets:
    return {
        "step": step,
        "min": low,
        "mean": mean,
        "max": high,
        "nonfinite": nonfinite,
        "first_step": first,
        "last_step": last,
        "count": count,
    }


def _reduce(
    steps: np.ndarray,
    losses: np.ndarray,
    edges: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    total: np.ndarray,
    finite_n: np.ndarray,
    rows_n: np.ndarray,
    first_of: np.ndarray,
) -> None:
    """Fold rows (steps increasing) into the per-bucket figures; bucket k holds the steps
    edges[k] <= step < edges[k + 1]."""
    starts = np.searchsorted(steps, edges, side="left")
    sizes = np.diff(starts, append=len(steps))
    used = np.flatnonzero(sizes)
    at = starts[used]
    finite = np.isfinite(losses)
    low[used] = np.minimum(low[used], np.minimum.reduceat(np.where(finite, losses, np.inf), at))
    high[used] = np.maximum(high[used], np.maximum.reduceat(np.where(finite, losses, -np.inf), at))
    total[used] += np.add.reduceat(np.where(finite, losses, 0.0), at)
    finite_n[used] += np.add.reduceat(finite.astype(np.int64), at)
    fresh = used[first_of[used] < 0]
    first_of[fresh] = steps[starts[fresh]]
    rows_n[used] += sizes[used]
