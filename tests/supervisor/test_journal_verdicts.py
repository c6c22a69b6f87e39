"""The journal replayed into checkpoints and their verdicts (store.verdicts), with no
daemon: what `trainwarden checkpoints` offline, `branch` and `inspect` all read."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.support import make_run
from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.supervisor.cli.branch_checkpoint import choose_checkpoint
from trainwarden.supervisor.cli.export import exportable
from trainwarden.supervisor.cli.inspection import inspect_checkpoint
from trainwarden.supervisor.config import load_config
from trainwarden.supervisor.contract import checkpoint_name
from trainwarden.supervisor.errors import CheckpointInvalid, TrainwardenError
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.digest import digest_checkpoint
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.rundir import RunFiles
from trainwarden.supervisor.store.verdicts import read_verdicts

pytestmark = pytest.mark.timeout(60)

ROLLBACK = {"reason": "after the rollback", "cause": "rollback", "cause_step": 15}


def andrea_bin(step: int, n_params: int = 4, fill: int = 0) -> bytes:
    return struct.pack("<ii", step, n_params) + bytes([fill]) * (12 * n_params)


def journaled(run_dir: Path, *records: tuple[str, dict]) -> None:
    """Append `records` with the daemon's own journal writer."""
    RunFiles(run_dir).state_dir.mkdir(exist_ok=True)
    journal = Journal(RunFiles(run_dir).journal)
    for kind, fields in records:
        journal.append({"kind": kind, **fields})
    journal.close()


def committed(step: int, path: Path) -> tuple[str, dict]:
    digest = digest_checkpoint([path]).hex
    return "checkpoint", {
        "step": step,
        "name": path.name,
        "bytes": path.stat().st_size,
        "digest": digest,
    }


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = make_run(tmp_path / "run", ["python", "train.py"])
    (run / "checkpoints" / "quarantine").mkdir(parents=True)
    return run


# ----------------------------------------------------------------------------- the replay


def test_verified_then_deleted_is_no_longer_verified(tmp_path: Path):
    journaled(
        tmp_path,
        ("checkpoint", {"step": 10, "name": "step_000010.bin", "bytes": 40, "digest": "aa"}),
        ("checkpoint", {"step": 20, "name": "step_000020.bin", "bytes": 40, "digest": "bb"}),
        ("delete", {"step": 10, "name": "step_000010.bin", "reason": "retention: keep_last=1"}),
    )
    journal = read_verdicts(RunFiles(tmp_path).journal)
    deleted = journal.checkpoints["step_000010.bin"]
    assert journal.verified("step_000010.bin") is None
    assert (deleted.status, deleted.reason, deleted.digest) == (
        "deleted",
        "retention: keep_last=1",
        "aa",
    )
    assert journal.refused("step_000010.bin") is None  # deleted, not set aside
    kept = journal.verified("step_000020.bin")
    assert kept is not None and (kept.step, kept.bytes, kept.digest) == (20, 40, "bb")
    # Written again and refused at its verification: the copy set aside was never committed.
    journaled(tmp_path, ("quarantine", {"step": 10, "name": "step_000010.bin", "reason": "torn"}))
    journal = read_verdicts(RunFiles(tmp_path).journal)
    assert journal.committed_digest("step_000010.bin", in_quarantine=True) is None


def test_verified_then_quarantined_carries_the_reason(tmp_path: Path):
    name = checkpoint_name(20)
    journaled(
        tmp_path,
        ("checkpoint", {"step": 20, "name": name, "bytes": 40, "digest": "aa"}),
        ("quarantine", {"step": 20, "name": name, **ROLLBACK}),
    )
    journal = read_verdicts(RunFiles(tmp_path).journal)
    verdict = journal.checkpoints[name]
    assert journal.verified(name) is None
    assert (verdict.status, verdict.reason) == ("quarantined", "after the rollback")
    refused = journal.refused(name)
    assert refused is not None and (refused["cause"], refused["cause_step"]) == ("rollback", 15)
    assert journal.notes[name] == refused
    # The copy set aside is held to the commit before it.
    assert journal.committed_digest(name, in_quarantine=True) == "aa"


def test_a_deletion_after_a_quarantine_does_not_clear_it_a_new_commit_does(tmp_path: Path):
    name = checkpoint_name(20)
    journaled(
        tmp_path,
        ("checkpoint", {"step": 20, "name": name, "bytes": 40, "digest": "aa"}),
        ("quarantine", {"step": 20, "name": name, **ROLLBACK}),
        ("delete", {"step": 20, "name": name, "reason": "retention: keep_last=1"}),
    )
    assert read_verdicts(RunFiles(tmp_path).journal).refused(name) is not None
    journaled(tmp_path, ("checkpoint", {"step": 20, "name": name, "bytes": 48, "digest": "cc"}))
    journal = read_verdicts(RunFiles(tmp_path).journal)
    assert journal.refused(name) is None
    # Still why the first copy lies in quarantine/, and what it was at its own commit.
    assert journal.notes[name]["cause"] == "rollback"
    assert journal.committed_digest(name, in_quarantine=True) == "aa"
    assert journal.committed_digest(name, in_quarantine=False) == "cc"


