"""Snapshots of an in-place trainer's fixed file or folder ([checkpoints] fixed): the copy,
the verdict before anything is renamed into the checkpoint directory, the atomic restore
(of a folder: through a kill at any step of the swap), the config's checks, and the
watcher's report of a write to the fixed file or of a commit of the fixed folder."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import PYTHON, make_run, refused_start
from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.plugins.formats.hf_trainer import HfTrainer
from trainwarden.supervisor.config import load_config
from trainwarden.supervisor.errors import CheckpointInvalid, ConfigError
from trainwarden.supervisor.inputs.checkpoint_watch import CheckpointWatcher
from trainwarden.supervisor.shell.snapshots import fixed_file
from trainwarden.supervisor.store import fixed_folder, snapshots
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.fixed_folder import FixedFolder, step_reader
from trainwarden.supervisor.store.snapshots import (
    STAGING,
    FixedFile,
    copy_durably,
    snapshot_name,
    step_by_regex,
)

pytestmark = pytest.mark.timeout(120)


def test_snapshot_names_put_the_step_before_the_suffix():
    assert snapshot_name("ckpt.pt", 600) == "ckpt_000600.pt"
    assert snapshot_name("model.tar.gz", 7) == "model_000007.tar.gz"
    assert snapshot_name("state", 12) == "state_000012"


def test_a_copy_is_whole_and_new(tmp_path: Path):
    src, dst = tmp_path / "a", tmp_path / "b"
    src.write_bytes(os.urandom(3 << 20))
    assert copy_durably(src, dst) in ("reflink", "copy")
    assert dst.read_bytes() == src.read_bytes()
    with pytest.raises(FileExistsError):
        copy_durably(src, dst)  # never over an existing file


def test_without_reflinks_the_copy_is_streamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def no_reflink(fd: int, request: int, arg: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(snapshots.fcntl, "ioctl", no_reflink)
    src, dst = tmp_path / "a", tmp_path / "b"
    src.write_bytes(b"x" * (9 << 20))
    assert copy_durably(src, dst) == "copy"
    assert dst.read_bytes() == src.read_bytes()


def test_a_failed_copy_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def broken(fd: int, request: int, arg: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(snapshots.fcntl, "ioctl", broken)
    src, dst = tmp_path / "a", tmp_path / "b"
    src.write_bytes(b"data")
    with pytest.raises(OSError):
        copy_durably(src, dst)
    assert not dst.exists()


def test_step_regex_reads_the_step_from_the_contents(tmp_path: Path):
    path = tmp_path / "state.json"
    path.write_text('{"model": "...", "step": 1200}')
    assert step_by_regex(path, r'"step": (\d+)') == 1200
    path.write_text('{"model": "..."}')
    with pytest.raises(CheckpointInvalid, match="no step"):
        step_by_regex(path, r'"step": (\d+)')


# ------------------------------------------------------------------ take and restore


torch = pytest.importorskip("torch")


def torch_pt_store(tmp_path: Path) -> CheckpointStore:
    from trainwarden.plugins.formats.torch_pt import TorchPt

    store = CheckpointStore(tmp_path / "checkpoints", TorchPt())
    store.ensure()
    return store


def save(path: Path, iter_num: int) -> bytes:
    torch.save(
        {
            "model": {"w": torch.full((4, 4), float(iter_num))},
            "optimizer": {},
            "iter_num": iter_num,
        },
        path,
    )
    return path.read_bytes()


def inplace(store: CheckpointStore) -> FixedFile:
    fmt = store.fmt
    return FixedFile(store.dir, "ckpt.pt", fmt, lambda p: fmt.step_in(p, "iter_num"))  # type: ignore[attr-defined]


def test_a_verified_write_becomes_a_committed_snapshot(tmp_path: Path):
    store = torch_pt_store(tmp_path)
    fixed = inplace(store)
    data = save(fixed.path, 600)
    taken = fixed.take()
    assert (taken.outcome, taken.step, taken.name) == ("taken", 600, "ckpt_000600.pt")
    assert (store.dir / "ckpt_000600.pt").read_bytes() == data
    assert store.scan() == (["ckpt_000600.pt"], [])
    assert store.verify("ckpt_000600.pt").step == 600
    assert os.listdir(store.dir / STAGING) == []
    # The same step again is known already: no second copy.
    assert fixed.take().outcome == "known"


def test_a_fixed_file_rewritten_while_it_is_copied_is_not_snapshotted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """torch.save truncates and writes again: a copy taken meanwhile can hold the old
    save's beginning and the new one's end and still verify. Any write during the copy
    refuses it; the write's own close asks for the next snapshot."""
    store = torch_pt_store(tmp_path)
    fixed = inplace(store)
    save(fixed.path, 600)
    copy = snapshots.copy_durably

    def copy_then_save(src: Path, dst: Path) -> str:
        how = copy(src, dst)
        time.sleep(0.01)
        save(fixed.path, 700)  # the next save, under way meanwhile
        return how

    monkeypatch.setattr(snapshots, "copy_durably", copy_then_save)
    taken = fixed.take()
    assert taken.outcome == "rejected" and "changed while it was copied" in taken.reason
    assert store.scan() == ([], []) and os.listdir(store.dir / STAGING) == []
    monkeypatch.setattr(snapshots, "copy_durably", copy)
    assert fixed.take().step == 700


