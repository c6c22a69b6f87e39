"""checkpoints/ (and the run log) as links to another disk: resolved once at start, watched
there, retained and resumed from there; a link that changes target is reported; nothing is
ever deleted or moved outside the directory resolved at start, and a quarantine/ that is a
link is refused."""

from __future__ import annotations

import os
import signal
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    belongs_to_run,
    journal,
    running_daemon,
    scripted_run,
    wait_for,
)
from trainwarden.plugins.formats.andrea_bin import AndreaBin, checkpoint_name
from trainwarden.supervisor.shell.boot import LINK_CHECK_S
from trainwarden.supervisor.store.checkpoints import CheckpointStore

pytestmark = pytest.mark.timeout(180)

ENDLESS = ("--steps", "100000000", "--save-every", "10", "--dt", "0.02")
"""The scripted trainer: effectively endless, a checkpoint every 10 steps (0.2 s)."""


def andrea_bin(step: int, n_params: int = 4) -> bytes:
    return struct.pack("<ii", step, n_params) + bytes(12 * n_params)


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def linked_run(tmp_path: Path, *args: str, **tables: Any) -> tuple[Path, Path]:
    """A scripted run whose checkpoints/ links to a folder on "the big disk"."""
    big = tmp_path / "big-disk" / "run-checkpoints"
    big.mkdir(parents=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(big)
    scripted_run(run_dir, *args, **tables)
    return run_dir, big


def retarget(link: Path, target: Path) -> None:
    """Point `link` at `target` in one rename, as `ln -sfn` would."""
    staging = link.with_name(link.name + ".new")
    staging.symlink_to(target)
    os.replace(staging, link)


# ----------------------------------------------------------------------------- end to end


def test_a_linked_checkpoint_dir_is_watched_retained_and_resumed_from(tmp_path: Path):
    run_dir, big = linked_run(tmp_path, *ENDLESS, checkpoints={"keep_last": 2})
    with running_daemon(run_dir) as daemon:
        (resolved,) = records(run_dir, "checkpoint_dir")
        assert resolved["configured"] == str(run_dir / "checkpoints")
        assert resolved["resolved"] == str(big)

        # Commits seen, and retention deleting the older ones from the target folder.
        deleted = wait_for(
            lambda: (done := records(run_dir, "delete"))[1:] and done, 60, what="retention"
        )
        # Each `delete` is journaled before its unlink (in a thread): gone right after.
        names = {r["name"] for r in deleted}
        wait_for(lambda: not names & {p.name for p in big.iterdir()}, 30, what="them deleted")
        assert len(records(run_dir, "checkpoint")) >= 4
        assert not records(run_dir, "delete_failed")
        assert daemon.status()["checkpoints"]

        pid = daemon.status()["trainer_pid"]
        assert belongs_to_run(pid, run_dir)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: len(records(run_dir, "spawn")) >= 2, 60, what="the restart")
        before = [r for r in journal(run_dir) if r["kind"] in ("checkpoint", "spawn")]
        second_spawn = [i for i, r in enumerate(before) if r["kind"] == "spawn"][1]
        newest = max(r["step"] for r in before[:second_spawn] if r["kind"] == "checkpoint")
        resume = before[second_spawn]["resume"]
        assert resume is not None and resume["step"] == newest
        wait_for(
            lambda: f"seg 2, from step {newest}" in (run_dir / "training.log").read_text(),
            30,
            what="the second trainer's start line",
        )