def test_a_later_checkpoint_record_of_the_same_name_wins(tmp_path: Path):
    name = checkpoint_name(30)
    journaled(
        tmp_path,
        ("checkpoint", {"step": 30, "name": name, "bytes": 40, "digest": "aa"}),
        ("checkpoint", {"step": 30, "name": name, "bytes": 48, "digest": "bb"}),
    )
    verdict = read_verdicts(RunFiles(tmp_path).journal).verified(name)
    assert verdict is not None and (verdict.bytes, verdict.digest) == (48, "bb")


def test_the_newest_state_snapshot_gives_the_pins(tmp_path: Path):
    journaled(
        tmp_path,
        ("state", {"state": {"pinned": [10, 20]}}),
        ("checkpoint", {"step": 30, "name": checkpoint_name(30), "bytes": 40, "digest": "aa"}),
        ("state", {"state": {"pinned": [20, 30]}}),
    )
    assert read_verdicts(RunFiles(tmp_path).journal).pinned == {20, 30}
    # A fast crash loop's folded cycles carry the newest state in a `repeated` record.
    journaled(tmp_path, ("repeated", {"last": {"state": {"state": {"pinned": [40]}}}}))
    assert read_verdicts(RunFiles(tmp_path).journal).pinned == {40}


def test_a_torn_last_line_is_skipped(tmp_path: Path):
    name = checkpoint_name(10)
    journaled(tmp_path, ("checkpoint", {"step": 10, "name": name, "bytes": 40, "digest": "aa"}))
    with open(RunFiles(tmp_path).journal, "ab") as f:  # a power cut mid-write
        f.write(b'{"ts": "2024-01-01T00:00:00.000000Z", "kind": "delete", "name": "step_0000')
    journal = read_verdicts(RunFiles(tmp_path).journal)
    assert journal.verified(name) is not None and list(journal.checkpoints) == [name]


def test_no_journal_is_no_verdicts(tmp_path: Path):
    journal = read_verdicts(RunFiles(tmp_path).journal)
    assert (journal.checkpoints, journal.pinned, journal.notes) == ({}, frozenset(), {})


# ----------------------------------------------------------------------------- the callers


def test_a_checkpoint_the_journal_quarantined_left_in_its_folder_is_not_exported(run_dir: Path):
    """The move to quarantine/ failed: the file is where it was, the journal's verdict
    stands (as the daemon's next start and `branch` hold), so export refuses it."""
    path = run_dir / "checkpoints" / checkpoint_name(20)
    path.write_bytes(andrea_bin(20))
    journaled(
        run_dir, committed(20, path), ("quarantine", {"step": 20, "name": path.name, **ROLLBACK})
    )
    assert inspect_checkpoint(path)["quarantined"] is True
    with pytest.raises(CheckpointInvalid, match="it is quarantined"):
        exportable(path)


def test_a_set_aside_file_is_held_to_its_own_commit_not_a_later_one_of_its_name(run_dir: Path):
    """Rolled back, step 20 is written and committed again: quarantine/step_000020.bin is
    still the first one, and reads as its own commit did."""
    first = run_dir / "checkpoints" / "quarantine" / checkpoint_name(20)
    first.write_bytes(andrea_bin(20, fill=1))
    again = run_dir / "checkpoints" / checkpoint_name(20)
    again.write_bytes(andrea_bin(20, fill=2))
    journaled(
        run_dir,
        committed(20, first),
        ("quarantine", {"step": 20, "name": first.name, **ROLLBACK}),
        committed(20, again),
    )
    report = inspect_checkpoint(first)
    assert report["recorded_digest"] == digest_checkpoint([first]).hex
    assert report["digest_matches"] is True
    assert inspect_checkpoint(again)["digest_matches"] is True


def test_branch_names_why_a_step_is_only_in_quarantine_after_a_recommit(run_dir: Path):
    """Step 20 set aside, written again and committed, then deleted by retention: the step
    20 there is lies in quarantine/, and the refusal says why, as before the recommit."""
    name = checkpoint_name(20)
    set_aside = run_dir / "checkpoints" / "quarantine" / name
    set_aside.write_bytes(andrea_bin(20, fill=1))
    later = run_dir / "checkpoints" / checkpoint_name(30)
    later.write_bytes(andrea_bin(30))
    journaled(
        run_dir,
        committed(20, set_aside),
        ("quarantine", {"step": 20, "name": name, **ROLLBACK}),
        ("checkpoint", {"step": 20, "name": name, "bytes": 4, "digest": "00" * 16}),
        committed(30, later),
        ("delete", {"step": 20, "name": name, "reason": "retention: keep_last=1"}),
    )
    cfg = load_config(run_dir, check_plugins=False)
    store = CheckpointStore(cfg.checkpoint_dir, AndreaBin())
    with pytest.raises(TrainwardenError, match="set aside by the rollback"):
        choose_checkpoint(cfg, store, 20)
    assert choose_checkpoint(cfg, store, None).step == 30
