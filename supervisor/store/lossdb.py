"""The run's loss history, `RUN/.loss.json`: JSON Lines, append-only, never truncated.

One line per logged step: `{"step": 120, "loss": 3.41, "dt": 0.25, "t": 1717171717.5, "seg": 2}`
with `t` the wall-clock time (s) the daemon saw the step and `seg` the trainer start that
logged it. After a restart, replayed steps are appended again under the new seg; readers
keep the newest seg per step.

Non-finite losses are written as the JSON strings "nan", "inf" and "-inf". Strict JSON
has no NaN, and a string keeps the value and its sign in the one field where every reader
looks (a null would need a second field to say which non-finite value it was);
float("nan") / float("-inf") read them back. An unknown dt is null.

Also here: the resume audit, which compares replayed losses with the ones they supersede.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import operator
import os
from array import array
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import orjson

from trainwarden.supervisor.store import losscache
from trainwarden.supervisor.store.appendfile import AppendFile

LOAD_CHUNK_BYTES = 1 << 20
BUILD_CHUNK_ROWS = 1 << 18
"""Rows a load that builds the cache parses before it writes them out (about 10 MB)."""
MARK_MAX_ROWS = 1 << 20
"""Rows a mark (LossHistory.mark) records at most (40 bytes each): past it the remap is
given up (a rebuild that slow has not kept up with the steps anyway)."""
_KEYS = ("step", "loss", "dt", "t", "seg")


def encode_loss(loss: float) -> float | str:
    """The JSON value for a loss: the number, or "nan" / "inf" / "-inf"."""
    if math.isfinite(loss):
        return loss
    if math.isnan(loss):
        return "nan"
    return "inf" if loss > 0 else "-inf"


def decode_loss(value: Any) -> float:
    """A loss read back from JSON (number, "nan"/"inf"/"-inf"; null from an older writer as nan)."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        raise ValueError(f"not a loss: {value!r}")
    if isinstance(value, int | float | str):
        return float(value)
    raise ValueError(f"not a loss: {value!r}")


