"""Follows the run log as the trainer writes it, the way `tail -F` does, without polling.

A watchdog (inotify) observer watches the log's directory; each write, create or rename
of the log wakes its thread, which reads the new bytes and hands the complete lines to the
asyncio loop with call_soon_threadsafe. Reading in the watchdog thread keeps file I/O off
the loop and costs one thread hop from write to callback (typically well under 20 ms).

- A partial last line is held until its newline arrives.
- A line over MAX_LINE_BYTES is skipped (counted): it is not a step line, and holding it
  would let one runaway print grow the daemon without bound.
- Bytes that are not UTF-8 are replaced with U+FFFD and the line delivered (counted):
  a step line with one bad byte still reports its loss.
- copytruncate (the file shrinks below our offset): start again from its beginning.
- logrotate's move-and-create (the path names another inode): finish reading the old
  file, deliver its unterminated last line, then follow the new one from its start.

`offset` is the end of the last complete line read, for the daemon to persist; a
follower started at that offset picks up exactly where this one stopped. (A copytruncate
that happens while nobody follows, and the file grows past the saved offset before we
start, cannot be told apart from appends; no byte-offset follower can.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from watchdog.events import (
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024
READ_CHUNK_BYTES = 1 << 20
# Only a safety net for events inotify never delivers (a queue overflow, a network
# filesystem that does not report remote writes): the hot path is event-driven.
SAFETY_RECHECK_S = 5.0


class FollowStats(NamedTuple):
    lines: int
    """Complete lines delivered."""
    skipped_long: int
    """Lines longer than the limit, dropped."""
    undecodable: int
    """Lines with bytes that are not UTF-8, delivered with U+FFFD in their place."""
    truncations: int
    """Times the file shrank below the offset (copytruncate) and was read from the start."""
    rotations: int
    """Times the path came to name a new file (logrotate) and the new one was followed."""


class _LogEvents(FileSystemEventHandler):
    def __init__(self, name: str, wake: Callable[[], None]) -> None:
        self._name = name
        self._wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = (event.src_path, event.dest_path)
        if any(p and os.path.basename(os.fsdecode(p)) == self._name for p in paths):
            self._wake()


class LogFollower:
    """Delivers the lines appended to `path` after `offset` to `on_lines`, in order.

    With a loop, on_lines runs on that loop (lines read while it is busy arrive together
    in one call); without one, in the reading thread. read_new() reads synchronously
    (no watchdog needed): it also passes the lines to on_lines and returns them.
    """

    def __init__(
        self,
        path: Path | str,
        offset: int = 0,
        on_lines: Callable[[list[str]], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        max_line_bytes: int = MAX_LINE_BYTES,
        recheck_s: float = SAFETY_RECHECK_S,
    ) -> None:
        self.path = Path(path).absolute()
        self._on_lines = on_lines
        self._loop = loop
        self._max_line_bytes = max_line_bytes
        self._recheck_s = recheck_s
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._file_id: tuple[int, int] | None = None
        self._read_pos = offset  # bytes of the current file consumed so far
        self._line_start = offset  # where the line being assembled began: the safe offset
        self._partial = bytearray()
        self._skipping_long = False
        self._counts = [0, 0, 0, 0, 0]  # FollowStats fields, in order
        self._observer: BaseObserver | None = None
        self._stopping = threading.Event()
        self._recheck_thread: threading.Thread | None = None
        self._error_logged = False
        # Lines read but not yet handed to the loop, with their own small lock so the loop
        # never waits behind a file read.
        self._pending: list[str] = []
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False

    @property
    def offset(self) -> int:
        """End of the last complete line of the current file: resume from here."""
        return self._line_start

    @property
    def stats(self) -> FollowStats:
        return FollowStats(*self._counts)

    def start(self) -> None:
        """Watch the directory and deliver the backlog after `offset`, then each new line."""
        observer = Observer()
        observer.schedule(
            _LogEvents(self.path.name, self._pump),
            str(self.path.parent),
            recursive=False,
            event_filter=[FileModifiedEvent, FileCreatedEvent, FileMovedEvent],
        )
        observer.daemon = True
        observer.start()
        self._observer = observer
        # The first pump (the backlog, possibly large) runs here too, not on the loop.
        self._recheck_thread = threading.Thread(
            target=self._recheck, name=f"logfollow:{self.path.name}", daemon=True
        )
        self._recheck_thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None
        if self._recheck_thread is not None:
            self._recheck_thread.join()
            self._recheck_thread = None
        with self._lock:
            self._close()

    def stats_dict(self) -> dict[str, int]:
        """stats plus the offset, JSON-ready (for `trainwarden status`)."""
        return {**self.stats._asdict(), "offset": self.offset}

    def read_new(self) -> list[str]:
        """Read the complete lines there now, pass them to on_lines and return them.

        On the loop (a final drain when the trainer exits) on_lines runs before this
        returns, after any lines the watchdog thread read earlier: order is kept. The
        read blocks, so on the loop it is for those short drains only.
        """
        lines: list[str] = []

        def sink(batch: list[str]) -> None:
            lines.extend(batch)
            self._deliver(batch)

        self._read(sink)
        # A loop that is not running (the daemon shutting down) would never run the
        # scheduled flush: deliver now rather than lose lines the offset already counts.
        if self._loop is not None and (self._on_loop_thread() or not self._loop.is_running()):
            self._flush()
        return lines

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _recheck(self) -> None:
        self._pump()
        while not self._stopping.wait(self._recheck_s):
            self._pump()

    def _pump(self) -> None:
        if not self._stopping.is_set():
            self._read(self._deliver)

    def _deliver(self, lines: list[str]) -> None:
        if self._on_lines is None:
            return
        if self._loop is None:
            self._on_lines(lines)
            return
        with self._pending_lock:
            self._pending.extend(lines)
            if self._flush_scheduled:
                return  # the loop has not run the last flush yet: it will take these too
            self._flush_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:
            pass  # the loop has closed: the daemon is shutting down

    def _flush(self) -> None:
        """On the loop: hand everything read so far to on_lines, oldest first."""
        with self._pending_lock:
            lines, self._pending = self._pending, []
            self._flush_scheduled = False
        if lines and self._on_lines is not None:
            self._on_lines(lines)

    # -- reading (any thread; the lock keeps the watchdog and recheck threads in order) --

    def _read(self, sink: Callable[[list[str]], None]) -> None:
        with self._lock:
            try:
                self._read_locked(sink)
            except OSError as exc:
                if not self._error_logged:
                    log.warning("cannot read %s: %s", self.path, exc)
                    self._error_logged = True

    def _read_locked(self, sink: Callable[[list[str]], None]) -> None:
        if self._fd is None and not self._open(at_start=False):
            return
        assert self._fd is not None
        if os.fstat(self._fd).st_size < self._read_pos:
            self._counts[3] += 1
            self._restart_at_zero()
        self._drain(sink)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # moved away and not yet recreated: keep the old file until it is
        if (st.st_dev, st.st_ino) != self._file_id:
            self._drain(sink)  # the writer may have added to the old file before the move
            if self._partial and not self._skipping_long:
                sink(self._decode([bytes(self._partial)]))
            self._counts[4] += 1
            self._close()
            self._restart_at_zero()  # also when the open below loses a race with another move
            if self._open(at_start=True):
                self._drain(sink)

    def _open(self, *, at_start: bool) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        self._fd, self._file_id = fd, (st.st_dev, st.st_ino)
        if at_start:
            self._restart_at_zero()
        elif st.st_size < self._read_pos:
            self._counts[3] += 1  # shrank while nobody followed it
            self._restart_at_zero()
        return True

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _restart_at_zero(self) -> None:
        self._read_pos = self._line_start = 0
        self._partial.clear()
        self._skipping_long = False

    def _drain(self, sink: Callable[[list[str]], None]) -> None:
        assert self._fd is not None
        while chunk := os.pread(self._fd, READ_CHUNK_BYTES, self._read_pos):
            lines = self._split(chunk)
            self._read_pos += len(chunk)
            if lines:
                sink(self._decode(lines))

    def _split(self, chunk: bytes) -> list[bytes]:
        """The complete lines this chunk finishes; the rest waits in self._partial."""
        pieces = chunk.split(b"\n")
        tail = pieces.pop()
        complete: list[bytes] = []
        if pieces:
            self._line_start = self._read_pos + len(chunk) - len(tail)
            first = pieces[0]
            if self._skipping_long:
                # The newline that ends an overlong line: that line is already counted.
                self._skipping_long = False
                pieces = pieces[1:]
            elif self._partial:
                self._partial += first
                pieces[0] = bytes(self._partial)
            self._partial.clear()
            for line in pieces:
                if len(line) > self._max_line_bytes:
                    self._counts[1] += 1
                else:
                    complete.append(line)
        if not self._skipping_long:
            self._partial += tail
            if len(self._partial) > self._max_line_bytes:
                self._counts[1] += 1
                self._skipping_long = True
                self._partial.clear()
        return complete

    def _decode(self, lines: list[bytes]) -> list[str]:
        decoded = []
        for raw in lines:
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            try:
                decoded.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                self._counts[2] += 1
                decoded.append(raw.decode("utf-8", errors="replace"))
        self._counts[0] += len(decoded)
        return decoded
