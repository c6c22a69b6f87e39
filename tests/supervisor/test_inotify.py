"""The inotify binding against real files and a real loop; the parser on built buffers."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
import threading
import time
from pathlib import Path

import pytest

from trainwarden.supervisor.inputs import inotify
from trainwarden.supervisor.inputs.inotify import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
    InotifyEvent,
    WatchThread,
    parse_events,
)

pytestmark = pytest.mark.timeout(60)

EVERYTHING = IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF


def wait_events(ino: Inotify, until, timeout_s: float = 5.0) -> list[InotifyEvent]:
    """Events read from `ino` until `until(events)` holds."""
    events: list[InotifyEvent] = []
    deadline = time.monotonic() + timeout_s
    while not until(events):
        assert time.monotonic() < deadline, f"only {events!r}"
        events += ino.read_events()
        time.sleep(0.01)
    return events


def masks_for(events: list[InotifyEvent], name: bytes) -> list[int]:
    return [e.mask for e in events if e.name == name]


def record(wd: int, mask: int, cookie: int, name: bytes, padded_to: int = 16) -> bytes:
    length = 0 if not name else -(-(len(name) + 1) // padded_to) * padded_to
    return struct.pack("iIII", wd, mask, cookie, length) + name.ljust(length, b"\0")


def test_create_modify_close_write_and_moves_in_a_directory(tmp_path: Path):
    ino = Inotify()
    try:
        wd = ino.add_watch(tmp_path, EVERYTHING)
        with open(tmp_path / "a.tmp", "wb") as f:
            f.write(b"x")
        os.rename(tmp_path / "a.tmp", tmp_path / "a")
        (tmp_path / "sub").mkdir()
        events = wait_events(ino, lambda ev: any(e.name == b"sub" for e in ev))
        assert {e.wd for e in events} == {wd}
        assert masks_for(events, b"a.tmp") == [IN_CREATE, IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_FROM]
        assert masks_for(events, b"a") == [IN_MOVED_TO]
        moved_from = next(e for e in events if e.mask == IN_MOVED_FROM)
        moved_to = next(e for e in events if e.mask == IN_MOVED_TO)
        assert moved_from.cookie == moved_to.cookie != 0  # the two halves of one rename
        assert masks_for(events, b"sub") == [IN_CREATE | IN_ISDIR]
    finally:
        ino.close()


def test_a_file_watch_reports_writes_then_its_deletion_and_end(tmp_path: Path):
    path = tmp_path / "log"
    path.write_bytes(b"")
    ino = Inotify()
    try:
        wd = ino.add_watch(path, IN_MODIFY | IN_DELETE_SELF)
        assert ino.paths == {wd: os.fsencode(path)}
        with open(path, "ab") as f:
            f.write(b"line\n")
        path.unlink()
        events = wait_events(ino, lambda ev: any(e.mask & IN_IGNORED for e in ev))
        assert [e.mask for e in events] == [IN_MODIFY, IN_DELETE_SELF, IN_IGNORED]
        assert all(e.wd == wd and e.name == b"" for e in events)
    finally:
        ino.close()


def test_an_ended_watch_is_forgotten_after_its_owner_saw_it(tmp_path: Path):
    path = tmp_path / "f"
    path.write_bytes(b"")
    ino = Inotify()
    try:
        wd = ino.add_watch(path, IN_DELETE_SELF)
        path.unlink()
        seen: list[list[InotifyEvent]] = []

        def owner(events: list[InotifyEvent]) -> None:
            seen.append(events)
            assert wd in ino.paths  # still known while the owner looks at its IN_IGNORED

        deadline = time.monotonic() + 5
        while not seen:
            assert time.monotonic() < deadline
            ino.dispatch(owner)
            time.sleep(0.01)
        assert wd not in ino.paths
    finally:
        ino.close()


def test_adding_a_watch_that_cannot_be_had_raises_with_the_errno(tmp_path: Path):
    ino = Inotify()
    try:
        with pytest.raises(OSError) as raised:
            ino.add_watch(tmp_path / "missing", IN_MODIFY)
        assert raised.value.errno == errno.ENOENT and "missing" in str(raised.value)
    finally:
        ino.close()


def test_parser_reads_records_with_padded_names_and_an_overflow():
    data = (
        record(1, IN_CREATE, 0, b"step_000010.bin.tmp")
        + record(-1, IN_Q_OVERFLOW, 0, b"")
        + record(2, IN_MOVED_TO, 7, b"x" * 255)  # the longest name there is
        + record(1, IN_IGNORED, 0, b"")
    )
    assert parse_events(data) == [
        InotifyEvent(1, IN_CREATE, 0, b"step_000010.bin.tmp"),
        InotifyEvent(-1, IN_Q_OVERFLOW, 0, b""),
        InotifyEvent(2, IN_MOVED_TO, 7, b"x" * 255),
        InotifyEvent(1, IN_IGNORED, 0, b""),
    ]
    assert parse_events(data[:10]) == []  # a torn header is not a record


def test_descriptor_is_not_inherited_and_closed_by_close(tmp_path: Path):
    before = set(os.listdir("/proc/self/fd"))
    ino = Inotify()
    fd = ino.fd
    assert not os.get_inheritable(fd)
    assert not os.get_blocking(fd)
    assert ino.read_events() == []  # nothing queued: returns at once
    ino.close()
    assert set(os.listdir("/proc/self/fd")) <= before
    with pytest.raises(OSError):
        os.fstat(fd)
    ino.close()  # twice is harmless


def test_no_inotify_raises_the_reason(monkeypatch: pytest.MonkeyPatch):
    def out_of_instances(flags: int) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(inotify, "inotify_init1", out_of_instances)
    with pytest.raises(OSError) as raised:
        Inotify()
    assert raised.value.errno == errno.EMFILE


async def test_on_a_loop_events_arrive_on_its_thread_and_stop_with_close(tmp_path: Path):
    loop = asyncio.get_running_loop()
    got: list[InotifyEvent] = []
    threads: set[int] = set()
    arrived = asyncio.Event()

    def on_events(events: list[InotifyEvent]) -> None:
        threads.add(threading.get_ident())
        got.extend(events)
        arrived.set()

    ino = Inotify()
    ino.add_watch(tmp_path, IN_CREATE)
    ino.attach(loop, on_events)
    (tmp_path / "a").touch()
    await asyncio.wait_for(arrived.wait(), 5)
    assert [e.name for e in got] == [b"a"] and threads == {threading.get_ident()}
    fd = ino.fd
    ino.close()
    assert not loop.remove_reader(fd)  # close() took it out of the loop already


def test_watch_thread_delivers_events_and_times_out_between_them(tmp_path: Path):
    ino = Inotify()
    ino.add_watch(tmp_path, IN_CREATE)
    got: list[bytes] = []
    quiet = threading.Event()
    thread = WatchThread(
        "test", ino, lambda events: got.extend(e.name for e in events), quiet.set, 0.05
    )
    before = set(os.listdir("/proc/self/fd"))
    thread.start(first=lambda: got.append(b"first"))
    try:
        (tmp_path / "a").touch()
        deadline = time.monotonic() + 5
        while len(got) < 2:
            assert time.monotonic() < deadline, got
            time.sleep(0.01)
        assert got == [b"first", b"a"]
        assert quiet.wait(5)
    finally:
        thread.stop()
        ino.close()
    assert set(os.listdir("/proc/self/fd")) < before  # its pipe and the inotify descriptor


def test_watch_thread_survives_a_failing_callback(tmp_path: Path):
    calls = []

    def fails() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    thread = WatchThread("test", None, lambda events: None, fails, 0.01)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while len(calls) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        thread.stop()
