"""inotify(7): one watcher for the run log and the checkpoint directory.

The three calls (inotify_init1, inotify_add_watch, inotify_rm_watch) are bound in
trainwarden/libc.py, the project's one module of C library calls: each raises the OSError
of its errno, or LibcUnavailable (an OSError too) where the C library has no inotify, so
an owner that catches OSError falls back to polling. This module opens the descriptor,
reads and parses the events from it, and keeps the watches' paths.

The descriptor is opened non-blocking and close-on-exec (the trainer never inherits it)
and, with an asyncio loop, sits in the loop's epoll set: a change wakes the loop once and
the queued events are read and handed to the owner in that same callback, no thread
hop. Without a loop, a `WatchThread` waits on the descriptor instead; with no inotify at
all (no kernel support, fs.inotify.max_user_instances or max_user_watches spent) the same
thread only wakes on its timeout, for its owner to poll.

Why not watchdog: following the log through watchdog's observer was measured against this
(docs/benchmarks.md, "File events"): four thread hand-offs per event doubled the daemon's CPU
per logged line at 10 and 100 lines/s and raised the idle NaN -> kill p99 from 2.3-2.5 to
3.7-5.2 ms; section 7 of the bench keeps the comparison (its "watchdog floor" column).

Events come as they are queued (`InotifyEvent`: wd, mask, cookie, name). Two need their
owner's attention: IN_Q_OVERFLOW (wd -1: events were lost, so look at everything again)
and IN_IGNORED (the watch is gone: its file was deleted, its filesystem unmounted, or it
was removed); `Inotify` forgets an ignored watch's path once its owner has seen the event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

# Module attributes, so a test can take one away.
from trainwarden.libc import inotify_add_watch, inotify_init1, inotify_rm_watch

log = logging.getLogger(__name__)

# <sys/inotify.h>; the events a watch can ask for...
IN_ACCESS = 0x00000001
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_CLOSE_NOWRITE = 0x00000010
IN_OPEN = 0x00000020
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
# ...those the kernel sends unasked...
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ISDIR = 0x40000000
# ...and how a watch is added.
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

EVENT_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name
READ_BYTES = 64 * 1024
# The largest record (a 255-byte name, its NUL and padding) with room to spare: a read that
# leaves this much of the buffer unused took everything that was queued.
_ROOM_FOR_ONE_MORE = 4096


class InotifyEvent(NamedTuple):
    wd: int
    """The watch it came from (-1 for IN_Q_OVERFLOW)."""
    mask: int
    """What happened (IN_*), with IN_ISDIR when it happened to a directory."""
    cookie: int
    """Pairs an IN_MOVED_FROM with its IN_MOVED_TO."""
    name: bytes
    """The entry inside a watched directory; empty for an event of the watched path itself."""


OnEvents = Callable[[list[InotifyEvent]], None]


def parse_events(data: bytes) -> list[InotifyEvent]:
    """The struct inotify_event records in `data`, as read(2) returned them."""
    events = []
    pos = 0
    while pos + EVENT_HEADER.size <= len(data):
        wd, mask, cookie, length = EVENT_HEADER.unpack_from(data, pos)
        start = pos + EVENT_HEADER.size
        events.append(InotifyEvent(wd, mask, cookie, data[start : start + length].rstrip(b"\0")))
        pos = start + length
    return events


class Inotify:
    """One inotify instance: its descriptor, its watches, and the events they queue.

    Raises OSError when no instance can be had (EMFILE, ENOSYS; LibcUnavailable: no
    inotify in the C library); add_watch raises it when the watch cannot be added
    (ENOENT, ENOSPC: out of watches).
    """

    def __init__(self) -> None:
        self.fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        self.paths: dict[int, bytes] = {}
        """Each watch's path, as it was added."""
        self._loop: asyncio.AbstractEventLoop | None = None

    def add_watch(self, path: Path | str | bytes, mask: int) -> int:
        raw = os.fsencode(path)
        wd = inotify_add_watch(self.fd, raw, mask)
        self.paths[wd] = raw  # the same file added again gets its old wd back
        return wd

    def rm_watch(self, wd: int) -> None:
        """Remove a watch; one already gone (its file deleted) is no error."""
        if self.paths.pop(wd, None) is not None:
            # EINVAL: its file went before its IN_IGNORED was read. Otherwise its
            # IN_IGNORED follows, and is then ignored.
            with contextlib.suppress(OSError):
                inotify_rm_watch(self.fd, wd)

    def read_events(self) -> list[InotifyEvent]:
        """Every event queued now; none when nothing is (the descriptor does not block)."""
        events: list[InotifyEvent] = []
        while True:
            try:
                data = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                break
            events += parse_events(data)
            if len(data) <= READ_BYTES - _ROOM_FOR_ONE_MORE:
                break  # room to spare: the queue was drained, no need for one more read
        return events

    def attach(self, loop: asyncio.AbstractEventLoop, on_events: OnEvents) -> None:
        """Read the events on `loop` as they come and hand each batch to on_events."""
        self._loop = loop
        loop.add_reader(self.fd, self.dispatch, on_events)

    def dispatch(self, on_events: OnEvents) -> None:
        """Read what is queued, hand it to on_events, then forget the watches that ended."""
        events = self.read_events()
        if not events:
            return
        try:
            on_events(events)
        finally:
            for event in events:
                if event.mask & IN_IGNORED:
                    self.paths.pop(event.wd, None)

    def close(self) -> None:
        """Stop reading and close the descriptor (which drops every watch)."""
        if self.fd < 0:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        self._loop = None
        os.close(self.fd)
        self.fd = -1
        self.paths.clear()


class WatchThread:
    """Without an event loop: a thread that waits for an Inotify's events and hands them
    to on_events, calling on_timeout whenever timeout_s pass without any. With no Inotify
    it only wakes on its timeout, for its owner to poll."""

    def __init__(
        self,
        name: str,
        inotify: Inotify | None,
        on_events: OnEvents,
        on_timeout: Callable[[], None],
        timeout_s: float,
    ) -> None:
        self.name = name
        self.inotify = inotify
        self.on_events = on_events
        self.on_timeout = on_timeout
        self.timeout_s = timeout_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1

    def start(self, first: Callable[[], None] | None = None) -> None:
        """Start waiting; `first` runs in the thread before the first wait."""
        self._wake_r, self._wake_w = os.pipe()  # not inheritable (PEP 446)
        self._thread = threading.Thread(target=self._run, args=(first,), name=self.name)
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it; its callbacks have all returned after this."""
        self._stopping.set()
        if self._thread is not None:
            os.write(self._wake_w, b"x")
            if self._thread is not threading.current_thread():
                self._thread.join()
            self._thread = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _run(self, first: Callable[[], None] | None) -> None:
        poller = select.poll()
        if self.inotify is not None:
            poller.register(self.inotify.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        if first is not None:
            self._guarded(first)
        while not self._stopping.is_set():
            ready = poller.poll(self.timeout_s * 1000)
            if self._stopping.is_set():
                return
            if not ready:
                self._guarded(self.on_timeout)
            elif self.inotify is not None:
                self._guarded(self.inotify.dispatch, self.on_events)

    def _guarded(self, callback: Callable[..., None], *args: object) -> None:
        # An exception must not end the thread: that would leave the file unwatched for good.
        try:
            callback(*args)
        except Exception:
            log.exception("%s: callback failed", self.name)