def test_staging_swapped_for_a_link_during_a_snapshot_empties_nothing_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = torch_pt_store(tmp_path)
    fixed = inplace(store)
    save(fixed.path, 600)
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_text("mine\n")
    (outside / "sub" / "also.txt").write_text("mine too\n")
    copy = snapshots.copy_durably

    def copy_then_swap(src: Path, dst: Path) -> str:
        how = copy(src, dst)
        staging = store.dir / STAGING
        shutil.rmtree(staging)
        staging.symlink_to(outside)
        return how

    monkeypatch.setattr(snapshots, "copy_durably", copy_then_swap)
    with pytest.raises(OSError):
        fixed.take()
    assert (outside / "keep.txt").read_text() == "mine\n"
    assert (outside / "sub" / "also.txt").read_text() == "mine too\n"


async def test_a_newer_fixed_file_is_snapshotted_not_overwritten_by_a_restore(tmp_path: Path):
    """The fixed file holds step 120, whose snapshot failed (a full disk); the next start
    is to resume from the snapshot of 60. The 120 is snapshotted first and the start is
    refused rather than put 60 over it; a snapshot that fails on a full disk is retried."""
    from trainwarden.supervisor.core import policy as core
    from trainwarden.supervisor.shell import snapshots as shell_snapshots
    from trainwarden.supervisor.store.journal import Journal

    store = torch_pt_store(tmp_path)
    fixed = inplace(store)
    save(fixed.path, 60)
    assert fixed.take().name == "ckpt_000060.pt"
    data = save(fixed.path, 120)
    journal = Journal(tmp_path / "journal.jsonl")
    shots = shell_snapshots.Snapshots(fixed, store, journal)
    resume = core.Ckpt(60, "ckpt_000060.pt", 1)
    refused = await shots.prepare(resume)
    assert refused is not None and "holds step 120, newer than ckpt_000060.pt" in refused
    assert fixed.path.read_bytes() == data and (store.dir / "ckpt_000120.pt").exists()

    # A snapshot that fails for want of space: journaled once as the first failure, status
    # says so, and it is tried again until it succeeds.
    save(fixed.path, 180)
    take = FixedFile.take
    calls = []

    def full_then_fine(self: FixedFile) -> Any:
        calls.append(1)
        if len(calls) < 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return take(self)

    original_retry = shell_snapshots.SNAPSHOT_RETRY_S
    shell_snapshots.SNAPSHOT_RETRY_S = 0.05
    try:
        FixedFile.take = full_then_fine  # type: ignore[method-assign]
        shots.written()
        await wait(lambda: (store.dir / "ckpt_000180.pt").exists())
        await shots.settle()
    finally:
        FixedFile.take = take  # type: ignore[method-assign]
        shell_snapshots.SNAPSHOT_RETRY_S = original_retry
    kinds = [
        json.loads(line)["kind"] for line in (tmp_path / "journal.jsonl").read_text().splitlines()
    ]
    assert kinds.count("snapshot_failed") == 2 and "snapshot_recovered" in kinds
    firsts = [
        json.loads(line).get("first")
        for line in (tmp_path / "journal.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "snapshot_failed"
    ]
    assert firsts == [True, False]
    assert shots.failing is None and not journal.space.full


@pytest.mark.parametrize("damage", ["torn", "empty", "no step"])
def test_a_write_that_does_not_verify_is_never_snapshotted(tmp_path: Path, damage: str):
    store = torch_pt_store(tmp_path)
    fixed = inplace(store)
    data = save(fixed.path, 600)
    if damage == "torn":
        fixed.path.write_bytes(data[: len(data) // 2])  # killed in the middle of torch.save
    elif damage == "empty":
        fixed.path.write_bytes(b"")
    else:
        torch.save({"model": {}, "optimizer": {}}, fixed.path)
    taken = fixed.take()
    assert taken.outcome == "rejected"
    assert taken.reason.startswith("ckpt.pt: ")
    assert store.scan() == ([], [])
    assert sorted(os.listdir(store.dir)) == [STAGING, "ckpt.pt"]
    assert os.listdir(store.dir / STAGING) == []


def test_no_fixed_file_is_nothing_to_snapshot(tmp_path: Path):
    assert inplace(torch_pt_store(tmp_path)).take().outcome == "absent"


def test_restore_replaces_a_torn_fixed_file_whole(tmp_path: Path):
    store = torch_pt_store(tmp_path)
    fixed = inplace(store)
    good = save(fixed.path, 600)
    fixed.take()
    fixed.path.write_bytes(good[:100])  # a later save, torn
    torn_inode = fixed.path.stat().st_ino
    assert fixed.restore("ckpt_000600.pt") in ("reflink", "copy")
    assert fixed.path.read_bytes() == good
    assert fixed.path.stat().st_ino != torn_inode  # renamed over it, never written in place
    assert (store.dir / "ckpt_000600.pt").read_bytes() == good  # the snapshot stays
    assert sorted(os.listdir(store.dir)) == [STAGING, "ckpt.pt", "ckpt_000600.pt"]


def test_the_restored_file_is_not_taken_for_a_new_version(tmp_path: Path):
    store = torch_pt_store(tmp_path)
    fixed = inplace(store)
    save(fixed.path, 600)
    fixed.take()
    save(fixed.path, 700)
    fixed.take()
    fixed.restore("ckpt_000600.pt")
    assert fixed.take() == snapshots.Taken("known")  # nothing read, nothing copied
    save(fixed.path, 610)  # the resumed trainer saves in place, over the same inode
    taken = fixed.take()
    assert (taken.outcome, taken.step) == ("taken", 610)
    assert store.scan()[0] == ["ckpt_000600.pt", "ckpt_000610.pt", "ckpt_000700.pt"]


def test_a_restore_that_cannot_copy_leaves_the_fixed_file_as_it_was(tmp_path: Path):
    store = torch_pt_store(tmp_path)
    fixed = inplace(store)
    fixed.path.write_bytes(b"before")
    with pytest.raises(FileNotFoundError):
        fixed.restore("ckpt_000600.pt")
    assert fixed.path.read_bytes() == b"before"
    with pytest.raises(ValueError):
        fixed.restore("../elsewhere")


# ------------------------------------------------------------------ the config


def run_with(tmp_path: Path, **checkpoints: object) -> Path:
    run_dir = make_run(
        tmp_path / "run", [PYTHON, "train.py"], checkpoints={"format": "torch-pt", **checkpoints}
    )
    (run_dir / "train.py").write_text("")  # the start checks the script is there
    return run_dir


@pytest.mark.parametrize(
    ("keys", "complaint"),
    [
        ({"fixed": "ckpt.pt"}, "one of step_key"),
        ({"fixed": "ckpt.pt", "step_key": "iter_num", "step_regex": "(\\d+)"}, "one of step_key"),
        ({"step_key": "iter_num"}, "'checkpoints.step_key'"),
        ({"fixed": "out/ckpt.pt", "step_key": "iter_num"}, "'checkpoints.fixed'"),
        ({"fixed": "quarantine", "step_key": "iter_num"}, "'checkpoints.fixed'"),
        ({"fixed": "ckpt.pt", "step_regex": "step=\\d+"}, "exactly one group"),
    ],
)
def test_bad_fixed_settings_are_one_line_config_errors(
    tmp_path: Path, keys: dict[str, object], complaint: str
):
    with pytest.raises(ConfigError) as caught:
        load_config(run_with(tmp_path, **keys), check_plugins=False)
    assert complaint in str(caught.value)
    assert "\n" not in str(caught.value)


def test_snapshot_names_the_format_would_not_take_are_refused(tmp_path: Path):
    from trainwarden.plugins.formats.torch_pt import TorchPt

    run_dir = run_with(
        tmp_path,
        fixed="ckpt.pt",
        step_key="iter_num",
        options={"pattern": "^iter_(\\d+)\\.pt$"},
    )
    cfg = load_config(run_dir, check_plugins=False)
    store = CheckpointStore(cfg.checkpoint_dir, TorchPt({"pattern": "^iter_(\\d+)\\.pt$"}))
    with pytest.raises(ConfigError, match="ckpt_000123.pt"):
        fixed_file(cfg, store)


def test_a_fixed_folder_is_refused(tmp_path: Path):
    from trainwarden.plugins.formats.torch_pt import TorchPt

    cfg = load_config(run_with(tmp_path, fixed="out", step_key="iter_num"), check_plugins=False)
    (cfg.checkpoint_dir / "out").mkdir(parents=True)
    with pytest.raises(ConfigError, match="is a folder.*fixed_commit_file"):
        fixed_file(cfg, CheckpointStore(cfg.checkpoint_dir, TorchPt()))


def test_step_key_needs_a_format_that_reads_keys(tmp_path: Path):
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "train.py"],
        checkpoints={"fixed": "step.bin", "step_key": "step"},
    )
    cfg = load_config(run_dir, check_plugins=False)
    store = CheckpointStore(cfg.checkpoint_dir, AndreaBin())
    with pytest.raises(ConfigError, match="use step_regex"):
        fixed_file(cfg, store)


def test_the_daemon_refuses_a_bad_fixed_setting_with_exit_2(tmp_path: Path):
    run_dir = run_with(
        tmp_path, fixed="ckpt.pt", step_key="iter_num", options={"pattern": "^iter_(\\d+)\\.pt$"}
    )
    assert "checkpoints.fixed" in refused_start(run_dir)


# ------------------------------------------------------------------ the watcher


async def test_the_watcher_reports_writes_of_the_fixed_file(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    fixed: list[str] = []
    committed: list[str] = []
    writing: list[int] = []
    watcher = CheckpointWatcher(
        store,
        asyncio.get_running_loop(),
        on_committed=committed.append,
        on_writing=lambda: writing.append(1),
        fixed="ckpt.bin",
        on_fixed=lambda: fixed.append("written"),
    )
    watcher.start()
    try:
        path = store.dir / "ckpt.bin"

        def write_in_place() -> None:
            with open(path, "wb") as file:
                file.write(b"x" * 4096)

        await asyncio.to_thread(write_in_place)
        await wait(lambda: fixed == ["written"])
        assert writing  # a save in progress keeps the trainer from looking hung

        def rename_onto() -> None:
            (store.dir / "other").write_bytes(b"y")
            os.replace(store.dir / "other", path)

        await asyncio.to_thread(rename_onto)
        await wait(lambda: fixed == ["written", "written"])
        # The staging folder is no checkpoint folder: nothing written there is reported.
        (store.dir / STAGING).mkdir()
        await asyncio.to_thread((store.dir / STAGING / "step_000010.bin").write_bytes, b"z")
        await asyncio.sleep(0.3)
        assert committed == []
        assert fixed == ["written", "written"]
    finally:
        watcher.stop()


async def wait(condition: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition() and loop.time() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.02)
    assert condition(), "timed out"  # type: ignore[operator]


async def test_without_inotify_a_settled_new_version_of_the_fixed_file_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from trainwarden.libc import LibcUnavailable
    from trainwarden.supervisor.inputs import inotify

    def no_inotify(flags: int) -> int:
        raise LibcUnavailable("no inotify_init1")

    monkeypatch.setattr(inotify, "inotify_init1", no_inotify)
    monkeypatch.setattr("trainwarden.supervisor.inputs.checkpoint_watch.POLL_S", 0.05)
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    path = store.dir / "ckpt.bin"
    path.write_bytes(b"there at start")
    fixed: list[str] = []
    watcher = CheckpointWatcher(
        store,
        asyncio.get_running_loop(),
        on_committed=lambda name: None,
        on_writing=lambda: None,
        fixed="ckpt.bin",
        on_fixed=lambda: fixed.append("written"),
    )
    watcher.start()
    try:
        await asyncio.sleep(0.4)
        assert fixed == []  # what was there at start is the boot snapshot's
        await asyncio.to_thread(path.write_bytes, b"a new version")
        await wait(lambda: fixed == ["written"])
        await asyncio.sleep(0.4)
        assert fixed == ["written"]  # reported once
    finally:
        watcher.stop()


async def fresh_start(taking: Any) -> str | None:
    """A fresh start's prepare as the daemon has it made: a file left at the fixed name is
    reported and left alone, then moved to quarantine/ by the start the policy makes again."""
    from trainwarden.supervisor.core import policy as core

    left = await taking.prepare(None)
    assert isinstance(left, core.FixedFileLeftover), "a leftover moved without the policy"
    assert os.path.lexists(taking.path)
    _, actions = core.decide(core.State(), left, core.Rules())
    (spawn,) = actions
    assert spawn.resume is None and spawn.leftover is not None
    refused = await taking.prepare(None, spawn.leftover)
    assert not isinstance(refused, core.FixedFileLeftover)
    return refused


async def test_a_snapshot_that_fails_is_journaled_and_never_breaks_a_start(tmp_path: Path):
    from trainwarden.supervisor.core.state import Ckpt
    from trainwarden.supervisor.shell.snapshots import Snapshots
    from trainwarden.supervisor.store.journal import Journal, read_records

    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()

    def plugin_bug(path: Path) -> int:
        raise RuntimeError("a plugin's bug")

    fixed = FixedFile(store.dir, "ckpt.bin", store.fmt, plugin_bug)
    fixed.path.write_bytes(b"written in place")
    journal = Journal(tmp_path / "journal.jsonl")
    taking = Snapshots(fixed, store, journal)
    taking.written()
    await taking.settle()
    # A fresh start then: the fixed file that never verified goes to quarantine/.
    assert await fresh_start(taking) is None
    # A start from a snapshot that is not there fails as a spawn would, with the reason.
    refused = await taking.prepare(Ckpt(10, "step_000010.bin", 100))
    journal.close()
    kinds = [r["kind"] for r in read_records(tmp_path / "journal.jsonl")]
    assert kinds == ["snapshot_failed", "quarantine", "snapshot_restore_failed"]
    assert refused is not None and "step_000010.bin" in refused
    assert (store.dir / "quarantine" / "ckpt.bin").read_bytes() == b"written in place"


# ------------------------------------------------------------------ a fixed folder


def safetensors_bytes(values: list[float]) -> bytes:
    """A safetensors file holding one F32 tensor, written by hand."""
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack(f"<{len(values)}f", *values)


def hf_store(tmp_path: Path) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "checkpoints", HfTrainer({"required_files": []}))
    store.ensure()
    return store


def folder_of(store: CheckpointStore) -> FixedFolder:
    reader = step_reader("trainer_state.json", "global_step", None)
    return FixedFolder(store.dir, "latest", store.fmt, "trainer_state.json", reader)


def save_folder(folder: Path, step: int, *, n: int = 64) -> dict[str, bytes]:
    """What a trainer's save_pretrained-like write leaves: the weights, then the state."""
    folder.mkdir(exist_ok=True)
    files = {
        "model.safetensors": safetensors_bytes([float(step)] * n),
        "trainer_state.json": json.dumps({"global_step": step}).encode(),
    }
    for name, data in files.items():  # plain writes in place, the state last
        with open(folder / name, "wb") as file:
            file.write(data)
    return files


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def later(path: Path) -> None:
    """Make `path` newer than everything written so far (coarse clocks tick slowly)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, time.time_ns() + 10**9))


def test_a_committed_version_of_a_fixed_folder_becomes_a_snapshot_folder(tmp_path: Path):
    store = hf_store(tmp_path)
    fixed = folder_of(store)
    files = save_folder(fixed.path, 20)
    taken = fixed.take()
    assert (taken.outcome, taken.step, taken.name) == ("taken", 20, "checkpoint-20")
    assert contents(store.dir / "checkpoint-20") == files
    assert store.scan() == (["checkpoint-20"], [])
    assert store.verify("checkpoint-20").step == 20
    assert os.listdir(store.dir / STAGING) == []
    assert fixed.take().outcome == "known"
    files = save_folder(fixed.path, 30)
    assert fixed.take().name == "checkpoint-30"
    assert contents(store.dir / "checkpoint-30") == files
    assert contents(store.dir / "checkpoint-20") != files


@pytest.mark.parametrize("damage", ["truncated", "new weights, old state", "no state", "torn"])
def test_a_torn_fixed_folder_is_never_snapshotted(tmp_path: Path, damage: str):
    store = hf_store(tmp_path)
    fixed = folder_of(store)
    save_folder(fixed.path, 20)
    weights = fixed.path / "model.safetensors"
    new = safetensors_bytes([30.0] * 64)
    if damage == "truncated":  # killed while the weights of the next save were written
        weights.write_bytes(new[: len(new) // 2])
        later(weights)
    elif damage == "new weights, old state":  # killed before the state was written
        weights.write_bytes(new)
        later(weights)
    elif damage == "no state":
        (fixed.path / "trainer_state.json").unlink()
    else:  # the weights torn, then a state written after them: verification catches it
        weights.write_bytes(new[:100])
        (fixed.path / "trainer_state.json").write_text('{"global_step": 30}')
        later(fixed.path / "trainer_state.json")
    taken = fixed.take()
    assert taken.outcome == "rejected", taken
    assert taken.reason.startswith("latest/: ")
    assert store.scan() == ([], [])
    assert sorted(os.listdir(store.dir)) == [STAGING, "latest"]
    assert os.listdir(store.dir / STAGING) == []


def test_a_fixed_folder_written_while_it_is_copied_is_not_snapshotted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = hf_store(tmp_path)
    fixed = folder_of(store)
    save_folder(fixed.path, 20)
    copy = fixed_folder.copy_folder

    def copy_then_save(*args: Any) -> str:
        how = copy(*args)
        save_folder(fixed.path, 30, n=65)  # the next save, under way meanwhile
        return how

    monkeypatch.setattr(fixed_folder, "copy_folder", copy_then_save)
    taken = fixed.take()
    assert taken.outcome == "rejected"
    assert "changed while it was copied" in taken.reason
    assert store.scan() == ([], [])


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two renames"])
def test_restore_swaps_a_whole_folder_in_for_a_torn_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
):
    if not exchange:
        monkeypatch.setattr(fixed_folder, "exchange", lambda a, b: False)
    store = hf_store(tmp_path)
    fixed = folder_of(store)
    good = save_folder(fixed.path, 20)
    fixed.take()
    (fixed.path / "model.safetensors").write_bytes(b"torn")
    (fixed.path / "extra.bin").write_bytes(b"a file of the torn save")
    assert fixed.restore("checkpoint-20") in ("reflink", "copy")
    assert contents(fixed.path) == good  # whole: nothing of the torn folder left in it
    assert contents(store.dir / "checkpoint-20") == good
    assert sorted(os.listdir(store.dir)) == [STAGING, "checkpoint-20", "latest"]
    assert os.listdir(store.dir / STAGING) == []
    # What was put back is no new version; the trainer's next save is.
    assert fixed.take() == snapshots.Taken("known")
    save_folder(fixed.path, 30)
    assert fixed.take().name == "checkpoint-30"


def test_restore_into_no_fixed_folder(tmp_path: Path):
    store = hf_store(tmp_path)
    fixed = folder_of(store)
    good = save_folder(fixed.path, 20)
    fixed.take()
    shutil.rmtree(fixed.path)
    fixed.restore("checkpoint-20")
    assert contents(fixed.path) == good


def test_a_kill_at_any_step_of_a_restore_leaves_a_whole_folder(tmp_path: Path):
    """A daemon killed between the steps of a swap (each step called alone, then a new
    daemon's FixedFolder): the fixed name holds the old folder or the new one, whole."""
    store = hf_store(tmp_path)
    fixed = folder_of(store)
    new = save_folder(fixed.path, 20)
    fixed.take()
    old = save_folder(fixed.path, 30, n=65)

    def after_restart() -> dict[str, bytes]:
        again = folder_of(store)
        assert again.take().outcome in ("known", "taken")  # recovers first
        assert os.listdir(store.dir / STAGING) == []
        return contents(fixed.path)

    # Killed while the snapshot was copied into staging: the old folder is untouched.
    fixed.stage_restore("checkpoint-20")
    assert after_restart() == old
    # Killed after the old folder was renamed aside, before the new one was renamed in.
    restoring, _ = fixed.stage_restore("checkpoint-20")
    os.rename(fixed.path, store.dir / STAGING / fixed_folder.ASIDE)
    assert not fixed.path.exists()
    assert after_restart() == old
    # Killed after the swap, before the old folder was removed from staging.
    restoring, _ = fixed.stage_restore("checkpoint-20")
    fixed.swap_in(restoring, exchange_names=False)
    assert after_restart() == new
    save_folder(fixed.path, 30, n=65)
    restoring, _ = fixed.stage_restore("checkpoint-20")
    fixed.swap_in(restoring)
    assert after_restart() == new


def test_the_step_of_a_fixed_folder(tmp_path: Path):
    (tmp_path / "state.json").write_text('{"global_step": 40, "epoch": 1.5}')
    assert step_reader("state.json", "global_step", None)(tmp_path) == 40
    assert step_reader("state.json", None, r'"global_step": (\d+)')(tmp_path) == 40
    for text in ('{"global_step": "40"}', '{"epoch": 1}', "[40]", '{"global_step": tr'):
        (tmp_path / "state.json").write_text(text)
        with pytest.raises(CheckpointInvalid):
            step_reader("state.json", "global_step", None)(tmp_path)


@pytest.mark.parametrize(
    ("keys", "complaint"),
    [
        ({"fixed_commit_file": "trainer_state.json"}, "'checkpoints.fixed_commit_file'"),
        (
            {"fixed": "latest", "fixed_commit_file": "a/b.json", "step_key": "global_step"},
            "'checkpoints.fixed_commit_file'",
        ),
    ],
)
def test_bad_fixed_folder_settings_are_one_line_config_errors(
    tmp_path: Path, keys: dict[str, object], complaint: str
):
    with pytest.raises(ConfigError) as caught:
        load_config(run_with(tmp_path, **keys), check_plugins=False)
    assert complaint in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("fmt", "commit", "complaint"),
    [
        ("hf-trainer", "state.json", "does not take"),
        ("andrea-bin", "state.json", "does not take"),
    ],
)
def test_a_fixed_folder_needs_snapshot_names_its_format_commits(
    tmp_path: Path, fmt: str, commit: str, complaint: str
):
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "train.py"],
        checkpoints={
            "format": fmt,
            "fixed": "latest",
            "fixed_commit_file": commit,
            "step_key": "global_step",
        },
    )
    cfg = load_config(run_dir, check_plugins=False)
    plugin = HfTrainer() if fmt == "hf-trainer" else AndreaBin()
    with pytest.raises(ConfigError, match=complaint):
        fixed_file(cfg, CheckpointStore(cfg.checkpoint_dir, plugin))


