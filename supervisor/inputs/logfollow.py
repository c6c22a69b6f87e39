"""Follows the run log as the trainer writes it, the way `tail -F` does, without polling.

An inotify instance (watchdog's binding of it) watches the log file for writes, and its
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
import ctypes
import errno
import logging
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from watchdog.observers.inotify_c import InotifyConstants, inotify_add_watch, inotify_init

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024
READ_CHUNK_BYTES = 1 << 20
LOOP_READ_BYTES = 4 << 20
"""At most this much of the log is read per loop callback; the rest in the next ones."""
# Only a safety net for events inotify never delivers (a queue overflow, a network
# filesystem that does not report remote writes): the hot path is event-driven.
SAFETY_RECHECK_S = 5.0
FALLBACK_POLL_S = 0.25
"""How often the log is read when inotify cannot be had at all."""
_EVENTS_BUFFER = 64 * 1024

# The log itself: appends and truncations (both IN_MODIFY), and its being moved or deleted.
FILE_MASK = (
    InotifyConstants.IN_MODIFY | InotifyConstants.IN_MOVE_SELF | InotifyConstants.IN_DELETE_SELF
)
# Its directory: only a file appearing under the log's name (logrotate's create, a rename).
DIR_MASK = InotifyConstants.IN_CREATE | InotifyConstants.IN_MOVED_TO
_SELF_GONE = InotifyConstants.IN_MOVE_SELF | InotifyConstants.IN_DELETE_SELF
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name


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
        self._skipping_long = False
        self._counts = [0, 0, 0, 0, 0]  # FollowStats fields, in order
        self._name = os.fsencode(self.path.name)
        self._inotify: int | None = None
        self._dir_wd = -1
        self._watch_error_logged = False
        # Whether the log's name may point at another file now (a directory event, the
        # file moved or deleted): only then is the name looked up again on a read.
        self._name_may_have_moved = True
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r: int | None = None
        self._wake_w: int | None = None
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
                self._loop.add_reader(self._inotify, self._on_inotify)
            self._recheck_handle = self._loop.call_soon(self._recheck)  # the backlog first
        else:
            self._wake_r, self._wake_w = os.pipe()
            self._thread = threading.Thread(
                target=self._wait_forever, name=f"logfollow:{self.path.name}", daemon=True
            )
            self._thread.start()

    def _start_inotify(self) -> None:
        fd = inotify_init()
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot watch {self.path}: inotify: {os.strerror(err)}")
        os.set_inheritable(fd, False)  # not for the trainer
        os.set_blocking(fd, False)
        self._inotify = fd
        self._dir_wd = self._add_watch(os.fsencode(self.path.parent), DIR_MASK)
        if self._dir_wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot watch {self.path.parent}: {os.strerror(err)}")
        self._watch_file()

    def stop(self) -> None:
        self._stopping.set()
        for handle in (self._recheck_handle, self._more_handle):
            if handle is not None:
                handle.cancel()
        if self._loop is not None and self._inotify is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._inotify)
        if self._thread is not None:
            assert self._wake_w is not None
            os.write(self._wake_w, b"x")
            self._thread.join()
            self._thread = None
        for fd in (self._wake_r, self._wake_w):
            if fd is not None:
                os.close(fd)
        self._wake_r = self._wake_w = None
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

    def _add_watch(self, path: bytes, mask: int) -> int:
        assert self._inotify is not None
        return int(inotify_add_watch(self._inotify, path, mask))

    def _watch_file(self) -> None:
        """Watch whatever file the log's name points at now (none yet: the directory
        watch will tell us when one appears). A watch on a file that was replaced stays
        until that file is gone; its events still mean "read again"."""
        if self._add_watch(os.fsencode(self.path), FILE_MASK) >= 0:
            return
        err = ctypes.get_errno()
        if err != errno.ENOENT and not self._watch_error_logged:
            self._watch_error_logged = True
            log.warning(
                "cannot watch %s: %s; it is read every %g s until it can be",
                self.path,
                os.strerror(err),
                self._recheck_s,
            )

    def _close_inotify(self) -> None:
        if self._inotify is not None:
            os.close(self._inotify)  # also drops every watch
            self._inotify = None

    def _take_events(self) -> bool:
        """Read the queued inotify events; True when the log may have changed."""
        assert self._inotify is not None
        wake = rewatch = False
        while True:
            try:
                data = os.read(self._inotify, _EVENTS_BUFFER)
            except BlockingIOError:
                break
            pos = 0
            while pos + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
                name = data[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
                pos += _EVENT.size + length
                if mask & InotifyConstants.IN_Q_OVERFLOW:
                    wake = rewatch = True  # events were lost: look at everything again
                elif wd == self._dir_wd:
                    if name == self._name:
                        wake = rewatch = True
                elif not mask & InotifyConstants.IN_IGNORED:
                    wake = True  # the log (or a file it replaced) was written or moved
                    if mask & _SELF_GONE:
                        self._name_may_have_moved = True
            if len(data) <= _EVENTS_BUFFER - 4096:
                break  # room to spare in the buffer: the queue was drained
        if rewatch:
            self._name_may_have_moved = True
            self._watch_file()
        return wake

    def _on_inotify(self) -> None:
        """On the loop: the inotify descriptor is readable."""
        if self._inotify is not None and self._take_events():
            self._pump()

    def _recheck(self) -> None:
        """On the loop: the backlog at start, then the safety net every recheck_s."""
        if self._stopping.is_set() or self._loop is None:
            return
        self._name_may_have_moved = True
        self._pump()
        self._recheck_handle = self._loop.call_later(self._recheck_s, self._recheck)

    def _wait_forever(self) -> None:
        """Without a loop: wait on inotify (and the stop pipe) in this thread."""
        assert self._wake_r is not None
        poller = select.poll()
        if self._inotify is not None:
            poller.register(self._inotify, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        self._pump()  # the backlog
        while not self._stopping.is_set():
            ready = poller.poll(self._recheck_s * 1000)
            if self._stopping.is_set():
                return
            if not ready:
                self._name_may_have_moved = True  # the safety net: look at everything
                self._pump()
            elif self._take_events():
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
        while chunk := os.pread(self._fd, READ_CHUNK_BYTES, self._read_pos):
            lines = self._split(chunk)
            self._read_pos += len(chunk)
            done += len(chunk)
            if lines:
                sink(self._decode(lines))
            if len(chunk) < READ_CHUNK_BYTES:
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
