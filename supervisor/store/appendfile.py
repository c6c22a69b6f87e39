"""Append-only line files that outlive a full disk: the journal and `.loss.json` write
through `AppendFile`, and `DiskSpace` says which of the daemon's files are full.

Lines go out with write(2) on an O_APPEND descriptor. When the disk is full (ENOSPC or
EDQUOT: only the no-space kinds; any other error is raised as before) the lines that did not
fit are held in memory, up to `hold_bytes`, and written in order by the next `flush()` (on
the daemon's retry timer and before each new line). A short write's remainder is written
before anything else, so a line is never torn or glued onto the next one. Past the bound
the oldest whole held lines are dropped and counted (`take_lost`), so that the newest
state survives and the loss is reported once space returns.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainwarden.supervisor.store.rundir import open_for_append

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import DiskFull, DiskRecovered

log = logging.getLogger("trainwarden.disk")

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
FLUSH_CHUNK_BYTES = 1 << 20
"""Held lines are written back in writes of at most this size."""


def no_space(exc: BaseException) -> bool:
    """The error says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


class DiskSpace:
    """Which files the daemon could not write for lack of space (status `disk_full`).

    The daemon log gets one warning when the first file fills and one when the last is
    written again; files that fill meanwhile are noted at info level, each by its path.
    """

    def __init__(self) -> None:
        self.full_files: dict[str, str] = {}
        """Path -> the error's text, for each file now held in memory."""
        self._since: dict[str, float] = {}
        """Path -> when it filled, for the files change() reported full."""

    @property
    def full(self) -> bool:
        return bool(self.full_files)

    def filled(self, path: Path | str, exc: OSError, what: str) -> None:
        path = str(path)
        if path in self.full_files:
            return
        reason = exc.strerror or str(exc)
        if self.full_files:
            log.info("%s: %s too; %s", path, reason, what)
        else:
            log.warning(
                "%s: %s; running degraded, %s until space returns (status: disk_full)",
                path,
                reason,
                what,
            )
        self.full_files[path] = reason

    def change(
        self,
        path: Path | str,
        error: OSError | None,
        what: str,
        unit: str,
        take_lost: Callable[[], int],
        now: float,
    ) -> DiskFull | DiskRecovered | None:
        """The journal record a file's change between full (`error`) and written again
        calls for, if it changed: `disk_full`, or `disk_recovered` with the `unit`s lost."""
        path = str(path)
        if error is not None and path not in self._since:
            self._since[path] = now
            self.filled(path, error, what)
            return {"kind": "disk_full", "file": path, "error": error.strerror}
        if error is None and path in self._since:
            lost = take_lost()
            full_s = round(now - self._since.pop(path), 3)
            self.emptied(path, f"{lost} {unit}s lost" if lost else f"no {unit} lost")
            return {"kind": "disk_recovered", "file": path, "full_s": full_s, "lost_records": lost}
        return None

    def forget(self, path: Path | str) -> None:
        """A file that no longer needs writing (what it would have said is moot)."""
        self.full_files.pop(str(path), None)

    def emptied(self, path: Path | str, note: str) -> None:
        if self.full_files.pop(str(path), None) is None:
            return
        level = logging.INFO if self.full_files else logging.WARNING
        log.log(level, "%s: written again: %s", path, note)


