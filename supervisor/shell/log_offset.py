"""Where the daemon has read the run log up to (`.log_offset`), so that a restarted daemon
reads on from there: each line taken once, none taken twice.

The offset is written as soon as the lines before it told the daemon something it keeps
(rows of `.loss.json` or `.eval.json`, the newest save), so a daemon killed just after
cannot take them a second time; after lines that told nothing, at most once a second. It
is not written while lines are held in memory for a full disk: a daemon killed then reads
them again from the log rather than lose them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from trainwarden.supervisor.store.appendfile import no_space

SAVE_INTERVAL_S = 1.0
"""After lines that told nothing, the offset is written at most this often."""


class LogOffset:
    def __init__(self, path: Path, log_path: Path, held: Callable[[], bool]) -> None:
        self.path = path
        self.log_path = log_path
        self.held = held
        """Whether lines past the offset are in memory only (the disk is full)."""
        self._fd: int | None = None
        self._saved_t = 0.0

    def saved(self) -> int:
        """The offset the previous daemon wrote; with none, the log's end (the lines in it
        belong to earlier runs of the log)."""
        try:
            return int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            try:
                return self.log_path.stat().st_size
            except OSError:
                return 0

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

    def save(self, offset: int) -> None:
        """Write `offset` now (unless lines are held)."""
        self._saved_t = time.monotonic()
        self._write(offset)

    def save_due(self, offset: int) -> None:
        """Write `offset` if the last write is SAVE_INTERVAL_S old."""
        if self._fd is None:
            return
        now = time.monotonic()
        if now - self._saved_t < SAVE_INTERVAL_S:
            return
        self._saved_t = now
        self._write(offset)

    def close(self, offset: int | None) -> None:
        """A last write of `offset` (when the log was followed), then the file is closed."""
        if self._fd is None:
            return
        if offset is not None:
            self._write(offset)
        os.close(self._fd)
        self._fd = None

    def _write(self, offset: int) -> None:
        if self._fd is None or self.held():
            return
        try:
            os.pwrite(self._fd, f"{offset}\n".encode().ljust(24), 0)
        except OSError as exc:
            if not no_space(exc):
                raise
            # Written again within a second, once there is space: .loss.json holds the steps.