def test_a_fixed_folder_with_its_commit_file_is_accepted(tmp_path: Path):
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "train.py"],
        checkpoints={
            "format": "hf-trainer",
            "fixed": "latest",
            "fixed_commit_file": "trainer_state.json",
            "step_key": "global_step",
        },
    )
    cfg = load_config(run_dir, check_plugins=False)
    (cfg.checkpoint_dir / "latest").mkdir(parents=True)
    made = fixed_file(cfg, CheckpointStore(cfg.checkpoint_dir, HfTrainer()))
    assert isinstance(made, FixedFolder)
    assert made.path == cfg.checkpoint_dir / "latest"


async def test_the_watcher_reports_commits_of_the_fixed_folder(tmp_path: Path):
    store = hf_store(tmp_path)
    fixed: list[str] = []
    committed: list[str] = []
    writing: list[int] = []
    watcher = CheckpointWatcher(
        store,
        asyncio.get_running_loop(),
        on_committed=committed.append,
        on_writing=lambda: writing.append(1),
        fixed="latest",
        on_fixed=lambda: fixed.append("written"),
        fixed_commit_file="trainer_state.json",
    )
    watcher.start()
    try:
        folder = store.dir / "latest"
        await asyncio.to_thread(folder.mkdir)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(save_folder, folder, 10)
        await wait(lambda: "written" in fixed)
        assert writing  # the weights' write is a save in progress
        count = len(fixed)
        await asyncio.to_thread((folder / "model.safetensors").write_bytes, b"more")
        await asyncio.sleep(0.3)
        assert len(fixed) == count  # only the commit file's close is a new version
        await asyncio.to_thread((folder / "trainer_state.json").write_text, "{}")
        await wait(lambda: len(fixed) == count + 1)
        # A whole folder swapped in for it (a restore: RENAME_EXCHANGE reports the new
        # folder's arrival before the old one's leaving) is reported, and watched.
        other = store.dir / STAGING
        other.mkdir()
        await asyncio.to_thread(save_folder, other / "restoring", 20)
        assert await asyncio.to_thread(fixed_folder.exchange, other / "restoring", folder)
        await wait(lambda: len(fixed) == count + 2)
        await asyncio.to_thread(shutil.rmtree, other / "restoring")
        await asyncio.to_thread(save_folder, folder, 30)
        await wait(lambda: len(fixed) == count + 3)
        # And so is one renamed onto the fixed name after the old one was renamed away.
        await asyncio.to_thread(save_folder, other / "restoring", 40)
        await asyncio.to_thread(os.rename, folder, other / "aside")
        await asyncio.to_thread(os.rename, other / "restoring", folder)
        await wait(lambda: len(fixed) == count + 4)
        await asyncio.to_thread(save_folder, folder, 50)
        await wait(lambda: len(fixed) == count + 5)
        assert committed == []
    finally:
        watcher.stop()


