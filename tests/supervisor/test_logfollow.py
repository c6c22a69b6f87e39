"""LogFollower against real files, real inotify events and a real asyncio loop."""

import asyncio
import errno
import os
import threading
import time

import pytest

from trainwarden.libc import LibcUnavailable
from trainwarden.supervisor.inputs.logfollow import LogFollower

WAIT_S = 2.0  # generous: these tests check behaviour; latency figures live in bench/


class Collector:
    def __init__(self):
        self.lines: list[str] = []
        self.threads: set[int] = set()
        self.arrived = asyncio.Event()

    def __call__(self, lines):
        self.threads.add(threading.get_ident())
        self.lines.extend(lines)
        self.arrived.set()

    async def wait_for(self, count):
        deadline = time.monotonic() + WAIT_S
        while len(self.lines) < count:
            self.arrived.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"got {self.lines!r}, wanted {count} lines")
            try:
                await asyncio.wait_for(self.arrived.wait(), remaining)
            except TimeoutError:
                pass
        return self.lines


def append(path, data: bytes):
    with open(path, "ab") as f:
        f.write(data)


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "training.log"
    path.write_bytes(b"")
    return path


@pytest.fixture
async def follow(log):
    followers = []

    def start(offset=0, path=log, **kwargs):
        collector = Collector()
        follower = LogFollower(path, offset, collector, asyncio.get_running_loop(), **kwargs)
        follower.start()
        followers.append(follower)
        return follower, collector

    yield start
    for follower in followers:
        follower.stop()


async def test_appended_lines_arrive_on_the_loop(log, follow):
    follower, got = follow()
    append(log, b"step: 1, loss: 3.0, dt: 0.1\nstep: 2, loss: 2.9, dt: 0.1\n")
    assert await got.wait_for(2) == ["step: 1, loss: 3.0, dt: 0.1", "step: 2, loss: 2.9, dt: 0.1"]
    assert got.threads == {threading.get_ident()}  # read and delivered on the loop's thread
    assert follower.stats.lines == 2
    assert follower.offset == log.stat().st_size


async def test_backlog_after_offset_is_delivered_at_start(log, follow):
    append(log, b"old line\nstep: 5, loss: 1.0\n")
    follower, got = follow(offset=len(b"old line\n"))
    assert await got.wait_for(1) == ["step: 5, loss: 1.0"]


async def test_partial_line_is_held_until_its_newline(log, follow):
    follower, got = follow()
    append(log, b"step: 1, lo")
    await asyncio.sleep(0.2)
    assert got.lines == [] and follower.offset == 0
    append(log, b"ss: 3.0\n")
    assert await got.wait_for(1) == ["step: 1, loss: 3.0"]
    assert follower.offset == len(b"step: 1, loss: 3.0\n")


async def test_overlong_line_is_skipped_and_counted(log, follow):
    follower, got = follow()
    append(log, b"before\n" + b"x" * 100 * 1024)
    await asyncio.sleep(0.1)
    append(log, b"x" * 1024 + b"\nafter\n")
    assert await got.wait_for(2) == ["before", "after"]
    assert follower.stats.skipped_long == 1


async def test_overlong_complete_line_in_one_write(log, follow):
    follower, got = follow(max_line_bytes=10)
    append(log, b"short\n" + b"y" * 50 + b"\nshort 2\n")
    assert await got.wait_for(2) == ["short", "short 2"]
    assert follower.stats.skipped_long == 1


async def test_invalid_utf8_is_replaced_and_counted(log, follow):
    follower, got = follow()
    append(log, b"step: 1, loss: nan\xff\xfe\nplain\n")
    lines = await got.wait_for(2)
    assert lines[0].startswith("step: 1, loss: nan") and "\ufffd" in lines[0]
    assert lines[1] == "plain"
    assert follower.stats.undecodable == 1


async def test_crlf_line_endings(log, follow):
    _, got = follow()
    append(log, b"step: 1, loss: 3.0\r\n")
    assert await got.wait_for(1) == ["step: 1, loss: 3.0"]


