"""`trainwarden init --compile --sync-save`: the flags reach the reference trainer's command."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import PYTHON, checkpoints, running_daemon
from trainwarden.supervisor.config import load_config
from trainwarden.supervisor.contract import parse_save_report


def init(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [PYTHON, "-m", "trainwarden.supervisor", "init", str(run_dir), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_init_passes_compile_and_sync_save_to_the_trainer(tmp_path: Path) -> None:
    compiled = init(tmp_path / "compiled", "--compile")
    assert compiled.returncode == 0, compiled.stderr
    command = load_config(tmp_path / "compiled").trainer.command
    assert "--compile" in command and "--sync-save" not in command

    run_dir = tmp_path / "synced"
    synced = init(run_dir, "--sync-save", "--steps", "20", "--save-every", "10", "--device", "cpu")
    assert synced.returncode == 0, synced.stderr
    assert "--sync-save" in load_config(run_dir).trainer.command
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
    assert checkpoints(run_dir) == [10, 20]
    reports = [
        report
        for line in (run_dir / "training.log").read_text().splitlines()
        if (report := parse_save_report(line)) is not None
    ]
    # A synchronous save: the loop waited for the whole write.
    assert len(reports) == 2 and all(r.stall_s == r.write_s for r in reports), reports
