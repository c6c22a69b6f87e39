"""The journal's and the loss history's writes on a disk that fills up: short writes,
ENOSPC, the bound on what is held, a torn tail, and what the journal says about it all.

A `FillingDisk` stands in for the kernel's write(2): it takes bytes up to a budget (the
write that crosses it is short) and then refuses with ENOSPC until given more room.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from trainwarden.supervisor.shell.pivot_files import write_policy
from trainwarden.supervisor.store import appendfile
from trainwarden.supervisor.store.appendfile import AppendFile, DiskSpace
from trainwarden.supervisor.store.journal import Journal, read_records
from trainwarden.supervisor.store.lossdb import LossWriter
from trainwarden.supervisor.store.losshistory import LossHistory
from trainwarden.supervisor.store.rundir import RunFiles, write_atomic


class FillingDisk:
    """os.write with `room` bytes left (None: unlimited), for the given descriptors' files."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, room: int | None = None) -> None:
        self.room = room
        self.calls = 0
        self._write = os.write
        monkeypatch.setattr(os, "write", self.write)

    def write(self, fd: int, data: Any) -> int:
        self.calls += 1
        data = bytes(data)
        if self.room is None:
            return self._write(fd, data)
        if self.room == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = self._write(fd, data[: self.room])
        self.room -= taken
        return taken


def whole_lines(path: Path) -> list[Any]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), "no torn last line"
    return [orjson.loads(line) for line in data.split(b"\n")[:-1]]


def test_a_short_write_is_completed_before_the_next_line(tmp_path, monkeypatch):
    path = tmp_path / ".loss.json"
    disk = FillingDisk(monkeypatch)
    writer = LossWriter(path)
    writer.append(1, 5.0, 0.1, 1.0, 1)
    disk.room = 30  # the next line gets only part of the way
    writer.append(2, 4.9, 0.1, 2.0, 1)
    assert writer.full
    writer.append_many([(3, 4.8, 0.1, 3.0, 1), (4, 4.7, None, 4.0, 1)])
    disk.room = None
    writer.append(5, 4.6, 0.1, 5.0, 1)
    assert not writer.full
    writer.close()
    assert [r["step"] for r in whole_lines(path)] == [1, 2, 3, 4, 5]


def test_held_lines_are_written_by_a_retry_without_a_new_line(tmp_path, monkeypatch):
    path = tmp_path / ".loss.json"
    disk = FillingDisk(monkeypatch, room=0)
    with LossWriter(path) as writer:
        writer.append_many([(step, 5.0, 0.1, float(step), 1) for step in range(1, 101)])
        assert writer.full and not writer.retry()
        disk.room = None
        assert writer.retry() and not writer.full
        assert writer.take_lost() == 0
    history = LossHistory.load(path)
    assert len(history) == 100 and history.load_stats.garbage == 0


def test_a_torn_tail_is_ended_even_when_the_disk_is_full_at_open(tmp_path, monkeypatch):
    path = tmp_path / ".loss.json"
    path.write_bytes(b'{"step": 1, "loss": 5.0, "dt": 0.1, "t": 1.0, "seg": 1}\n{"step": 2, "lo')
    disk = FillingDisk(monkeypatch, room=0)
    with LossWriter(path) as writer:
        writer.append(3, 4.8, 0.1, 3.0, 1)
        disk.room = None
        writer.append(4, 4.7, 0.1, 4.0, 1)
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == b'{"step": 2, "lo', "the torn line stays alone on its line"
    assert [orjson.loads(line)["step"] for line in (lines[0], *lines[2:-1])] == [1, 3, 4]


def test_past_the_bound_the_oldest_whole_lines_go_and_are_counted(tmp_path, monkeypatch):
    path = tmp_path / "lines"
    disk = FillingDisk(monkeypatch)
    file = AppendFile(path, 0o600, hold_bytes=100)
    file.write(b"first\n")
    disk.room = 3  # "sec" reaches the disk: the rest of its line must never be dropped
    file.write(b"second\n")
    for n in range(50):
        file.write(b"line %02d\n" % n)
    assert file.full and file.held_bytes <= 100
    disk.room = None
    assert file.flush()
    lost = file.take_lost()
    file.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[:2] == [b"first", b"second"]
    kept = lines[2:-1]
    assert kept == [b"line %02d" % n for n in range(50 - len(kept), 50)], "the newest kept"
    assert lost == 50 - len(kept) > 0


def test_errors_other_than_no_space_are_raised(tmp_path, monkeypatch):
    file = AppendFile(tmp_path / "lines", 0o600, hold_bytes=100)

    def broken(fd: int, data: Any) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "write", broken)
    with pytest.raises(OSError) as raised:
        file.write(b"line\n")
    assert raised.value.errno == errno.EIO


