"""Follows the run log as the trainer writes it, the way `tail -F` does, without polling.

An inotify instance (inputs/inotify.py) watches the log file for writes, and its
directory for a new file taking the log's name. With an asyncio loop, the inotify
descriptor is one more reader in the loop's epoll set: a write wakes the loop once, the
new bytes are read and the complete lines handed to `on_lines` in the same callback. One
wake-up per write, no thread hop: that wake-up is most of what a step line costs the
daemon, so this is what keeps a quiet run cheap. Without a loop a small thread waits on
the descriptor instead.

- A partial last line is held until its newline arrives.
- A line over MAX_LINE_BYTES is skipped (counted): it is not a step line, and holding it
  would let one runaway print grow the daemon without bound.
- Bytes that are not UTF-8 are replaced with U+FFFD and the line delivered (counted):
  a step line with one bad byte still reports its loss.
- copytruncate (the file shrinks below our offset): start again from its beginning.
- logrotate's move-and-create (the path names another inode): finish reading the old
  file, deliver its unterminated last line, then follow the new one from its start.
- A long backlog is read LOOP_READ_BYTES at a time, the loop running other callbacks in
  between, so a runaway print never stalls the daemon.

`offset` is the end of the last complete line read, for the daemon to persist; a
follower started at that offset picks up exactly where this one stopped. (A copytruncate
that happens while nobody follows, and the file grows past the saved offset before we
start, cannot be told apart from appends; no byte-offset follower can.)
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from trainwarden.supervisor.inputs.inotify import (
    IN_CREATE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
    InotifyEvent,
    WatchThread,
)

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024
READ_CHUNK_BYTES = 1 << 20
LOOP_READ_BYTES = 256 << 10
"""At most this much of the log is read per loop callback, the rest in the next ones: some
6,000 step lines, tens of ms of the daemon's work (4 MiB was seconds, during which the
control socket answered no one)."""
# Only a safety net for events inotify never delivers (a queue overflow, a network
# filesystem that does not report remote writes): the hot path is event-driven.
SAFETY_RECHECK_S = 5.0
FALLBACK_POLL_S = 0.25
"""How often the log is read when inotify cannot be had at all."""

# The log itself: appends and truncations (both IN_MODIFY), and its being moved or deleted.
FILE_MASK = IN_MODIFY | IN_MOVE_SELF | IN_DELETE_SELF
# Its directory: only a file appearing under the log's name (logrotate's create, a rename).
DIR_MASK = IN_CREATE | IN_MOVED_TO
_SELF_GONE = IN_MOVE_SELF | IN_DELETE_SELF


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


class LogFollower:
    """Delivers the lines appended to `path` after `offset` to `on_lines`, in order.

    With a loop, reading and on_lines both run on that loop (lines written while it was
    busy arrive together in one call); without one, in the follower's thread. read_new()
    reads synchronously (no inotify needed): it also passes the lines to on_lines and
    returns them.
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
        self._buffer: memoryview | None = None
        """What each read lands in, made once: a read of its own size each time (os.pread)
        had the C library map, shrink and unmap a MiB per step line."""
        self._skipping_long = False
        self._counts = [0, 0, 0, 0, 0]  # FollowStats fields, in order
        self._name = os.fsencode(self.path.name)
        self._inotify: Inotify | None = None
        self._dir_wd = -1
        self._watch_error_logged = False
        # Whether the log's name may point at another file now (a directory event, the
        # file moved or deleted): only then is the name looked up again on a read.
        self._name_may_have_moved = True
        self._stopping = threading.Event()
        self._thread: WatchThread | None = None
        self._recheck_handle: asyncio.Handle | None = None
        self._more_handle: asyncio.Handle | None = None
        self._error_logged = False

    @property
    def offset(self) -> int:
        """End of the last complete line of the current file: resume from here."""
        return self._line_start

    @property
    def stats(self) -> FollowStats:
        return FollowStats(*self._counts)

    def start(self) -> None:
        """Watch the log and deliver the backlog after `offset`, then each new line."""
        try:
            self._start_inotify()
        except OSError as exc:
            # Out of inotify instances or watches (fs.inotify.max_user_*): keep following,
            # by reading often, rather than leave the run unwatched.
            log.warning("%s; reading %s every %g s instead", exc, self.path.name, FALLBACK_POLL_S)
            self._close_inotify()
            self._recheck_s = min(self._recheck_s, FALLBACK_POLL_S)
        if self._loop is not None:
            if self._inotify is not None:
                self._inotify.attach(self._loop, self._on_events)
            self._recheck_handle = self._loop.call_soon(self._recheck)  # the backlog first
        else:
            self._thread = WatchThread(
                f"logfollow:{self.path.name}",
                self._inotify,
                self._on_events,
                self._on_quiet,
                self._recheck_s,
            )
            self._thread.start(first=self._pump)  # the backlog

    def _start_inotify(self) -> None:
        self._inotify = Inotify()
        self._dir_wd = self._inotify.add_watch(self.path.parent, DIR_MASK)
        self._watch_file()

    def stop(self) -> None:
        self._stopping.set()
        for handle in (self._recheck_handle, self._more_handle):
            if handle is not None:
                handle.cancel()
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        self._close_inotify()
        with self._lock:
            self._close()

    def stats_dict(self) -> dict[str, int]:
        """stats plus the offset, JSON-ready (for `trainwarden status`)."""
        return {**self.stats._asdict(), "offset": self.offset}

    def read_new(self) -> list[str]:
        """Read the complete lines there now, pass them to on_lines and return them.

        With a loop, call it on that loop's thread (a final drain when the trainer exits)
        or while the loop is not running: on_lines runs before this returns, after every
        line read earlier, so order is kept. The read blocks, so on the loop it is for
        those short drains only.
        """
        if self._loop is not None and self._loop.is_running() and not self._on_loop_thread():
            raise RuntimeError("read_new() must run on the follower's event loop")
        lines: list[str] = []

        def sink(batch: list[str]) -> None:
            lines.extend(batch)
            self._deliver(batch)

        self._name_may_have_moved = True
        self._read(sink)
        return lines

    # -- inotify --------------------------------------------------------------

    def _watch_file(self) -> None:
        """Watch whatever file the log's name points at now (none yet: the directory
        watch will tell us when one appears). A watch on a file that was replaced stays
        until that file is gone; its events still mean "read again"."""
        assert self._inotify is not None
        try:
            self._inotify.add_watch(self.path, FILE_MASK)
        except OSError as exc:
            if exc.errno != errno.ENOENT and not self._watch_error_logged:
                self._watch_error_logged = True
                log.warning("%s; it is read every %g s until it can be", exc, self._recheck_s)

    def _close_inotify(self) -> None:
        if self._inotify is not None:
            self._inotify.close()  # also drops every watch
            self._inotify = None

    def _may_have_changed(self, events: list[InotifyEvent]) -> bool:
        """True when these events say the log may have changed."""
        wake = rewatch = False
        for event in events:
            if event.mask & IN_Q_OVERFLOW:
                wake = rewatch = True  # events were lost: look at everything again
            elif event.wd == self._dir_wd:
                if event.name == self._name:
                    wake = rewatch = True
            elif not event.mask & IN_IGNORED:
                wake = True  # the log (or a file it replaced) was written or moved
                if event.mask & _SELF_GONE:
                    self._name_may_have_moved = True
        if rewatch and self._inotify is not None:
            self._name_may_have_moved = True
            self._watch_file()
        return wake

    def _on_events(self, events: list[InotifyEvent]) -> None:
        """On the loop (or the follower's thread): inotify has news."""
        if not self._stopping.is_set() and self._may_have_changed(events):
            self._pump()

    def _recheck(self) -> None:
        """On the loop: the backlog at start, then the safety net every recheck_s."""
        if self._stopping.is_set() or self._loop is None:
            return
        self._name_may_have_moved = True
        self._pump()
        self._recheck_handle = self._loop.call_later(self._recheck_s, self._recheck)

    def _on_quiet(self) -> None:
        """In the follower's thread, recheck_s without an event: the safety net."""
        self._name_may_have_moved = True  # look at everything
        self._pump()

    def _pump(self) -> None:
        if self._stopping.is_set():
            return
        if self._loop is None:
            self._read(self._deliver)
            return
        # On the loop: a bounded read, the rest in the next callback.
        if self._more_handle is not None:
            self._more_handle.cancel()
            self._more_handle = None
        if self._read(self._deliver, LOOP_READ_BYTES):
            self._more_handle = self._loop.call_soon(self._pump)

    def _deliver(self, lines: list[str]) -> None:
        if self._on_lines is not None:
            self._on_lines(lines)

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    # -- reading (the lock keeps a read_new() caller and the follower's thread in order) --

    def _read(self, sink: Callable[[list[str]], None], limit: int | None = None) -> bool:
        """Read what is new, up to about `limit` bytes; True when more is waiting."""
        with self._lock:
            try:
                return self._read_locked(sink, limit)
            except OSError as exc:
                if not self._error_logged:
                    log.warning("cannot read %s: %s", self.path, exc)
                    self._error_logged = True
                return False

    def _read_locked(self, sink: Callable[[list[str]], None], limit: int | None) -> bool:
        if self._fd is None and not self._open(at_start=False):
            return False
        assert self._fd is not None
        if os.fstat(self._fd).st_size < self._read_pos:
            self._counts[3] += 1
            self._restart_at_zero()
        if self._drain(sink, limit):
            return True
        if not self._name_may_have_moved:
            return False  # inotify would have said if another file took the name
        self._name_may_have_moved = False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # moved away and not yet recreated: keep the old file until it is
        if (st.st_dev, st.st_ino) != self._file_id:
            self._drain(sink)  # the writer may have added to the old file before the move
            if self._partial and not self._skipping_long:
                sink(self._decode([bytes(self._partial)]))
            self._counts[4] += 1
            self._close()
            self._restart_at_zero()  # also when the open below loses a race with another move
            if self._open(at_start=True):
                return self._drain(sink, limit)
        return False

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

    def _drain(self, sink: Callable[[list[str]], None], limit: int | None = None) -> bool:
        """Read to the end of the file, or until `limit` bytes: then True (more to read)."""
        assert self._fd is not None
        done = 0
        size = READ_CHUNK_BYTES if limit is None else min(READ_CHUNK_BYTES, limit)
        if self._buffer is None:
            # Private anonymous memory: a page is resident only once a read has reached it.
            self._buffer = memoryview(mmap.mmap(-1, READ_CHUNK_BYTES, flags=mmap.MAP_PRIVATE))
        into = self._buffer[:size]
        while got := os.preadv(self._fd, [into], self._read_pos):
            chunk = bytes(into[:got])  # the sink may read the log again (this buffer too)
            lines = self._split(chunk)
            self._read_pos += len(chunk)
            done += len(chunk)
            if lines:
                sink(self._decode(lines))
            if len(chunk) < size:
                return False  # a short read: that was the end
            if limit is not None and done >= limit:
                return True
        return False

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
