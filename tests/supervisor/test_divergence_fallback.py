"""A checkpoint whose weights are finite but poisoned (1e30 each: it passes verification,
valid header, right size, its sidecar in place; NaN weights would be refused at
verification) is the newest when the reference trainer is started: the loss diverges right after resuming
from it, twice, and the daemon falls back past it to the older good one and trains on,
instead of halting in diverged."""

from __future__ import annotations

import json
import os
import subprocess
from array import array
from pathlib import Path

import pytest

from tests.support import PYTHON, journal, reference_run, running_daemon, wait_for
from trainwarden.supervisor.contract import ANDREA_BIN_HEADER, checkpoint_name, sidecar_path

pytestmark = pytest.mark.timeout(300)


def plant_poisoned_copy(ckpts: Path, step: int) -> str:
    """step+1: the checkpoint at `step` with every weight 1e30 (finite, so it verifies; the
    first forward pass overflows), moments untouched, committed as the trainer would,
    sidecar first."""
    source = ckpts / checkpoint_name(step)
    data = source.read_bytes()
    _, n_params = ANDREA_BIN_HEADER.unpack(data[: ANDREA_BIN_HEADER.size])
    weights_end = ANDREA_BIN_HEADER.size + 4 * n_params
    huge_weights = array("f", [1e30]) * n_params
    poisoned = (
        ANDREA_BIN_HEADER.pack(step + 1, n_params) + huge_weights.tobytes() + data[weights_end:]
    )
    assert len(poisoned) == len(data)
    name = checkpoint_name(step + 1)
    sidecar = json.loads(sidecar_path(source).read_text())
    sidecar["step"] = step + 1
    sidecar_path(ckpts / name).write_text(json.dumps(sidecar))
    staged = ckpts / f"staging-{name}"
    staged.write_bytes(poisoned)
    os.replace(staged, ckpts / name)
    return name


def test_a_divergence_on_a_poisoned_checkpoint_falls_back_and_trains_on(tmp_path: Path):
    run_dir = reference_run(tmp_path / "run", 60, 10, checkpoints={"keep_last": 10})
    ckpts = run_dir / "checkpoints"
    with running_daemon(run_dir) as daemon:
        wait_for(
            lambda: any(c["step"] >= 20 for c in daemon.request("checkpoints")["checkpoints"]),
            120,
            0.1,
            what="checkpoint 20",
        )
        stopped = daemon.request("stop")
        good = stopped["checkpoint"]["step"]
        assert good < 60
        poisoned = plant_poisoned_copy(ckpts, good)
        wait_for(
            lambda: any(
                c["name"] == poisoned for c in daemon.request("checkpoints")["checkpoints"]
            ),
            20,
            0.05,
            what=f"{poisoned} to be verified",
        )
        daemon.request("start")
        status = daemon.wait_state("finished", "diverged", timeout=240)
        assert status["state"] == "finished", status
        records = journal(run_dir)
        (quarantine,) = [r for r in records if r["kind"] == "quarantine" and r["name"] == poisoned]
        assert "diverged" in quarantine["reason"]
        (fallback,) = [r for r in records if r["kind"] == "fallback"]
        assert fallback["abandoned"] == good + 1 and fallback["resume_step"] == good
        assert [r["kind"] == "divergence" for r in records].count(True) == 2
        spawns = [r for r in records if r["kind"] == "spawn"]
        assert [s["resume"]["step"] for s in spawns[-3:]] == [good + 1, good + 1, good]
        assert (ckpts / "quarantine" / poisoned).exists()
        assert (ckpts / checkpoint_name(60)).exists()
        events = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "events", str(run_dir), "-n", "200"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert events.returncode == 0, events.stderr
        assert "fallback" in events.stdout and poisoned in events.stdout
