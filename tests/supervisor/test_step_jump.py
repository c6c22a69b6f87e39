"""A checkpoint planted far in the future of a live run (valid header, right size) is
quarantined as implausible: it never becomes the newest, retention keeps the real ones,
and a killed trainer resumes from the newest real checkpoint."""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path

import pytest

from tests.support import belongs_to_run, journal, running_daemon, scripted_run, wait_for

pytestmark = pytest.mark.timeout(120)

N_PARAMS = 1000
FAR = 99_999_999


def committed_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in journal(run_dir) if r["kind"] == "checkpoint"]


def test_a_far_future_checkpoint_is_quarantined_and_the_real_ones_survive(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        *("--steps", "100000", "--save-every", "10", "--dt", "0.05"),
        *("--n-params", str(N_PARAMS)),
        checkpoints={"keep_last": 1},
    )
    ckpts = run_dir / "checkpoints"
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: len(committed_steps(run_dir)) >= 2, 60, 0.05, what="two commits")
        name = f"step_{FAR}.bin"
        staged = ckpts / f"staging-{name}"
        staged.write_bytes(struct.pack("<ii", FAR, N_PARAMS) + bytes(12 * N_PARAMS))
        os.replace(staged, ckpts / name)

        def quarantined() -> str | None:
            assert daemon.alive, daemon.stderr(1500)
            for r in journal(run_dir):
                if r["kind"] == "quarantine" and r["name"] == name:
                    return str(r["reason"])
            return None

        reason = wait_for(quarantined, 20, 0.05, what=f"{name} to be quarantined")
        assert "max_step_jump" in reason and f"step {FAR}" in reason
        wait_for(lambda: (ckpts / "quarantine" / name).exists(), 10, 0.05, what="the move")
        # Real checkpoints committed after it stay: retention keeps the newest of them.
        after = len(committed_steps(run_dir))
        wait_for(lambda: len(committed_steps(run_dir)) >= after + 2, 30, 0.05, what="commits")
        listed = [c["step"] for c in daemon.request("checkpoints")["checkpoints"]]
        assert listed and max(listed) < FAR
        # Each real checkpoint went only once a newer real one was committed.
        newest_real = 0
        for r in journal(run_dir):
            if r["kind"] == "checkpoint" and r["step"] < FAR:
                newest_real = max(newest_real, r["step"])
            if r["kind"] == "delete":
                assert r["step"] < newest_real, f"{r['name']} deleted while it was the newest"
        # A SIGKILL of the trainer: it resumes from the newest real checkpoint.
        pid = daemon.status()["trainer_pid"]
        assert belongs_to_run(pid, run_dir)
        os.kill(pid, signal.SIGKILL)

        def respawned() -> dict | None:
            spawns = [r for r in journal(run_dir) if r["kind"] == "spawn"]
            return spawns[-1] if len(spawns) >= 2 else None

        resume = wait_for(respawned, 30, 0.05, what="the restart")["resume"]
        assert resume is not None and max(listed) <= resume["step"] < FAR
        status = daemon.wait_state("running", timeout=30)
        assert status["step"] < FAR
