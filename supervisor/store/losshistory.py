"""The run's loss history read back from `RUN/.loss.json` (format: `lossdb`): steps in
order with the newest segment's loss for each, over the binary cache (`losscache`),
the rows it holds (`lossrows`) and queries over them (`lossquery`).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from trainwarden.supervisor.core.shapes import LossBuckets
from trainwarden.supervisor.store import losscache
from trainwarden.supervisor.store.lossdb import decode_loss
from trainwarden.supervisor.store.lossquery import HistoryView
from trainwarden.supervisor.store.lossrows import (
    _KEYS,
    _Build,
    _keep_newest_segments,
    _Live,
    _Mapped,
    _merge,
    _Part,
)

LOAD_CHUNK_BYTES = 1 << 20
BUILD_CHUNK_ROWS = 1 << 18
"""Rows a load that builds the cache parses before it writes them out (about 10 MB)."""
MARK_MAX_ROWS = 1 << 20
"""Rows a mark (LossHistory.mark) records at most (40 bytes each): past it the remap is
given up (a rebuild that slow has not kept up with the steps anyway)."""
ITER_CHUNK_ROWS = 1 << 16


class LoadStats(NamedTuple):
    lines: int
    """Lines read (complete ones plus a torn last line)."""
    garbage: int
    """Complete lines that were not a valid step record."""
    torn_tail: bool
    """The file ended in an unterminated, unreadable line (a writer killed mid-line)."""
    superseded: int
    """Records replaced by a newer segment's record for the same step."""


class Row(NamedTuple):
    step: int
    loss: float
    seg: int


class RecentStep(NamedTuple):
    step: int
    loss: float
    dt_s: float | None
    t_s: float


_FIELDS = itemgetter("step", "loss", "dt", "t", "seg")