async def test_copytruncate(log, follow):
    follower, got = follow()
    append(log, b"line one, long enough to be past the new end\n")
    await got.wait_for(1)
    # copytruncate: the content is copied elsewhere and the file cut to zero in place.
    with open(log, "r+b") as f:
        f.truncate(0)
    append(log, b"fresh\n")
    assert (await got.wait_for(2))[1] == "fresh"
    assert follower.stats.truncations == 1
    assert follower.offset == len(b"fresh\n")


async def test_logrotate_move_and_create(log, follow, tmp_path):
    follower, got = follow()
    with open(log, "ab", buffering=0) as writer:
        writer.write(b"first\n")
        await got.wait_for(1)
        os.rename(log, tmp_path / "training.log.1")
        writer.write(b"late write to the old file\n")  # the trainer still holds the old fd
    append(log, b"new file\n")
    lines = await got.wait_for(3)
    assert lines == ["first", "late write to the old file", "new file"]
    assert follower.stats.rotations == 1
    assert follower.offset == len(b"new file\n")


async def test_log_created_after_start(tmp_path, follow):
    path = tmp_path / "later.log"
    follower, got = follow(path=path)
    await asyncio.sleep(0.1)
    append(path, b"hello\n")
    assert await got.wait_for(1) == ["hello"]


async def test_restart_from_saved_offset_sees_each_line_once(log, follow):
    first, got_first = follow()
    append(log, b"a\nb\n")
    await got_first.wait_for(2)
    first.stop()
    append(log, b"c\n")  # written while no follower ran
    _, got_second = follow(offset=first.offset)
    append(log, b"d\n")
    assert await got_second.wait_for(2) == ["c", "d"]


def test_saved_offset_beyond_the_end_means_truncated(log):
    log.write_bytes(b"short\n")
    follower = LogFollower(log, 1000)
    assert follower.read_new() == ["short"]
    assert follower.stats.truncations == 1


async def test_read_new_on_the_loop_delivers_in_order_before_returning(log, follow):
    follower, got = follow()
    append(log, b"one\n")
    await got.wait_for(1)
    append(log, b"two\n")  # written, its inotify event not yet handled
    assert follower.read_new() == ["two"]
    assert got.lines == ["one", "two"]  # synchronously, oldest first
    await asyncio.sleep(0.05)
    assert got.lines == ["one", "two"]  # the pending inotify event found nothing more
    assert follower.stats_dict() == {
        "lines": 2, "skipped_long": 0, "undecodable": 0, "truncations": 0, "rotations": 0,
        "offset": 8,
    }  # fmt: skip


async def test_read_new_off_the_loop_is_refused(log, follow):
    follower, _ = follow()
    with pytest.raises(RuntimeError, match="event loop"):
        await asyncio.to_thread(follower.read_new)


def test_read_new_with_a_stopped_loop_still_delivers(log):
    loop = asyncio.new_event_loop()
    try:
        got = []
        follower = LogFollower(log, 0, got.extend, loop)
        append(log, b"last words\n")
        assert follower.read_new() == ["last words"]
        assert got == ["last words"]
    finally:
        loop.close()


def test_read_new_without_watchdog(log):
    follower = LogFollower(log, 0)
    append(log, b"one\ntw")
    assert follower.read_new() == ["one"]
    assert follower.read_new() == []
    append(log, b"o\n")
    assert follower.read_new() == ["two"]
    assert follower.offset == len(b"one\ntwo\n")


def test_callback_without_loop_runs_in_reader_thread(log):
    got = []
    follower = LogFollower(log, 0, got.extend)
    follower.start()
    try:
        append(log, b"x\n")
        deadline = time.monotonic() + WAIT_S
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == ["x"]
    finally:
        follower.stop()


async def test_line_latency_is_reported(log, follow, capsys):
    _, got = follow()
    await asyncio.sleep(0.05)
    latencies_ms = []
    for i in range(20):
        sent = time.perf_counter()
        append(log, f"step: {i}, loss: 3.0\n".encode())
        await got.wait_for(i + 1)
        latencies_ms.append((time.perf_counter() - sent) * 1000)
    latencies_ms.sort()
    with capsys.disabled():
        median_ms, max_ms = latencies_ms[10], latencies_ms[-1]
        print(f"\nlog line -> callback latency: median {median_ms:.2f} ms, max {max_ms:.2f} ms")
    assert latencies_ms[10] < WAIT_S * 1000