class LossWriter:
    """Appends step lines to the history file, each batch with one unbuffered write.

    O_APPEND plus a single write() per batch means a crash leaves at worst one torn
    final line, which readers skip. Lines reach the kernel at once; sync() makes them
    durable (done at checkpoints, not per step: an fsync per step would cost more than
    the step lines are worth). On a full disk the lines are held in memory, up to
    HOLD_BYTES (about 800,000 steps), and written when space returns (store.appendfile).
    """

    HOLD_BYTES = 64 << 20
    """Step lines held in memory while the disk is full, at most (bytes)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.file = AppendFile(self.path, 0o644, self.HOLD_BYTES)

    @property
    def full(self) -> bool:
        """Lines are held in memory: the disk had no space for them."""
        return self.file.full

    def append(self, step: int, loss: float, dt: float | None, t: float, seg: int) -> None:
        self.append_many([(step, loss, dt, t, seg)])

    def append_many(self, rows: list[tuple[int, float, float | None, float, int]]) -> None:
        """Several lines with one write(2): the cheap path when lines arrive in a batch."""
        lines = []
        for step, loss, dt, t, seg in rows:
            if dt is not None and not math.isfinite(dt):
                dt = None
            lines.append(
                orjson.dumps(
                    {"step": step, "loss": encode_loss(loss), "dt": dt, "t": t, "seg": seg}
                )
            )
        if lines:
            self.file.write(b"\n".join(lines) + b"\n", len(lines))

    def size(self) -> int | None:
        """The file's length while it holds every line handed in (None while some are
        held in memory): the prefix that says exactly what has been logged."""
        file = self.file
        if file.fd < 0 or file.held_bytes:
            return None
        return os.fstat(file.fd).st_size

    def retry(self) -> bool:
        """Write the lines held since the disk filled; True once none is held."""
        return self.file.flush() if self.file.full else True

    def take_lost(self) -> int:
        """Step lines dropped past HOLD_BYTES since the last call."""
        return self.file.take_lost()

    def sync(self) -> None:
        self.file.fsync()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> LossWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    ) -> dict[str, Any]:
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


ITER_CHUNK_ROWS = 1 << 16
QUERY_CHUNK_ROWS = 1 << 20
"""Rows a query reduces at a time: its temporaries stay a few MB however long the range."""


class HistoryView:
    """Steps and losses of a history at one moment, in parts whose steps increase across
    them; nothing here changes after it is made, so any thread may query it."""

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.parts = parts

    def query(
        self, start: int | None = None, end: int | None = None, points: int = 1000
    ) -> dict[str, Any]:
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
            return {
                **_buckets([], [], [], [], []),
                "first_step": None,
                "last_step": None,
                "count": 0,
            }
        first = int(ranges[0][0][ranges[0][2]])
        last = int(ranges[-1][0][ranges[-1][3] - 1])
        summary = {"first_step": first, "last_step": last, "count": count}
        if count <= points:  # nothing to decimate: each step is its own bucket
            steps_out = [s for steps, _, i0, i1 in ranges for s in steps[i0:i1].tolist()]
            values = [
                x if math.isfinite(x) else None
                for _, losses, i0, i1 in ranges
                for x in losses[i0:i1].tolist()
            ]
            nonfinite = [int(x is None) for x in values]
            return {**_buckets(steps_out, values, values, values, nonfinite), **summary}
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

        return {
            **_buckets(
                first_of[used].tolist(),
                finite_or_none(low[used]),
                finite_or_none(mean),
                finite_or_none(high[used]),
                (rows_n[used] - finite_n[used]).tolist(),
            ),
            **summary,
        }


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
) -> dict[str, Any]:
    return {"step": step, "min": low, "mean": mean, "max": high, "nonfinite": nonfinite}


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


@dataclass(frozen=True, slots=True)
class AuditResult:
    """How the losses replayed after a resume compare with the ones they supersede."""

    status: Literal["verified", "drift", "unverified"]
    """verified: every compared step matched; drift: one differed; unverified: none compared."""
    checkpoint_step: int
    """The step the trainer resumed from."""
    checked: int
    """Replayed steps compared."""
    expected: int
    """Steps there were to compare (logged after the checkpoint, before the restart)."""
    seg: int | None = None
    """The segment (trainer start) that replayed them, when the caller said."""
    step: int | None = None
    """The first step whose loss differed (drift only)."""
    old_loss: float | None = None
    new_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; non-finite losses as "nan"/"inf"/"-inf" like the history file."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        for key in ("old_loss", "new_loss"):
            if fields[key] is not None:
                fields[key] = encode_loss(fields[key])
        return fields


class ResumeAudit:
    """Compares replayed losses (checkpoint_step < step <= last_step) with the old ones.

    Build it when the resumed trainer starts, before its replayed steps reach the
    history: it copies the values they will supersede (at most the steps since the
    checkpoint). Then feed it every logged step. The result is decided at the first
    difference (drift), once every expected step has been seen or the trainer logs past
    them (verified), or when finish() says the trainer stopped logging; with nothing to
    compare it is `unverified`. Each audit hands its result out exactly once, from
    whichever of observe() or finish() comes first after the decision.
    """

    def __init__(
        self,
        previous: LossHistory | Mapping[int, float],
        checkpoint_step: int,
        last_step: int | None = None,
        tolerance: float = 0.0,
        *,
        seg: int | None = None,
    ) -> None:
        """previous: the history (or {step: loss}) before the restart; last_step: the
        newest step to compare (default: all after the checkpoint), e.g. one before a
        divergence that is being rolled back."""
        if isinstance(previous, LossHistory):
            through = previous.last_step if last_step is None else last_step
            old = previous.losses_between(checkpoint_step, through) if through is not None else {}
        else:
            old = {
                step: loss
                for step, loss in previous.items()
                if step > checkpoint_step and (last_step is None or step <= last_step)
            }
        self.checkpoint_step = checkpoint_step
        self.seg = seg
        self.tolerance = tolerance
        self._pending = old
        self._last_expected = max(old, default=checkpoint_step)
        self.expected = len(old)
        self.checked = 0
        self.result: AuditResult | None = None
        self._handed_out = False
        if not old:
            self.result = self._decide()

    def _matches(self, old: float, new: float) -> bool:
        if old == new or (math.isnan(old) and math.isnan(new)):
            return True
        if not math.isfinite(old) and math.isfinite(new):
            # The superseded value is a divergence the rollback undid, not a resume error.
            return True
        return abs(new - old) <= self.tolerance  # false for inf vs finite, nan vs anything

    def _decide(self, drift: tuple[int, float, float] | None = None) -> AuditResult:
        common: dict[str, Any] = {
            "checkpoint_step": self.checkpoint_step,
            "checked": self.checked,
            "expected": self.expected,
            "seg": self.seg,
        }
        if drift is not None:
            step, old, new = drift
            return AuditResult("drift", step=step, old_loss=old, new_loss=new, **common)
        return AuditResult("verified" if self.checked else "unverified", **common)

    def _hand_out(self) -> AuditResult | None:
        if self.result is None or self._handed_out:
            return None
        self._handed_out = True
        return self.result

    def observe(self, step: int, loss: float) -> AuditResult | None:
        """A logged step of the resumed trainer; the result once it is decided, else None."""
        if self.result is None:
            old = self._pending.pop(step, None)
            if old is not None:
                self.checked += 1
                if not self._matches(old, loss):
                    self.result = self._decide((step, old, loss))
            if self.result is None and (not self._pending or step >= self._last_expected):
                self.result = self._decide()
        return self._hand_out()

    def finish(self) -> AuditResult | None:
        """The trainer stopped logging (exited, died, stopped): the result, unless handed out."""
        if self.result is None:
            self.result = self._decide()
        return self._hand_out()
