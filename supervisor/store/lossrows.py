"""The rows a loss history is made of, and resolving them.

A part is rows in memory (`_Live`, typed arrays) or a range of the binary cache's
mapped columns (`_Mapped`, never written). Lines read from `.loss.json` are resolved
to one row per step, the newest segment's (`_keep_newest_segments`, `_merge`), and a
load that builds the cache writes them into a new generation a chunk at a time
(`_Build`).
"""

from __future__ import annotations

import operator
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from trainwarden.supervisor.store import losscache

_KEYS = ("step", "loss", "dt", "t", "seg")


class _Live:
    """Rows held in memory: five typed arrays (40 bytes a step), and frozen numpy copies
    of their steps and losses for snapshots, in chunks whose sizes halve towards the end,
    so a snapshot copies only the rows since the last one (and O(log n) chunks)."""

    def __init__(self) -> None:
        self.step = array("q")
        self.loss = array("d")
        self.dt = array("d")  # nan when the step's dt is unknown
        self.t = array("d")
        self.seg = array("q")
        self._frozen: list[tuple[np.ndarray, np.ndarray]] = []
        self._frozen_rows = 0

    def touched(self, i: int) -> None:
        """Row i was replaced or inserted: frozen chunks from it on are stale."""
        if i >= self._frozen_rows:
            return
        kept, rows = [], 0
        for chunk in self._frozen:
            if rows + len(chunk[0]) > i:
                break
            kept.append(chunk)
            rows += len(chunk[0])
        self._frozen, self._frozen_rows = kept, rows

    def frozen(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Immutable (steps, losses) chunks covering every row now."""
        n, m = len(self.step), self._frozen_rows
        if n > m:
            # frombuffer + copy: one memcpy of the new rows (np.array converts item by item).
            step = np.frombuffer(self.step, np.int64)[m:n].copy()
            self._frozen.append((step, np.frombuffer(self.loss, np.float64)[m:n].copy()))
            self._frozen_rows = n
            chunks = self._frozen
            while len(chunks) > 1 and 2 * len(chunks[-1][0]) >= len(chunks[-2][0]):
                (s1, l1), (s2, l2) = chunks[-2:]
                chunks[-2:] = [(np.concatenate([s1, s2]), np.concatenate([l1, l2]))]
        return list(self._frozen)

    def columns(self) -> tuple[array[Any], ...]:
        return self.step, self.loss, self.dt, self.t, self.seg

    def __len__(self) -> int:
        return len(self.step)

    def append(self, step: int, loss: float, dt: float, t: float, seg: int) -> None:
        self.step.append(step)
        self.loss.append(loss)
        self.dt.append(dt)
        self.t.append(t)
        self.seg.append(seg)

    def extend(self, columns: tuple[Any, ...]) -> None:
        for mine, theirs in zip(self.columns(), columns, strict=True):
            mine.extend(theirs.tolist() if isinstance(theirs, np.ndarray) else theirs)

    def index(self, step: int) -> int:
        return bisect_left(self.step, step)

    def rows(self, i0: int, i1: int) -> Iterator[tuple[int, float, float, float, int]]:
        return zip(*(c[i0:i1] for c in self.columns()), strict=True)


class _Mapped:
    """Rows lo..hi of the cache's mapped columns: read-only, never copied into memory."""

    def __init__(self, columns: tuple[np.ndarray, ...], lo: int, hi: int) -> None:
        self.base = columns
        self.lo, self.hi = lo, hi
        self.step = columns[0][lo:hi]

    def columns(self) -> tuple[np.ndarray, ...]:
        return tuple(c[self.lo : self.hi] for c in self.base)

    def __len__(self) -> int:
        return self.hi - self.lo

    def index(self, step: int) -> int:
        return int(np.searchsorted(self.step, step, side="left"))

    def rows(self, i0: int, i1: int) -> Iterator[tuple[int, float, float, float, int]]:
        lo = self.lo
        return zip(*(c[lo + i0 : lo + i1].tolist() for c in self.base), strict=True)


_Part = _Live | _Mapped


def _keep_newest_segments(raw: _Live) -> tuple[_Live, int]:
    """Sorted by step keeping, per step, the newest seg (the later line on a tie); and
    how many rows that dropped."""
    steps, segs = raw.step, raw.seg
    if all(map(operator.lt, steps, islice(steps, 1, None))):
        return raw, 0  # one uninterrupted segment: already in order
    newest: dict[int, int] = {}
    for row, (step, seg) in enumerate(zip(steps, segs, strict=True)):
        kept = newest.get(step)
        if kept is None or seg >= segs[kept]:
            newest[step] = row
    order = [newest[step] for step in sorted(newest)]
    resolved = _Live()
    for mine, theirs in zip(resolved.columns(), raw.columns(), strict=True):
        mine.extend(theirs[row] for row in order)
    return resolved, len(steps) - len(order)


def _merge(old: tuple[Any, ...], rows: _Live) -> tuple[tuple[np.ndarray, ...], int]:
    """Older rows (sorted, one per step) merged with later lines' rows (the same): per
    step the newer seg, the later line on a tie; and how many rows that dropped."""
    new = {name: np.array(c) for name, c in zip(_KEYS, rows.columns(), strict=True)}
    old_step, old_seg = old[0], old[4]
    at = np.searchsorted(new["step"], old_step)
    at_clipped = np.minimum(at, len(new["step"]) - 1)
    same = new["step"][at_clipped] == old_step
    # A later line wins a tie: replaced unless the older row's seg is newer.
    old_wins = same & (old_seg > new["seg"][at_clipped])
    keep_old = ~same | old_wins
    keep_new = np.ones(len(new["step"]), bool)
    keep_new[at_clipped[old_wins]] = False
    merged = [
        np.concatenate([np.asarray(old[i])[keep_old], new[name][keep_new]])
        for i, name in enumerate(_KEYS)
    ]
    order = np.argsort(merged[0], kind="stable")
    replaced = int(np.count_nonzero(same & ~old_wins)) + int(np.count_nonzero(~keep_new))
    return tuple(column[order] for column in merged), replaced


class _Build:
    """A load writing what it parses into a new cache generation, a chunk at a time: the
    old generation's rows first (copied file to file), then each chunk resolved and merged
    with the rows it replays."""

    def __init__(self, cache_dir: Path, cached: losscache.Cached | None) -> None:
        self.builder = losscache.Builder(cache_dir)
        self.rows = 0
        """Rows parsed from the file into this generation."""
        self.superseded = 0
        try:
            if cached is not None:
                self.builder.append(cached.columns)
        except BaseException:
            self.builder.abort()
            raise

    def add(self, raw: _Live) -> None:
        self.rows += len(raw)
        rows, superseded = _keep_newest_segments(raw)
        self.superseded += superseded
        if not len(rows):
            return
        builder = self.builder
        if builder.last_step is None or rows.step[0] > builder.last_step:
            builder.append(rows.columns())
            return
        # A replay of steps already written: those rows come back and are merged (a chunk
        # reaching far back costs memory for the rows it reaches over).
        old = builder.take_tail(builder.index(rows.step[0]))
        merged, replaced = _merge(old, rows)
        self.superseded += replaced
        builder.append(merged)

    def finish(self, raw: _Live, path: Path, prefix_bytes: int, stats: dict[str, int]) -> None:
        try:
            self.add(raw)
            stats = {**stats, "superseded": stats["superseded"] + self.superseded}
            self.builder.commit(path, prefix_bytes, stats)
        except BaseException:
            self.builder.abort()
            raise