class AppendFile:
    """One append-only line file; `write` takes whole lines (ending in a newline)."""

    def __init__(self, path: Path, mode: int, hold_bytes: int, *, chmod: bool = False) -> None:
        self.path = path
        self.mode = mode
        self.hold_bytes = hold_bytes
        self._chmod = chmod
        self.fd = -1
        self._held: deque[tuple[bytes, int, bool]] = deque()
        """(bytes, lines, kept) not yet written, oldest first. The first may be the rest of
        a short write (its lines then count the line it completes). Kept entries are never
        dropped past the bound: the rest of a line already begun, the end of a torn line,
        a record the caller marked (the journal's `disk_full`)."""
        self.held_bytes = 0
        self.lost_lines = 0
        self.error: OSError | None = None
        """The no-space error that made the file hold lines (None: nothing held)."""
        if self._open():
            self.flush()

    @property
    def full(self) -> bool:
        return self.error is not None

    @property
    def held_lines(self) -> int:
        return sum(lines for _, lines, _ in self._held)

    def _open(self) -> bool:
        """Open the file (a full disk may refuse even to create it: then later)."""
        try:
            # Read access only to look at the last byte; O_APPEND sends every write to the end.
            fd = open_for_append(self.path, os.O_RDWR, self.mode)
        except OSError as exc:
            if not no_space(exc):
                raise
            self.error = exc
            return False
        self.fd = fd
        if self._chmod:
            os.fchmod(fd, self.mode)
        # A previous writer killed mid-line left no newline: start on a fresh line so the
        # next record is not glued onto the torn one and lost with it.
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            self._held.appendleft((b"\n", 0, True))
            self.held_bytes += 1
        return True

    def write(self, data: bytes, lines: int = 1, *, keep: bool = False) -> bool:
        """Append `lines` whole lines; False when they (or lines before them) are held.
        `keep`: if held, never dropped past the bound."""
        if self._held and not self.flush():
            self._hold(data, lines, keep)
            return False
        self._hold(data, lines, keep)
        return self.flush()

    def flush(self) -> bool:
        """Write what is held, oldest first; True once nothing is held."""
        if self.fd < 0 and not self._open():
            return False
        # While full, one entry probes for space: no megabyte joined per refused write.
        limit = 0 if self.error else FLUSH_CHUNK_BYTES
        while self._held:
            chunk, n_entries = self._next_chunk(limit)
            try:
                written = os.write(self.fd, chunk)
            except OSError as exc:
                if not no_space(exc):
                    raise
                if self.error is None:
                    self.error = exc
                return False
            self._consume(written, n_entries)
            limit = FLUSH_CHUNK_BYTES
        self.error = None
        return True

    def take_lost(self) -> int:
        """Lines dropped past the bound since the last call."""
        lost, self.lost_lines = self.lost_lines, 0
        return lost

    def _next_chunk(self, limit: int) -> tuple[bytes, int]:
        """The oldest held entries joined, up to `limit` bytes (at least one entry)."""
        parts: list[bytes] = []
        size = 0
        for data, _, _ in self._held:
            if parts and size + len(data) > limit:
                break
            parts.append(data)
            size += len(data)
        return b"".join(parts), len(parts)

    def _consume(self, written: int, n_entries: int) -> None:
        """Drop from the held entries the `written` bytes the kernel took."""
        for _ in range(n_entries):
            data, lines, _ = self._held[0]
            if written < len(data):
                if written:
                    # A short write: the rest of this line goes out before anything else.
                    self._held[0] = (data[written:], lines, True)
                    self.held_bytes -= written
                return
            self._held.popleft()
            self.held_bytes -= len(data)
            written -= len(data)

    def _hold(self, data: bytes, lines: int, keep: bool) -> None:
        self._held.append((data, lines, keep))
        self.held_bytes += len(data)
        if self.held_bytes <= self.hold_bytes:
            return
        # Past the bound the oldest whole lines go: the newest state is worth more (and
        # dropped lines only ever sit among kept ones near the front, so the scan is short).
        i = 0
        while self.held_bytes > self.hold_bytes and i < len(self._held) - 1:
            dropped, dropped_lines, kept = self._held[i]
            if kept:
                i += 1
                continue
            del self._held[i]
            self.held_bytes -= len(dropped)
            self.lost_lines += dropped_lines

    def fsync(self) -> None:
        """fsync, unless the disk is full (then the held lines are not on disk anyway)."""
        if self.fd < 0:
            return
        try:
            os.fsync(self.fd)
        except OSError as exc:
            if not no_space(exc):
                raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