async def test_a_write_seen_during_a_restore_is_looked_at_after_it(tmp_path: Path):
    """The restore's own rename onto the fixed name reaches the watcher while the restore
    still runs: the snapshot it asks for waits, never running beside the restore."""
    from trainwarden.supervisor.core.state import Ckpt
    from trainwarden.supervisor.shell.snapshots import Snapshots
    from trainwarden.supervisor.store.journal import Journal

    store = hf_store(tmp_path)
    loop = asyncio.get_running_loop()
    running: list[str] = []
    overlaps: list[str] = []

    class Watched(FixedFolder):
        def restore(self, name: str) -> str:
            running.append("restore")
            try:
                how = super().restore(name)
                loop.call_soon_threadsafe(taking.written)  # the swap's IN_MOVED_TO
                time.sleep(0.3)  # what is left of the restore: fsyncs, removing the old folder
                return how
            finally:
                running.remove("restore")

        def take(self) -> snapshots.Taken:
            if running:
                overlaps.append("take during " + running[0])
            taken = super().take()
            taken_outcomes.append(taken.outcome)
            return taken

    taken_outcomes: list[str] = []
    reader = step_reader("trainer_state.json", "global_step", None)
    fixed = Watched(store.dir, "latest", store.fmt, "trainer_state.json", reader)
    save_folder(fixed.path, 20)
    journal = Journal(tmp_path / "journal.jsonl")
    taking = Snapshots(fixed, store, journal)
    taking.written()
    await taking.settle()
    save_folder(fixed.path, 30, n=65)
    (fixed.path / "trainer_state.json").unlink()  # torn: a kill before its commit file
    assert await taking.prepare(Ckpt(20, "checkpoint-20", 100)) is None
    await asyncio.sleep(0.1)
    await taking.settle()
    journal.close()
    assert overlaps == []
    # The torn folder looked at before the restore (refused), then the restore's own copy
    # after it.
    assert taken_outcomes == ["taken", "rejected", "known"]


async def test_a_fresh_start_moves_a_torn_fixed_folder_to_quarantine(tmp_path: Path):
    from trainwarden.supervisor.shell.snapshots import Snapshots
    from trainwarden.supervisor.store.journal import Journal, read_records

    store = hf_store(tmp_path)
    fixed = folder_of(store)
    files = save_folder(fixed.path, 20)
    (fixed.path / "trainer_state.json").unlink()  # a save torn before its commit file
    journal = Journal(tmp_path / "journal.jsonl")
    taking = Snapshots(fixed, store, journal)
    await taking.boot()
    assert await fresh_start(taking) is None
    journal.close()
    kinds = [r["kind"] for r in read_records(tmp_path / "journal.jsonl")]
    assert kinds == ["fixed_write_rejected", "quarantine"]
    assert not fixed.path.exists()
    moved = store.dir / "quarantine" / "latest"
    assert contents(moved) == {"model.safetensors": files["model.safetensors"]}