async def test_a_long_backlog_is_read_in_bounded_slices(log, follow, monkeypatch):
    monkeypatch.setattr("trainwarden.supervisor.inputs.logfollow.LOOP_READ_BYTES", 64 * 1024)
    monkeypatch.setattr("trainwarden.supervisor.inputs.logfollow.READ_CHUNK_BYTES", 16 * 1024)
    lines = [f"step: {i}, loss: 3.0, dt: 0.1" for i in range(20_000)]  # ~600 KB
    append(log, ("\n".join(lines) + "\n").encode())
    calls = []
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        follower, got = follow()
        original = follower._on_lines

        def counting(batch):
            calls.append(ticks)
            original(batch)

        follower._on_lines = counting
        assert await got.wait_for(len(lines)) == lines
    finally:
        task.cancel()
    # Several slices, with other callbacks run on the loop between them.
    assert len(set(calls)) > 5


async def test_a_backlog_of_megabytes_leaves_the_loop_to_others_between_slices(log, follow):
    """As shipped (no patched sizes): 2 MiB of step lines come in many callbacks, each at
    most LOOP_READ_BYTES, so a status request waits behind one slice, not the backlog.
    (Slices of 4 MiB, read 1 MiB at a time, held the loop for seconds.)"""
    from trainwarden.supervisor.inputs.logfollow import LOOP_READ_BYTES

    lines = [f"step: {i}, loss: 3.0, dt: 0.1" for i in range(70_000)]  # ~2 MiB
    append(log, ("\n".join(lines) + "\n").encode())
    batches: list[int] = []
    follower, got = follow()
    original = follower._on_lines

    def counting(batch):
        batches.append(sum(len(line) + 1 for line in batch))
        original(batch)

    follower._on_lines = counting
    assert await got.wait_for(len(lines)) == lines
    assert LOOP_READ_BYTES <= 256 << 10  # some 6,000 lines: tens of ms of the daemon's work
    assert max(batches) <= LOOP_READ_BYTES
    assert len(batches) >= 2 * 2**20 // LOOP_READ_BYTES


async def test_stop_closes_every_descriptor_it_opened(log, follow):
    before = set(os.listdir("/proc/self/fd"))
    follower, got = follow()
    append(log, b"x\n")
    await got.wait_for(1)
    follower.stop()
    assert set(os.listdir("/proc/self/fd")) <= before


def test_thread_mode_stop_closes_every_descriptor(log):
    before = set(os.listdir("/proc/self/fd"))
    follower = LogFollower(log, 0, lambda lines: None)
    follower.start()
    follower.stop()
    assert set(os.listdir("/proc/self/fd")) <= before


async def test_inotify_descriptor_is_not_inherited(log, follow):
    follower, _ = follow()
    assert follower._inotify is not None
    assert not os.get_inheritable(follower._inotify.fd)


async def test_without_inotify_the_log_is_still_followed(log, follow, monkeypatch, caplog):
    # Out of inotify instances (fs.inotify.max_user_instances): read often instead.
    def no_inotify(flags):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr("trainwarden.supervisor.inputs.inotify.inotify_init1", no_inotify)
    follower, got = follow()
    assert follower._inotify is None
    assert "Too many open files" in caplog.text and "every 0.25 s" in caplog.text
    append(log, b"step: 1, loss: 3.0\n")
    assert await got.wait_for(1) == ["step: 1, loss: 3.0"]


def test_without_inotify_the_thread_mode_follows_too(log, monkeypatch):
    def no_inotify(flags):
        raise LibcUnavailable("no inotify_init1")

    monkeypatch.setattr("trainwarden.supervisor.inputs.inotify.inotify_init1", no_inotify)
    got = []
    follower = LogFollower(log, 0, got.extend)
    follower.start()
    try:
        append(log, b"x\n")
        deadline = time.monotonic() + WAIT_S
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == ["x"]
    finally:
        follower.stop()
