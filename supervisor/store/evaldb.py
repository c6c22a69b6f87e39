"""The run's validation history, `RUN/.eval.json` (JSON Lines, append-only, never
truncated and never archived, like `.loss.json`), its writer and its reader.

One line per held-out evaluation the trainer logged:
`{"step": 600, "loss": 3.12, "t": 1717171717.5, "seg": 2, "extras": {"docs": 3.0}}`, with
`t` the wall-clock time (s) the daemon saw the line, `seg` the trainer start that logged
it and `extras` the line's other values (per-arm losses; `{}` when none). A loss is
encoded as in `lossdb` (a number, or "nan" / "inf" / "-inf"). After a restart an
evaluation logged again for the same step is appended again; readers keep the newest
segment's value per step, as for training steps.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from trainwarden.supervisor.core.shapes import ValidationSeries
from trainwarden.supervisor.store.appendfile import AppendFile
from trainwarden.supervisor.store.lossdb import decode_loss, encode_loss

READ_LIMIT_BYTES = 64 << 20
"""A reader reads at most this much of the file (about 700,000 evaluations)."""
SERIES_POINTS_MAX = 2000
"""Evaluations a history reply carries at most (evenly spaced over the range asked)."""


class EvalPoint(NamedTuple):
    step: int
    loss: float
    t: float
    seg: int
    extras: dict[str, Any]


def number_extras(extras: Any) -> dict[str, Any]:
    """The extras worth keeping: JSON-safe scalars under short keys (untrusted input)."""
    kept: dict[str, Any] = {}
    if not isinstance(extras, dict):
        return kept
    for key, value in list(extras.items())[:32]:
        if not isinstance(key, str) or len(key) > 64:
            continue
        if isinstance(value, float):
            kept[key] = encode_loss(value)
        elif isinstance(value, bool | int) or (isinstance(value, str) and len(value) <= 64):
            kept[key] = value
    return kept


class EvalWriter:
    """Appends evaluation lines, each batch with one write (see `lossdb.LossWriter`)."""

    HOLD_BYTES = 4 << 20

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.file = AppendFile(self.path, 0o644, self.HOLD_BYTES)

    @property
    def full(self) -> bool:
        return self.file.full

    def append_many(self, rows: list[tuple[int, float, float, int, dict[str, Any]]]) -> None:
        """Rows of (step, loss, t, seg, extras)."""
        lines = [
            orjson.dumps(
                {
                    "step": step,
                    "loss": encode_loss(loss),
                    "t": t,
                    "seg": seg,
                    "extras": number_extras(extras),
                }
            )
            for step, loss, t, seg, extras in rows
        ]
        if lines:
            self.file.write(b"\n".join(lines) + b"\n", len(lines))

    def retry(self) -> bool:
        return self.file.flush() if self.file.full else True

    def sync(self) -> None:
        self.file.fsync()

    def close(self) -> None:
        self.file.close()


def _point(raw: bytes) -> EvalPoint | None:
    try:
        record = orjson.loads(raw)
        step = record["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            return None
        loss = decode_loss(record["loss"])
        t = float(record.get("t") or 0.0)
        seg = record.get("seg", 0)
        extras = record.get("extras") or {}
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
    if not isinstance(seg, int) or isinstance(seg, bool):
        return None
    return EvalPoint(step, loss, t if math.isfinite(t) else 0.0, seg, number_extras(extras))


def read_evals(path: Path | str, upto: int | None = None) -> list[EvalPoint]:
    """The evaluations in step order, the newest segment's per step; steps above `upto`
    left out. A missing file is no evaluation; unreadable or torn lines are skipped."""
    try:
        with open(path, "rb") as file:
            data = file.read(READ_LIMIT_BYTES)
    except FileNotFoundError:
        return []
    newest: dict[int, EvalPoint] = {}
    for raw in data.splitlines():
        point = _point(raw)
        if point is None or (upto is not None and point.step > upto):
            continue
        held = newest.get(point.step)
        if held is None or point.seg >= held.seg:
            newest[point.step] = point
    return [newest[step] for step in sorted(newest)]


def series(
    steps: Sequence[int], losses: Sequence[float], start: int | None, end: int | None, points: int
) -> ValidationSeries:
    """The evaluations of steps start..end (inclusive; `steps` increasing) for a history
    reply: at most min(points, SERIES_POINTS_MAX), evenly spaced, the newest always among
    them; a non-finite loss is None (as a bucket's)."""
    i0 = 0 if start is None else bisect.bisect_left(steps, start)
    i1 = len(steps) if end is None else bisect.bisect_right(steps, end)
    count = max(i1 - i0, 0)
    limit = max(min(points, SERIES_POINTS_MAX), 1)
    if count <= limit:
        picked = list(range(i0, i1))
    elif limit == 1:
        picked = [i1 - 1]
    else:
        picked = [i0 + (count - 1) * k // (limit - 1) for k in range(limit)]
    return {
        "step": [int(steps[i]) for i in picked],
        "loss": [float(losses[i]) if math.isfinite(losses[i]) else None for i in picked],
    }
