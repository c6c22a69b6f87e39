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

import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, NamedTuple

import orjson

from trainwarden.supervisor.store.appendfile import AppendFile

LOAD_CHUNK_BYTES = 1 << 20
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


class LossHistory:
    """Steps in order with the newest segment's loss for each, held in flat arrays.

    Five typed arrays (40 bytes a step) instead of objects per step, so a 200,000-step
    history takes 8 MB, and queries run over contiguous slices.
    """

    def __init__(self) -> None:
        self._step = array("q")
        self._loss = array("d")
        self._dt = array("d")  # nan when the step's dt is unknown
        self._t = array("d")
        self._seg = array("q")
        self.load_stats = LoadStats(0, 0, False, 0)

    @classmethod
    def load(cls, path: Path | str) -> LossHistory:
        """Read a history file (missing: empty). Damaged lines are skipped and counted."""
        history = cls()
        n_lines = garbage = 0
        tail = b""
        try:
            with open(path, "rb") as f:
                # Chunks rather than one read: the peak memory of a start-up stays a few MB
                # above the arrays themselves however long the run has been.
                while chunk := f.read(LOAD_CHUNK_BYTES):
                    lines = (tail + chunk).split(b"\n")
                    tail = lines.pop()  # unterminated: completed by the next chunk, or torn
                    n_lines += len(lines)
                    garbage += history._read_lines(lines)
        except FileNotFoundError:
            return history
        torn = False
        if tail.strip():
            n_lines += 1
            row = _decode_row(tail)
            if row is None:
                torn = True
            else:  # a complete record that only lost its newline
                history._append(*row)
        superseded = history._keep_newest_segments()
        history.load_stats = LoadStats(n_lines, garbage, torn, superseded)
        return history

    def _read_lines(self, lines: list[bytes]) -> int:
        """Append the records of complete lines in file order; returns the garbage count."""
        if lines and self._read_clean_block(lines):
            return 0
        garbage = 0
        for line in lines:
            if not line.strip():
                continue
            row = _decode_row(line)
            if row is None:
                garbage += 1
            else:
                self._append(*row)
        return garbage

    def _read_clean_block(self, lines: list[bytes]) -> bool:
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
        columns: tuple[array[Any], ...] = self._columns()
        n = len(self._seg)
        try:
            # The typed arrays refuse a value of the wrong type (a string loss, a float step).
            for column, values in zip(columns, (steps, losses, dts, ts, segs), strict=True):
                column.extend(values)
        except (TypeError, OverflowError):
            for column in columns:
                del column[n:]
            return False
        return True

    def _columns(self) -> tuple[array[int], array[float], array[float], array[float], array[int]]:
        return self._step, self._loss, self._dt, self._t, self._seg

    def _append(self, step: int, loss: float, dt: float, t: float, seg: int) -> None:
        self._step.append(step)
        self._loss.append(loss)
        self._dt.append(dt)
        self._t.append(t)
        self._seg.append(seg)

    def _keep_newest_segments(self) -> int:
        """Sort by step keeping, per step, the newest seg (the later line on a tie)."""
        steps, segs = self._step, self._seg
        if all(map(operator.lt, steps, islice(steps, 1, None))):
            return 0  # one uninterrupted segment: already in order
        newest: dict[int, int] = {}
        for row, (step, seg) in enumerate(zip(steps, segs, strict=True)):
            kept = newest.get(step)
            if kept is None or seg >= segs[kept]:
                newest[step] = row
        order = [newest[step] for step in sorted(newest)]
        superseded = len(steps) - len(order)
        self._step = array("q", [self._step[row] for row in order])
        self._loss = array("d", [self._loss[row] for row in order])
        self._dt = array("d", [self._dt[row] for row in order])
        self._t = array("d", [self._t[row] for row in order])
        self._seg = array("q", [self._seg[row] for row in order])
        return superseded

    def add(self, step: int, loss: float, dt: float | None, t: float, seg: int) -> None:
        """A live step; a replayed step of a newer (or the same) segment replaces the old one."""
        dt_value = math.nan if dt is None else dt
        steps = self._step
        if not steps or step > steps[-1]:
            self._append(step, loss, dt_value, t, seg)
            return
        i = bisect_left(steps, step)
        if i < len(steps) and steps[i] == step:
            if seg >= self._seg[i]:
                self._loss[i], self._dt[i], self._t[i], self._seg[i] = loss, dt_value, t, seg
            return
        self._step.insert(i, step)
        self._loss.insert(i, loss)
        self._dt.insert(i, dt_value)
        self._t.insert(i, t)
        self._seg.insert(i, seg)

    def __len__(self) -> int:
        return len(self._step)

    def __iter__(self) -> Iterator[Row]:
        """(step, loss, seg) in step order, for replaying the history to a subscriber."""
        return map(Row._make, zip(self._step, self._loss, self._seg, strict=True))

    @property
    def first_step(self) -> int | None:
        return self._step[0] if self._step else None

    @property
    def last_step(self) -> int | None:
        return self._step[-1] if self._step else None

    def get(self, step: int) -> Row | None:
        i = bisect_left(self._step, step)
        if i < len(self._step) and self._step[i] == step:
            return Row(step, self._loss[i], self._seg[i])
        return None

    def recent(self, count: int) -> list[RecentStep]:
        """The newest `count` steps as (step, loss, dt, t), oldest first, dt None if unknown."""
        i0 = max(len(self._step) - count, 0)
        return [
            RecentStep(step, loss, None if math.isnan(dt) else dt, t)
            for step, loss, dt, t in zip(
                self._step[i0:], self._loss[i0:], self._dt[i0:], self._t[i0:], strict=True
            )
        ]

    def losses_between(self, after: int, through: int) -> dict[int, float]:
        """{step: loss} for after < step <= through."""
        i0 = bisect_right(self._step, after)
        i1 = bisect_right(self._step, through)
        return dict(zip(self._step[i0:i1], self._loss[i0:i1], strict=True))

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
        steps, losses = self._step, self._loss
        i0 = 0 if start is None else bisect_left(steps, start)
        i1 = len(steps) if end is None else bisect_right(steps, end)
        out_step: list[int] = []
        out_min: list[float | None] = []
        out_mean: list[float | None] = []
        out_max: list[float | None] = []
        out_nonfinite: list[int] = []
        result: dict[str, Any] = {
            "step": out_step,
            "min": out_min,
            "mean": out_mean,
            "max": out_max,
            "nonfinite": out_nonfinite,
        }
        if i1 <= i0:
            return {**result, "first_step": None, "last_step": None, "count": 0}
        first, last = steps[i0], steps[i1 - 1]
        summary = {"first_step": first, "last_step": last, "count": i1 - i0}
        if i1 - i0 <= points:  # nothing to decimate: each step is its own bucket
            values = [x if math.isfinite(x) else None for x in losses[i0:i1]]
            out_step.extend(steps[i0:i1])
            out_min.extend(values)
            out_mean.extend(values)
            out_max.extend(values)
            out_nonfinite.extend(int(x is None) for x in values)
            return {**result, **summary}
        span = last - first + 1
        bounds = [bisect_left(steps, first + span * k // points, i0, i1) for k in range(points)]
        bounds.append(i1)
        isfinite = math.isfinite
        for a, b in zip(bounds, bounds[1:], strict=False):
            if b <= a:
                continue  # a gap in the logged steps
            chunk = losses[a:b]
            total = sum(chunk)
            low: float | None
            high: float | None
            mean: float | None
            if isfinite(total):
                low, high, mean, bad = min(chunk), max(chunk), total / (b - a), 0
            else:  # rare: a divergence (or an overflowing sum) in this bucket
                finite = [x for x in chunk if isfinite(x)]
                bad = (b - a) - len(finite)
                if finite:
                    low, high, mean = min(finite), max(finite), math.fsum(finite) / len(finite)
                else:
                    low = high = mean = None
            out_step.append(steps[a])
            out_min.append(low)
            out_mean.append(mean)
            out_max.append(high)
            out_nonfinite.append(bad)
        return {**result, **summary}


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
