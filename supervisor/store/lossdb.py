"""The run's loss history file, `RUN/.loss.json` (JSON Lines, append-only, never
truncated), and its writer.

One line per logged step: `{"step": 120, "loss": 3.41, "dt": 0.25, "t": 1717171717.5, "seg": 2}`
with `t` the wall-clock time (s) the daemon saw the step and `seg` the trainer start that
logged it. After a restart, replayed steps are appended again under the new seg; readers
keep the newest seg per step.

Non-finite losses are written as the JSON strings "nan", "inf" and "-inf". Strict JSON
has no NaN, and a string keeps the value and its sign in the one field where every reader
looks (a null would need a second field to say which non-finite value it was);
float("nan") / float("-inf") read them back. An unknown dt is null.

Reading it back is `losshistory`; the resume audit is `resume_audit`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import orjson

from trainwarden.supervisor.store.appendfile import AppendFile


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
