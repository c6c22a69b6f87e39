"""Names in the checkpoint directory that the configured format does not read: the
watcher reports each once (also those there at its start), never a checkpoint, a write in
flight, a companion, quarantine/ or a dot-name; the daemon journals a hint and shows it."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from tests.support import PYTHON, journal, running_daemon, scripted_run, wait_for
from trainwarden.plugins.formats.andrea_bin import AndreaBin, checkpoint_name
from trainwarden.plugins.formats.hf_trainer import HfTrainer
from trainwarden.supervisor.inputs.checkpoint_unrecognised import JUDGE_AFTER_S
from trainwarden.supervisor.inputs.checkpoint_watch import CheckpointWatcher
from trainwarden.supervisor.store.checkpoints import CheckpointStore

pytestmark = pytest.mark.timeout(120)


def andrea_bin(step: int, n_params: int = 4) -> bytes:
    return struct.pack("<ii", step, n_params) + bytes(12 * n_params)


class Watched:
    def __init__(self, store: CheckpointStore, fixed: str | None = None) -> None:
        self.store = store
        self.reported: list[tuple[str, bool]] = []
        self.resolved: list[str] = []
        self.watcher = CheckpointWatcher(
            store,
            asyncio.get_running_loop(),
            on_committed=lambda name: None,
            on_writing=lambda: None,
            on_unrecognised=lambda name, is_dir: self.reported.append((name, is_dir)),
            on_resolved=self.resolved.append,
            fixed=fixed,
        )

    async def settle(self) -> None:
        """Long enough for every name seen so far to have been judged."""
        await asyncio.sleep(JUDGE_AFTER_S * 3)


async def test_a_fixed_name_a_folder_and_a_name_there_at_start_are_reported_once(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    (store.dir / "old_ckpt.pt").write_bytes(b"x")  # there before the watcher
    w = Watched(store)
    w.watcher.start()
    try:
        (store.dir / "ckpt.pt").write_bytes(b"x")
        (store.dir / "checkpoint-600").mkdir()
        await w.settle()
        (store.dir / "ckpt.pt").write_bytes(b"y")  # rewritten in place: no second report
        await w.settle()
        assert sorted(w.reported) == [
            ("checkpoint-600", True),
            ("ckpt.pt", False),
            ("old_ckpt.pt", False),
        ]
        (store.dir / "ckpt.pt").unlink()
        await w.settle()
        assert w.resolved == ["ckpt.pt"]
    finally:
        w.watcher.stop()


async def test_checkpoints_writes_companions_quarantine_and_dot_names_are_not(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    w = Watched(store)
    w.watcher.start()
    try:
        final = store.dir / checkpoint_name(10)
        # As the reference trainer commits: the sidecar first, while the .bin is in flight.
        tmp = store.dir / (checkpoint_name(10) + ".tmp")
        tmp.write_bytes(andrea_bin(10))
        sidecar = final.with_suffix(".json")
        sidecar.write_text("{}")
        await w.settle()  # judged while the write is in flight: deferred
        os.replace(tmp, final)
        (store.dir / ".nfs0001").write_bytes(b"")
        (store.dir / "quarantine").mkdir()
        (store.dir / "quarantine" / "junk.pt").write_bytes(b"")
        await w.settle()
        assert w.reported == []
    finally:
        w.watcher.stop()


async def test_the_fixed_file_of_an_in_place_trainer_and_its_staging_are_not_reported(
    tmp_path: Path,
):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    w = Watched(store, fixed="ckpt.pt")
    w.watcher.start()
    try:
        (store.dir / "ckpt.pt").write_bytes(b"x")  # what [checkpoints] fixed snapshots
        (store.dir / ".snapshots").mkdir()
        (store.dir / ".ckpt.pt.restoring").write_bytes(b"x")
        (store.dir / "other.pt").write_bytes(b"x")
        await w.settle()
        assert w.reported == [("other.pt", False)]
    finally:
        w.watcher.stop()


async def test_a_committed_hf_trainer_folder_is_not_reported(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", HfTrainer())
    store.ensure()
    w = Watched(store)
    w.watcher.start()
    try:
        folder = store.dir / "checkpoint-600"
        folder.mkdir()  # in flight until trainer_state.json is there
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": 600}))
        (store.dir / "ckpt.pt").write_bytes(b"x")
        await w.settle()
        assert w.reported == [("ckpt.pt", False)]
    finally:
        w.watcher.stop()


def test_the_daemon_journals_and_shows_the_hint(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir()
    (ckpts / "iter_600.pt").write_bytes(b"x")  # there at start
    with running_daemon(run_dir):
        (ckpts / "ckpt.pt").write_bytes(b"x")

        def records() -> list[dict]:
            return [r for r in journal(run_dir) if r["kind"] == "checkpoint_unrecognised"]

        found = wait_for(lambda: len(records()) == 2 and records(), 60, 0.1)
        hints = {r["name"]: r["hint"] for r in found}
        assert 'fixed = "ckpt.pt" and step_key = "iter_num"' in hints["ckpt.pt"]
        assert "options = { pattern = '^iter_(\\d+)\\.pt$' }" in hints["iter_600.pt"]
        out = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "status", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        shown = json.loads(out)["checkpoints_unrecognised"]
        assert {u["name"]: u["hint"] for u in shown} == hints
        text = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "status", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "hint      ckpt.pt matches no checkpoint name" in text
        # The trainer's own commits (step_*.bin and their sidecars) never are.
        assert len(records()) == 2