def _decode_row(line: bytes) -> tuple[int, float, float, float, int] | None:
    """A record from any valid line (slow path: non-finite losses, null dt, other writers)."""
    try:
        step, loss, dt, t, seg = _FIELDS(orjson.loads(line))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (step, seg)):
            return None
        return step, decode_loss(loss), math.nan if dt is None else float(dt), float(t), seg
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class LossHistory:
    """Steps in order with the newest segment's loss for each, held in flat columns.

    The rows are a sequence of parts, steps increasing across them: ranges of the binary
    cache's mapped columns (losscache; their pages belong to the page cache, so a run of
    weeks costs the daemon little resident memory) and rows in memory (typed arrays, 40
    bytes a step) for what was parsed or logged since. A step that lands inside a mapped
    range splits it: the mapped columns are never written, which is what lets a query read
    them from another thread (snapshot()).
    """

    def __init__(self) -> None:
        self._parts: list[_Part] = []
        self.load_stats = LoadStats(0, 0, False, 0)
        self.parsed_bytes = 0
        """How much of the file load() resolved (up to its last complete line)."""
        self.parsed_rows = 0
        """Rows load() parsed from the file itself rather than took from the cache."""
        self._unterminated = False
        self._changed = False
        self._since_mark: _Live | None = None
        """Rows added since mark(), in order (not sorted); None when not marked."""

    @classmethod
    def load(
        cls,
        path: Path | str,
        cache_dir: Path | None = None,
        *,
        upto: int | None = None,
        cache_rows: int | None = None,
        chunk_rows: int = BUILD_CHUNK_ROWS,
    ) -> LossHistory:
        """Read a history file (missing: empty). Damaged lines are skipped and counted.

        With `cache_dir`, a valid cache (losscache) stands for the prefix it resolves and
        only the lines after it are parsed. `upto`: read the file as it was at that length.
        `cache_rows`: when at least this many rows are parsed past the cache, they go into
        a new generation of it as they are parsed, `chunk_rows` at a time, and the history
        maps them: a first start over weeks of steps holds one chunk in memory, not all.
        """
        history = cls()
        offset = 0
        base_stats = {"lines": 0, "garbage": 0, "superseded": 0}
        cached = losscache.load(cache_dir, Path(path)) if cache_dir is not None else None
        if cached is not None:
            offset = cached.prefix_bytes
            base_stats = cached.stats
        end = math.inf if upto is None else upto
        raw = _Live()
        n_lines = garbage = 0
        tail = b""
        build: _Build | None = None
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                # Chunks rather than one read: the peak memory of a start-up stays a few MB
                # above the arrays themselves however long the run has been.
                while offset < end and (chunk := f.read(int(min(LOAD_CHUNK_BYTES, end - offset)))):
                    offset += len(chunk)
                    lines = (tail + chunk).split(b"\n")
                    tail = lines.pop()  # unterminated: completed by the next chunk, or torn
                    n_lines += len(lines)
                    garbage += _read_lines(raw, lines)
                    if cache_dir is not None and cache_rows is not None and len(raw) >= chunk_rows:
                        build = build or _Build(cache_dir, cached)
                        build.add(raw)
                        raw = _Live()
        except FileNotFoundError:
            return history
        except BaseException:
            if build is not None:
                build.builder.abort()
            raise
        parsed_bytes = offset - len(tail)
        if cache_dir is not None and cache_rows is not None:
            parsed = len(raw) + (build.rows if build else 0)
            if build is None and parsed and parsed >= cache_rows:
                build = _Build(cache_dir, cached)
            if build is not None:
                stats = {
                    "lines": base_stats["lines"] + n_lines,
                    "garbage": base_stats["garbage"] + garbage,
                    "superseded": base_stats["superseded"],
                }
                build.finish(raw, Path(path), parsed_bytes, stats)
                # Over the generation just written: only a last line without its newline
                # is left to parse.
                history = cls.load(path, cache_dir, upto=upto)
                history.parsed_rows += parsed
                return history
        history.parsed_bytes = parsed_bytes
        history.parsed_rows = len(raw)
        torn = False
        if tail.strip():
            n_lines += 1
            row = _decode_row(tail)
            if row is None:
                torn = True
            else:  # a complete record that only lost its newline
                raw.append(*row)
                history._unterminated = True
        raw, superseded = _keep_newest_segments(raw)
        if cached is not None and len(cached.columns[0]):
            superseded += history._lay_over(cached.columns, raw)
        elif len(raw):
            history._parts = [raw]
        history.load_stats = LoadStats(
            base_stats["lines"] + n_lines,
            base_stats["garbage"] + garbage,
            torn,
            base_stats["superseded"] + superseded,
        )
        return history

    @staticmethod
    def _read_clean_block(raw: _Live, lines: list[bytes]) -> bool:
        return _read_clean_block(raw, lines)

    def _lay_over(self, base: tuple[np.ndarray, ...], rows: _Live) -> int:
        """Parts for the cached rows overlaid by later lines' rows (sorted, one per step);
        returns how many cached rows those replaced."""
        nb = len(base[0])
        if not len(rows) or rows.step[0] > base[0][nb - 1]:
            self._parts = [_Mapped(base, 0, nb)] + ([rows] if len(rows) else [])
            return 0
        # Later lines replay cached steps: merge the cached rows of their range with them.
        lo = int(np.searchsorted(base[0], rows.step[0], side="left"))
        hi = int(np.searchsorted(base[0], rows.step[-1], side="right"))
        merged, replaced = _merge(tuple(c[lo:hi] for c in base), rows)
        live = _Live()
        live.extend(merged)
        self._parts = [p for p in (_Mapped(base, 0, lo), live, _Mapped(base, hi, nb)) if len(p)]
        return replaced

    def save_cache(self, path: Path | str, cache_dir: Path) -> bool:
        """Write the cache for the prefix load() resolved; False when there is none to
        write. Only for a history as load() left it: a live one may hold steps the file
        has not (yet), and a last line without its newline is outside the prefix."""
        if self._changed or self._unterminated or not self.parsed_bytes:
            return False
        stats = self.load_stats
        losscache.save(
            cache_dir,
            Path(path),
            self.parsed_bytes,
            [part.columns() for part in self._parts],
            {"lines": stats.lines, "garbage": stats.garbage, "superseded": stats.superseded},
        )
        return True

    def _columns(self) -> tuple[np.ndarray, ...]:
        """The whole history's five columns (step, loss, dt, t, seg) in memory."""
        columns = [[np.asarray(c) for c in part.columns()] for part in self._parts]
        return tuple(
            np.concatenate([p[i] for p in columns]) if columns else np.empty(0, dtype)
            for i, dtype in enumerate((np.int64, np.float64, np.float64, np.float64, np.int64))
        )

    @property
    def _dt(self) -> np.ndarray:
        return self._columns()[2]

    def _locate(self, step: int) -> int:
        """The index of the part that holds `step` or would: the last whose first step is
        <= step (0 when none is)."""
        k = len(self._parts) - 1
        while k > 0 and self._parts[k].step[0] > step:
            k -= 1
        return k

    def mark(self) -> None:
        """Note the rows added from now on, for remap()."""
        self._since_mark = _Live()

    def remap(self, base: LossHistory) -> bool:
        """Take `base`'s rows (a load of the history file over the cache, as the file was
        at mark(): mapped, next to no memory) for the ones held then, and add again the
        rows added since. The rows are the same; the memory they held is let go. Snapshots
        made before keep what they hold. False (nothing changed) without a mark, or when
        too many rows came since it."""
        since, self._since_mark = self._since_mark, None
        if since is None:
            return False
        self._parts = base._parts
        base._parts = []
        for step, loss, dt, t, seg in since.rows(0, len(since)):
            self.add(step, loss, dt, t, seg)  # a nan dt stays unknown
        return True

    def remap_cancel(self) -> None:
        """Stop noting rows for a remap that will not come."""
        self._since_mark = None

    def in_memory_rows(self) -> int:
        """Rows held in memory (the rest are maps of the cache)."""
        return sum(len(part) for part in self._parts if isinstance(part, _Live))

    def add(self, step: int, loss: float, dt: float | None, t: float, seg: int) -> None:
        """A live step; a replayed step of a newer (or the same) segment replaces the old one."""
        dt_value = math.nan if dt is None else dt
        since = self._since_mark
        if since is not None:
            since.append(step, loss, dt_value, t, seg)
            if len(since) > MARK_MAX_ROWS:
                self._since_mark = None
        self._changed = True
        parts = self._parts
        row = (step, loss, dt_value, t, seg)
        if not parts or step > parts[-1].step[-1]:
            if not parts or isinstance(parts[-1], _Mapped):
                parts.append(_Live())
            last = parts[-1]
            assert isinstance(last, _Live)
            last.append(*row)
            return
        k = self._locate(step)
        part = parts[k]
        i = part.index(step)
        exact = i < len(part) and part.step[i] == step
        if isinstance(part, _Live):
            if exact:
                if seg >= part.seg[i]:
                    part.loss[i], part.dt[i], part.t[i], part.seg[i] = loss, dt_value, t, seg
                    part.touched(i)
                return
            for column, value in zip(part.columns(), row, strict=True):
                column.insert(i, value)
            part.touched(i)
            return
        if exact and seg < part.base[4][part.lo + i]:
            return
        # Split the mapped range around the step; the row joins the memory rows before it.
        left = _Mapped(part.base, part.lo, part.lo + i)
        right = _Mapped(part.base, part.lo + i + exact, part.hi)
        before = parts[k - 1] if k > 0 and not len(left) else None
        if isinstance(before, _Live):
            before.append(*row)
            middle: list[_Part] = []
        else:
            live = _Live()
            live.append(*row)
            middle = [live]
        after = parts[k + 1] if k + 1 < len(parts) and not len(right) else None
        if isinstance(after, _Live) and middle:
            # Two memory parts side by side become one.
            joined = middle[0]
            assert isinstance(joined, _Live)
            joined.extend(after.columns())
            del parts[k + 1]
        elif isinstance(after, _Live) and isinstance(before, _Live):
            before.extend(after.columns())
            del parts[k + 1]
        parts[k : k + 1] = [p for p in (left, *middle, right) if len(p)]

    def __len__(self) -> int:
        return sum(len(part) for part in self._parts)

    def _rows(self, i0: int, i1: int) -> Iterator[tuple[int, float, float, float, int]]:
        """Rows i0..i1 of the whole history, (step, loss, dt, t, seg)."""
        at = 0
        for part in self._parts:
            n = len(part)
            a, b = max(i0 - at, 0), min(i1 - at, n)
            for c in range(a, b, ITER_CHUNK_ROWS):
                yield from part.rows(c, min(c + ITER_CHUNK_ROWS, b))
            at += n

    def __iter__(self) -> Iterator[Row]:
        """(step, loss, seg) in step order, for replaying the history to a subscriber."""
        for step, loss, _, _, seg in self._rows(0, len(self)):
            yield Row(step, loss, seg)

    @property
    def first_step(self) -> int | None:
        return int(self._parts[0].step[0]) if self._parts else None

    @property
    def last_step(self) -> int | None:
        return int(self._parts[-1].step[-1]) if self._parts else None

    def last_step_of(self, seg: int, above: int | None = None) -> int | None:
        """The newest step that segment `seg` logged (None: it logged none that stands).

        Read from the end: the rows past it are older segments' steps that `seg`, resumed
        from an earlier checkpoint, has not replayed yet. A segment resumed from step
        `above` logged nothing at or below it, so the search stops there."""
        end = len(self)
        while end > 0:
            start = max(end - ITER_CHUNK_ROWS, 0)
            rows = list(self._rows(start, end))
            for step, _, _, _, row_seg in reversed(rows):
                if row_seg == seg:
                    return step
                if above is not None and step <= above:
                    return None
            end = start
        return None

    def get(self, step: int) -> Row | None:
        if not self._parts:
            return None
        part = self._parts[self._locate(step)]
        i = part.index(step)
        if i < len(part) and part.step[i] == step:
            _, loss, _, _, seg = next(part.rows(i, i + 1))
            return Row(step, loss, seg)
        return None

    def recent(self, count: int) -> list[RecentStep]:
        """The newest `count` steps as (step, loss, dt, t), oldest first, dt None if unknown."""
        i1 = len(self)
        return [
            RecentStep(step, loss, None if math.isnan(dt) else dt, t)
            for step, loss, dt, t, _ in self._rows(max(i1 - count, 0), i1)
        ]

    def _index_right(self, step: int) -> int:
        """How many steps of the whole history are <= step."""
        at = 0
        for part in self._parts:
            if part.step[-1] > step:
                i = part.index(step)
                return at + i + (i < len(part) and part.step[i] == step)
            at += len(part)
        return at

    def losses_between(self, after: int, through: int) -> dict[int, float]:
        """{step: loss} for after < step <= through."""
        i0, i1 = self._index_right(after), self._index_right(through)
        return {step: loss for step, loss, _, _, _ in self._rows(i0, i1)}

    def snapshot(self) -> HistoryView:
        """An immutable view for a query in another thread: mapped ranges as they are
        (never written), the memory rows' steps and losses as frozen copies (only rows new
        or changed since the last snapshot are copied)."""
        parts = []
        for part in self._parts:
            if isinstance(part, _Mapped):
                parts.append((part.step, part.base[1][part.lo : part.hi]))
            else:
                parts.extend(part.frozen())
        return HistoryView(parts)

    def query(
        self, start: int | None = None, end: int | None = None, points: int = 1000
    ) -> LossBuckets:
        """See HistoryView.query."""
        return self.snapshot().query(start, end, points)