def test_a_quarantine_link_is_refused_and_nothing_lands_in_its_target(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", *ENDLESS)
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (ckpts / "quarantine").symlink_to(outside)
    bad = ckpts / checkpoint_name(5)  # the trainer saves every 10 steps: never this name
    bad.write_bytes(andrea_bin(5)[:-7])  # truncated: fails verification
    with running_daemon(run_dir):
        failed = wait_for(lambda: records(run_dir, "quarantine_failed"), 60, what="a refusal")
        assert failed[0]["name"] == bad.name
        assert "link" in failed[0]["error"]
        assert list(outside.iterdir()) == []
        assert bad.exists()


def test_a_link_that_changes_target_is_reported_once_and_the_first_target_kept(tmp_path: Path):
    run_dir, big = linked_run(tmp_path, *ENDLESS)
    other_disk = tmp_path / "other-disk"
    other_disk.mkdir()
    log_target = tmp_path / "logs" / "training.log"
    log_target.parent.mkdir()
    (run_dir / "training.log").symlink_to(log_target)
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: records(run_dir, "checkpoint"), 60, what="a first commit")
        (logged,) = records(run_dir, "log_path")
        assert logged["resolved"] == str(log_target)
        assert log_target.stat().st_size > 0  # the trainer writes to the resolved log

        retarget(run_dir / "checkpoints", other_disk)
        moved = wait_for(lambda: records(run_dir, "checkpoint_dir_moved"), 30, what="a report")
        assert moved[0]["configured"] == str(run_dir / "checkpoints")
        assert moved[0]["was"] == str(big)
        assert moved[0]["now"] == str(other_disk)
        assert moved[0]["watching"] == str(big)
        retarget(run_dir / "training.log", other_disk / "training.log")
        wait_for(lambda: records(run_dir, "log_path_moved"), 30, what="the log's report")

        time.sleep(3 * LINK_CHECK_S)  # several more checks: the same change is not reported again
        assert len(records(run_dir, "checkpoint_dir_moved")) == 1
        assert len(records(run_dir, "log_path_moved")) == 1
        paths = [c["path"] for c in daemon.status()["checkpoints"]]
        assert paths and all(Path(p).parent == big for p in paths)


# ----------------------------------------------------------------------------- the store


def test_the_store_works_on_the_resolved_directory(tmp_path: Path):
    big = tmp_path / "big"
    big.mkdir()
    (tmp_path / "checkpoints").symlink_to(big)
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    assert store.dir == big
    assert store.quarantine_dir == big / "quarantine"


@pytest.fixture
def swapped(tmp_path: Path) -> tuple[CheckpointStore, Path]:
    """A store whose directory was replaced by a link to another folder after it was made;
    that folder holds a checkpoint, its sidecar and a .tmp of the same names."""
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    store = CheckpointStore(directory, AndreaBin())
    directory.rename(tmp_path / "checkpoints.old")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / checkpoint_name(10)).write_bytes(andrea_bin(10))
    (elsewhere / checkpoint_name(10).replace(".bin", ".json")).write_text("{}")
    (elsewhere / (checkpoint_name(20) + ".tmp")).write_bytes(b"half")
    directory.symlink_to(elsewhere)
    return store, elsewhere


def test_nothing_is_deleted_where_the_directory_no_longer_resolves(
    swapped: tuple[CheckpointStore, Path],
):
    store, elsewhere = swapped
    before = sorted(os.listdir(elsewhere))
    with pytest.raises(OSError, match="resolves to"):
        store.delete(checkpoint_name(10))
    with pytest.raises(OSError, match="resolves to"):
        store.quarantine(checkpoint_name(10))
    with pytest.raises(OSError, match="resolves to"):
        store.remove_stale_in_flight()
    assert sorted(os.listdir(elsewhere)) == before


def test_a_quarantine_folder_that_is_a_link_is_refused(tmp_path: Path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (directory / "quarantine").symlink_to(outside)
    (directory / checkpoint_name(10)).write_bytes(andrea_bin(10))
    store = CheckpointStore(directory, AndreaBin())
    with pytest.raises(OSError, match="is a link") as refused:
        store.quarantine(checkpoint_name(10))
    assert refused.value.strerror and "is a link" in refused.value.strerror
    assert list(outside.iterdir()) == []
    assert (directory / checkpoint_name(10)).exists()
    assert store.quarantined() == []


def test_a_quarantine_that_is_a_file_is_refused(tmp_path: Path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "quarantine").write_text("not a folder")
    (directory / checkpoint_name(10)).write_bytes(andrea_bin(10))
    store = CheckpointStore(directory, AndreaBin())
    with pytest.raises(OSError, match="not a folder"):
        store.quarantine(checkpoint_name(10))
    assert (directory / checkpoint_name(10)).exists()