def test_a_file_the_disk_cannot_even_create_is_created_later(tmp_path, monkeypatch):
    path = tmp_path / "lines"
    real_open = os.open
    refuse = True

    def opening(name: Any, flags: int, mode: int = 0o777) -> int:
        if refuse and Path(name) == path:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real_open(name, flags, mode)

    monkeypatch.setattr(appendfile.os, "open", opening)
    file = AppendFile(path, 0o600, hold_bytes=1000, chmod=True)
    assert file.full and not file.write(b"one\n")
    refuse = False
    assert file.write(b"two\n")
    file.close()
    assert path.read_bytes() == b"one\ntwo\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_journal_records_the_full_disk_and_the_recovery_in_order(tmp_path, monkeypatch):
    path = tmp_path / "journal.jsonl"
    disk = FillingDisk(monkeypatch)
    space = DiskSpace()
    journal = Journal(path, space)
    seen: list[str] = []
    journal.listeners.append(lambda record: seen.append(record["kind"]))
    journal.append({"kind": "daemon_start"}, t=1.0)
    disk.room = 10
    journal.append({"kind": "state", "state": {"seg": 1}}, t=2.0)
    assert space.full and str(path) in space.full_files
    journal.append({"kind": "trainer_started", "pid": 1}, t=3.0, sync=True)
    assert not journal.retry(4.0)
    disk.room = None
    assert journal.retry(5.0) and not space.full
    journal.append({"kind": "daemon_exit"}, t=6.0)
    journal.close()
    kinds = [r["kind"] for r in whole_lines(path)]
    assert kinds == [
        "daemon_start",
        "state",
        "disk_full",
        "trainer_started",
        "disk_recovered",
        "daemon_exit",
    ]
    assert seen == kinds, "listeners hear every record as it happens"
    recovered = [r for r in read_records(path) if r["kind"] == "disk_recovered"][0]
    assert recovered["lost_records"] == 0 and recovered["full_s"] == 3.0


def test_the_journal_counts_records_lost_past_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr("trainwarden.supervisor.store.journal.HOLD_BYTES", 2000)
    path = tmp_path / "journal.jsonl"
    disk = FillingDisk(monkeypatch, room=0)
    journal = Journal(path)
    for n in range(200):
        journal.append({"kind": "step_event", "n": n}, t=float(n))
    disk.room = None
    journal.append({"kind": "daemon_exit"}, t=300.0)
    journal.close()
    records = whole_lines(path)
    recovered = [r for r in records if r["kind"] == "disk_recovered"]
    assert len(recovered) == 1 and recovered[0]["lost_records"] > 0
    kinds = [r["kind"] for r in records]
    assert kinds.index("disk_full") < kinds.index("step_event"), "the marker is never dropped"
    kept = [r["n"] for r in records if r["kind"] == "step_event"]
    assert kept == list(range(200 - len(kept), 200)), "the newest records are kept"
    assert len(kept) + recovered[0]["lost_records"] == 200


def test_write_atomic_leaves_no_partial_copy_on_a_full_disk(tmp_path, monkeypatch):
    path = tmp_path / "policy.json"
    path.write_bytes(b'{"old": true}\n')
    FillingDisk(monkeypatch, room=5)
    with pytest.raises(OSError) as raised:
        write_atomic(path, b'{"new": true, "much": "longer than five bytes"}\n')
    assert raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == b'{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json"]


def test_write_atomic_completes_short_writes(tmp_path, monkeypatch):
    path = tmp_path / "state"
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:7]))
    write_atomic(path, b"0123456789" * 10)
    assert path.read_bytes() == b"0123456789" * 10


def test_a_policy_the_disk_has_no_room_for_is_an_error_naming_policy_json(tmp_path, monkeypatch):
    files = RunFiles(tmp_path)
    FillingDisk(monkeypatch, room=8)
    error = write_policy(files, {"version": 1, "arms": {"web": {"cap": 0.5, "floor": 0.0}}})
    assert error == "policy.json: No space left on device"
    assert not any(tmp_path.iterdir()), "no partial policy.json, no temporary copy"


def test_held_lines_go_back_in_large_writes_and_a_refused_write_offers_one_entry(
    tmp_path, monkeypatch
):
    path = tmp_path / ".loss.json"
    disk = FillingDisk(monkeypatch, room=0)
    offered: list[int] = []
    refusing = disk.write

    def counting(fd: int, data: Any) -> int:
        offered.append(len(data))
        return refusing(fd, data)

    monkeypatch.setattr(os, "write", counting)
    with LossWriter(path) as writer:
        for step in range(1, 2001):
            writer.append(step, 5.0, 0.1, float(step), 1)
        line = max(offered)
        assert line < 100, "while full, each try offers one line, not everything held"
        offered.clear()
        disk.room = None
        assert writer.retry()
    assert len(offered) <= 3, "2,000 held lines written back in a few writes"
    assert len(LossHistory.load(path)) == 2000


def test_the_journal_tail_shows_records_held_in_memory_once_each(tmp_path, monkeypatch):
    path = tmp_path / "journal.jsonl"
    disk = FillingDisk(monkeypatch)
    journal = Journal(path)
    journal.append({"kind": "daemon_start"}, t=1.0)
    disk.room = 12  # the next record is cut short: its start on disk reads as a torn line
    journal.append({"kind": "state"}, t=2.0)
    journal.append({"kind": "trainer_started"}, t=3.0)
    kinds = ["daemon_start", "state", "disk_full", "trainer_started"]
    assert [r["kind"] for r in journal.tail(10)] == kinds
    assert [r["kind"] for r in journal.tail(2)] == kinds[-2:]
    disk.room = None
    assert journal.retry(4.0)
    assert [r["kind"] for r in journal.tail(10)] == [*kinds, "disk_recovered"]
    journal.close()