def _read_lines(raw: _Live, lines: list[bytes]) -> int:
    """Append the records of complete lines in file order; returns the garbage count."""
    if lines and LossHistory._read_clean_block(raw, lines):
        return 0
    garbage = 0
    for line in lines:
        if not line.strip():
            continue
        row = _decode_row(line)
        if row is None:
            garbage += 1
        else:
            raw.append(*row)
    return garbage


def _read_clean_block(raw: _Live, lines: list[bytes]) -> bool:
    """The lines as one JSON array, column by column: the common case, every line a
    record with a finite loss. False, with nothing appended, when any line needs
    _decode_row (garbage, a non-finite loss, a torn line)."""
    joined = b",".join(lines)
    if b"true" in joined or b"false" in joined:
        return False  # a JSON boolean: _decode_row refuses one as a step, int arrays not
    try:
        rows = orjson.loads(b"[" + joined + b"]")
        steps, losses, dts, ts, segs = [[row[key] for row in rows] for key in _KEYS]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False
    if None in dts:
        dts = [math.nan if dt is None else dt for dt in dts]  # a step without a dt
    columns: tuple[array[Any], ...] = raw.columns()
    n = len(raw)
    try:
        # The typed arrays refuse a value of the wrong type (a string loss, a float step).
        for column, values in zip(columns, (steps, losses, dts, ts, segs), strict=True):
            column.extend(values)
    except (TypeError, OverflowError):
        for column in columns:
            del column[n:]
        return False
    return True
