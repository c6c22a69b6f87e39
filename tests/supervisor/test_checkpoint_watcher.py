"""The checkpoint watcher wakes for what commits or writes a checkpoint, not for reads;
without inotify it scans."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
import threading
import time
from pathlib import Path

import pytest

from trainwarden.libc import LibcUnavailable
from trainwarden.plugins.api import CheckpointInfo
from trainwarden.plugins.formats.andrea_bin import AndreaBin, checkpoint_name
from trainwarden.supervisor.errors import CheckpointInvalid
from trainwarden.supervisor.inputs import inotify
from trainwarden.supervisor.inputs.checkpoint_watch import CheckpointWatcher
from trainwarden.supervisor.inputs.inotify import IN_Q_OVERFLOW, InotifyEvent
from trainwarden.supervisor.store.checkpoints import CheckpointStore

pytestmark = pytest.mark.timeout(60)


def andrea_bin(step: int, n_params: int = 4) -> bytes:
    return struct.pack("<ii", step, n_params) + bytes(12 * n_params)


async def test_reading_checkpoints_does_not_wake_the_watcher(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    final = store.dir / checkpoint_name(10)
    final.write_bytes(andrea_bin(10))
    events = []
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    watcher = CheckpointWatcher(store, loop, on_committed=seen.append, on_writing=lambda: None)
    original = watcher.on_events
    watcher.on_events = lambda batch: (events.extend(batch), original(batch))  # type: ignore[method-assign]
    watcher.start()
    try:
        await asyncio.sleep(0.2)

        def read_many() -> None:
            for _ in range(50):
                final.read_bytes()  # verification, a mirror copying, a user's cat
                os.listdir(store.dir)  # ls

        await asyncio.to_thread(read_many)
        await asyncio.sleep(0.5)
        assert events == []

        def commit() -> None:
            tmp = store.dir / (checkpoint_name(20) + ".tmp")
            tmp.write_bytes(andrea_bin(20))
            os.replace(tmp, store.dir / checkpoint_name(20))

        await asyncio.to_thread(commit)
        deadline = loop.time() + 5
        while not seen and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert seen == [checkpoint_name(20)]
    finally:
        watcher.stop()


class Folders:
    """A format whose checkpoint is a folder written in place, committed by state.json
    (as hf-trainer's is by trainer_state.json)."""

    name = "folders"

    def step_of(self, path: Path) -> int | None:
        if not path.name.startswith("ckpt-") or not (path / "state.json").is_file():
            return None
        return int(path.name[5:])

    def is_in_flight(self, path: Path) -> bool:
        return path.name.endswith(".tmp") or (
            path.name.startswith("ckpt-") and not (path / "state.json").exists()
        )

    def companions(self, path: Path) -> list[Path]:
        return []

    def commits_folder(self, path: Path) -> bool:
        return path.name == "state.json"

    def verify(self, path: Path) -> CheckpointInfo:
        if (path / "state.json").read_bytes() != b"done":
            raise CheckpointInvalid(f"{path.name}: state.json is not complete")
        return CheckpointInfo(self.step_of(path) or 0, path, 4)


class Watching:
    def __init__(self, store: CheckpointStore) -> None:
        self.committed: list[str] = []
        self.writes: list[float] = []
        self.loop = asyncio.get_running_loop()
        self.watcher = CheckpointWatcher(
            store,
            self.loop,
            on_committed=self.committed.append,
            on_writing=lambda: self.writes.append(time.monotonic()),
        )

    async def until(self, condition, timeout_s: float = 5.0) -> None:
        deadline = self.loop.time() + timeout_s
        while not condition():
            assert self.loop.time() < deadline, f"committed {self.committed}"
            await asyncio.sleep(0.02)

    async def settle(self, seconds: float = 0.3) -> None:
        await asyncio.sleep(seconds)


@pytest.fixture
async def folders(tmp_path: Path):
    store = CheckpointStore(tmp_path / "run" / "checkpoints", Folders())  # type: ignore[arg-type]
    store.ensure()
    watching = Watching(store)
    watching.watcher.start()
    await asyncio.sleep(0.1)
    yield store, watching
    watching.watcher.stop()


async def test_a_folder_written_in_place_commits_when_its_committing_file_is_closed(folders):
    store, w = folders

    def write_in_place() -> None:
        folder = store.dir / "ckpt-5"
        folder.mkdir()
        (folder / "weights").write_bytes(b"w" * 1000)
        with open(folder / "state.json", "wb") as f:
            f.write(b"do")
            f.flush()
            time.sleep(0.3)
            committed_while_open.append(list(w.committed))
            f.write(b"ne")
        (folder / "late-extra").write_bytes(b"x")  # another file's close commits nothing

    committed_while_open: list[list[str]] = []
    await asyncio.to_thread(write_in_place)
    await w.until(lambda: "ckpt-5" in w.committed)
    await w.settle()
    assert committed_while_open == [[]]
    assert w.committed == ["ckpt-5"]
    assert w.writes  # the folder's files being written are activity


async def test_a_folder_staged_and_renamed_commits(folders):
    store, w = folders

    def stage_and_rename() -> None:
        staged = store.dir / "ckpt-7.tmp"
        staged.mkdir()
        (staged / "weights").write_bytes(b"w")
        (staged / "state.json.part").write_bytes(b"done")
        os.rename(staged / "state.json.part", staged / "state.json")
        os.rename(staged, store.dir / "ckpt-7")

    await asyncio.to_thread(stage_and_rename)
    await w.until(lambda: "ckpt-7" in w.committed)
    await w.settle()
    assert set(w.committed) == {"ckpt-7"}
    # The folder's watch moved with it: a file renamed into place later commits it again.
    (store.dir / "ckpt-7" / "state.json.part").write_bytes(b"done")
    os.rename(store.dir / "ckpt-7" / "state.json.part", store.dir / "ckpt-7" / "state.json")
    await w.until(lambda: len(w.committed) >= 2)
    assert set(w.committed) == {"ckpt-7"}


async def test_a_whole_folder_renamed_in_from_another_folder_commits(folders, tmp_path: Path):
    store, w = folders
    outside = tmp_path / "run" / "staging"
    outside.mkdir()
    (outside / "state.json").write_bytes(b"done")
    os.rename(outside, store.dir / "ckpt-9")
    await w.until(lambda: w.committed == ["ckpt-9"])


async def test_a_folder_renamed_in_unfinished_commits_when_finished(folders, tmp_path: Path):
    store, w = folders
    outside = tmp_path / "run" / "staging"
    outside.mkdir()
    (outside / "weights").write_bytes(b"w")
    os.rename(outside, store.dir / "ckpt-11")
    await w.settle()
    assert w.committed == []
    (store.dir / "ckpt-11" / "state.json").write_bytes(b"done")
    await w.until(lambda: "ckpt-11" in w.committed)
    assert set(w.committed) == {"ckpt-11"}  # by its create (whole already) or its close


async def test_settle_reports_a_folder_written_whole_before_its_watch_came(folders):
    """Under load the loop reads a folder's create after the trainer wrote all of it (its
    files' events went unwatched): the commit is found by a check in a worker thread, and
    settle() (before a trainer's exit is decided on) waits for it."""
    store, w = folders
    folder = store.dir / "ckpt-12"
    folder.mkdir()  # the loop runs nothing until the await below
    (folder / "weights").write_bytes(b"w" * 1000)
    (folder / "state.json").write_bytes(b"done")
    await w.watcher.settle()
    assert w.committed == ["ckpt-12"]


async def test_settle_gives_up_on_a_check_the_file_system_holds(folders, monkeypatch):
    """A check stuck in the file system (a hung network mount) must not hold a trainer's
    exit for ever: settle() returns after SETTLE_MAX_S; the commit is reported later."""
    from trainwarden.supervisor.inputs import checkpoint_watch

    store, w = folders
    release = threading.Event()
    whole = w.watcher._arrived_whole
    monkeypatch.setattr(checkpoint_watch, "SETTLE_MAX_S", 0.3)
    monkeypatch.setattr(w.watcher, "_arrived_whole", lambda path: (release.wait(), whole(path))[1])
    folder = store.dir / "ckpt-13"
    folder.mkdir()
    (folder / "state.json").write_bytes(b"done")
    started = time.monotonic()
    await w.watcher.settle()
    assert time.monotonic() - started < 3.0 and w.committed == []
    release.set()
    await w.until(lambda: w.committed == ["ckpt-13"])


async def test_settle_waits_for_the_rescan_after_lost_events(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    w = Watching(store)
    w.watcher.start()
    try:
        (store.dir / checkpoint_name(50)).write_bytes(andrea_bin(50))
        w.watcher.on_events([InotifyEvent(-1, IN_Q_OVERFLOW, 0, b"")])
        await w.watcher.settle()
        assert checkpoint_name(50) in w.committed
    finally:
        w.watcher.stop()


async def test_quarantine_is_not_watched(folders):
    store, w = folders
    store.quarantine_dir.mkdir()
    (store.quarantine_dir / "ckpt-3").mkdir()
    (store.quarantine_dir / "ckpt-3" / "state.json").write_bytes(b"done")
    (store.quarantine_dir / "x.tmp").write_bytes(b"x")
    done = store.dir / "ckpt-4"
    done.mkdir()
    (done / "state.json").write_bytes(b"done")
    await w.until(lambda: w.committed == ["ckpt-4"])
    writes = len(w.writes)
    store.quarantine("ckpt-4")  # a folder leaving for quarantine/ is not a commit
    (store.quarantine_dir / "ckpt-4" / "state.json").write_bytes(b"done")
    await w.settle()
    assert w.committed == ["ckpt-4"] and len(w.writes) == writes


async def test_writes_in_flight_are_reported_at_most_once_a_second(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    w = Watching(store)
    w.watcher.start()
    try:
        tmp = store.dir / (checkpoint_name(30) + ".tmp")

        def grow() -> None:
            with open(tmp, "wb") as f:
                for _ in range(25):
                    f.write(b"x" * 100)
                    f.flush()
                    time.sleep(0.1)

        await asyncio.to_thread(grow)
        await w.settle()
    finally:
        w.watcher.stop()
    assert 2 <= len(w.writes) <= 4, w.writes
    assert all(b - a >= 1.0 for a, b in zip(w.writes, w.writes[1:], strict=False))
    assert w.committed == []


async def test_lost_events_are_made_up_by_a_rescan(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    w = Watching(store)
    w.watcher.start()
    try:
        # Committed while the queue overflowed: its IN_MOVED_TO is among the lost events.
        w.watcher.stop()
        (store.dir / checkpoint_name(40)).write_bytes(andrea_bin(40))
        w.watcher.start()
        await w.settle(0.2)
        assert w.committed == []
        w.watcher.on_events([InotifyEvent(-1, IN_Q_OVERFLOW, 0, b"")])
        await w.until(lambda: w.committed == [checkpoint_name(40)])
    finally:
        w.watcher.stop()


async def test_without_inotify_the_directory_is_scanned(tmp_path: Path, monkeypatch, caplog):
    def no_inotify(flags: int) -> int:
        raise LibcUnavailable("no inotify_init1")

    monkeypatch.setattr(inotify, "inotify_init1", no_inotify)
    monkeypatch.setattr("trainwarden.supervisor.inputs.checkpoint_watch.POLL_S", 0.1)
    store = CheckpointStore(tmp_path / "checkpoints", Folders())  # type: ignore[arg-type]
    store.ensure()
    (store.dir / "ckpt-1").mkdir()
    (store.dir / "ckpt-1" / "state.json").write_bytes(b"done")  # there before: not reported
    w = Watching(store)
    w.watcher.start()
    try:
        assert "scanning" in caplog.text
        staged = store.dir / "ckpt-2.tmp"
        staged.mkdir()
        for i in range(5):
            (staged / "weights").write_bytes(b"w" * i)
            await asyncio.sleep(0.1)
        await w.until(lambda: bool(w.writes))
        (staged / "state.json").write_bytes(b"done")
        os.rename(staged, store.dir / "ckpt-2")
        await w.until(lambda: w.committed == ["ckpt-2"])
        await w.settle(0.5)
        assert w.committed == ["ckpt-2"]  # once, not at every scan
    finally:
        w.watcher.stop()


async def test_out_of_watches_for_a_folder_falls_back_to_scanning(folders, monkeypatch):
    store, w = folders
    real_add_watch = inotify.inotify_add_watch

    def out_of_watches(fd: int, path: bytes, mask: int) -> int:
        if b"ckpt-" in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(path))
        return real_add_watch(fd, path, mask)

    monkeypatch.setattr(inotify, "inotify_add_watch", out_of_watches)
    monkeypatch.setattr("trainwarden.supervisor.inputs.checkpoint_watch.POLL_S", 0.1)
    folder = store.dir / "ckpt-8"
    folder.mkdir()
    await w.settle(0.2)
    (folder / "state.json").write_bytes(b"done")  # unseen by inotify: no watch inside
    await w.until(lambda: w.committed == ["ckpt-8"])


async def test_the_directory_removed_and_made_again_is_still_watched(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("trainwarden.supervisor.inputs.checkpoint_watch.POLL_S", 0.1)
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    w = Watching(store)
    w.watcher.start()
    try:
        await w.settle(0.1)
        store.dir.rmdir()
        await w.settle(0.2)
        store.ensure()
        (store.dir / checkpoint_name(50)).write_bytes(andrea_bin(50))
        await w.until(lambda: w.committed == [checkpoint_name(50)])
    finally:
        w.watcher.stop()


async def test_a_hard_linked_bad_file_is_judged_at_once_and_a_rewrite_is_reported(
    tmp_path: Path,
):
    """A hard link arrives whole (IN_CREATE, never closed after a write here): its verdict,
    even a bad one, is reported at once rather than at the next rescan. A write to a
    committed name is reported as a touch."""
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    verdicts: list[tuple[str, bool]] = []
    touched: list[str] = []
    loop = asyncio.get_running_loop()
    watcher = CheckpointWatcher(
        store,
        loop,
        on_committed=lambda name: None,
        on_writing=lambda: None,
        on_touched=touched.append,
        on_verified=lambda name, verdict: verdicts.append((name, verdict.info is not None)),
    )
    watcher.start()
    try:
        outside = tmp_path / "elsewhere.bin"
        outside.write_bytes(struct.pack("<ii", 30, 4) + struct.pack("<f", float("nan")) * 12)
        await asyncio.to_thread(os.link, outside, store.dir / checkpoint_name(30))
        deadline = loop.time() + 0.9  # well before a rescan could find it
        while not verdicts and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert verdicts == [(checkpoint_name(30), False)]

        committed = store.dir / checkpoint_name(40)
        committed.write_bytes(andrea_bin(40))
        await asyncio.sleep(0.2)
        touched.clear()
        with open(committed, "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<f", 2.0))
            f.flush()
            await asyncio.sleep(0.3)  # still open: the write alone is reported
            assert checkpoint_name(40) in touched
    finally:
        watcher.stop()
