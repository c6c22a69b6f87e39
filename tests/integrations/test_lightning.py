"""A real PyTorch Lightning Trainer under the real daemon, with the shipped callback.

The trainer is the script below, as a Lightning user writes it plus trainwarden's lines: a
tiny LightningModule on CPU, data that is a pure function of the step, no download. One
uninterrupted run (the callback active, no daemon) is the reference the others must match.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch

from tests.support import (
    PYTHON,
    DaemonProcess,
    journal,
    make_run,
    pid_alive,
    running_daemon,
    wait_for,
)
from trainwarden.supervisor.contract import lightning_checkpoint_name

pytestmark = pytest.mark.timeout(300)

STEPS = 48
SAVE_EVERY = 8

TRAINER = '''
"""A tiny Lightning run as its user writes it, with trainwarden's callback and resume path."""
import io
import os
import sys
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins import TorchCheckpointIO

from trainwarden.integrations.lightning import TrainwardenCallback, resume_ckpt_path

STEPS, SAVE_EVERY = int(sys.argv[1]), int(sys.argv[2])
BATCHES_PER_EPOCH = 7  # STEPS spans several epochs; restarts land mid-epoch
SLOW_SAVE_S = float(os.environ.get("TEST_SLOW_SAVE_S", "0"))
STEP_SLEEP_S = float(os.environ.get("TEST_STEP_SLEEP_S", "0"))


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )

    def training_step(self, batch, batch_idx):
        # The batch is a pure function of the step, so a resume mid-epoch sees the same data.
        g = torch.Generator().manual_seed(1000 + self.global_step)
        x = torch.randn(16, 8, generator=g)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        if STEP_SLEEP_S:
            time.sleep(STEP_SLEEP_S)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self):
        return torch.utils.data.DataLoader(range(BATCHES_PER_EPOCH), batch_size=None)


class SlowIO(TorchCheckpointIO):
    """Writes the file in two halves with a pause between: a big checkpoint's write, small."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(SLOW_SAVE_S)
            f.write(data[len(data) // 2 :])


DEVICES = int(os.environ.get("TEST_DEVICES", "1"))  # 2: DDP over gloo, two processes

trainer = pl.Trainer(
    max_steps=STEPS,
    accelerator="cpu",
    devices=DEVICES,
    strategy="ddp" if DEVICES > 1 else "auto",
    logger=False,
    enable_progress_bar=False,
    enable_checkpointing=False,
    enable_model_summary=False,
    callbacks=[TrainwardenCallback(every_n_steps=SAVE_EVERY)],
    plugins=[SlowIO()] if SLOW_SAVE_S else None,
)
trainer.fit(Tiny(), ckpt_path=resume_ckpt_path())
print(f"fit returned on rank {trainer.global_rank} at step {trainer.global_step}", flush=True)
'''

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def write_trainer(where: Path) -> Path:
    script = where / "train_lightning.py"
    script.write_text(TRAINER)
    return script


def lightning_run(
    run_dir: Path,
    steps: int = STEPS,
    save_every: int = SAVE_EVERY,
    signal_target: str = "group",
    **env: str,
) -> Path:
    run_dir.mkdir(parents=True)
    script = write_trainer(run_dir)
    return make_run(
        run_dir,
        [PYTHON, str(script), str(steps), str(save_every)],
        run={"name": run_dir.name},
        trainer={
            "env": {**OFFLINE, **env},
            "stop_timeout_s": 60.0,
            "total_steps": steps,
            "signal_target": signal_target,
        },
        checkpoints={"format": "torch-pt", "options": {"preset": "lightning"}, "keep_last": 3},
        restart={
            "backoff_initial_s": 0.0,
            "backoff_max_s": 1.0,
            "max_restarts_without_progress": 5,
            "stall_timeout_s": 120.0,
        },
        telemetry={"parser": "step-line"},
    )


def step_lines(text: str) -> dict[int, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("step: "):
            fields = dict(part.split(": ") for part in line.split(", "))
            out[int(fields["step"])] = float(fields["loss"])
    return out


def loss_history(run_dir: Path) -> dict[int, list[tuple[int, float]]]:
    """step -> [(seg, loss), ...] in file order, from .loss.json."""
    rows: dict[int, list[tuple[int, float]]] = {}
    for line in (run_dir / ".loss.json").read_bytes().splitlines():
        row = orjson.loads(line)
        rows.setdefault(row["step"], []).append((row["seg"], row["loss"]))
    return rows


def newest_losses(run_dir: Path) -> dict[int, float]:
    return {step: max(rows)[1] for step, rows in loss_history(run_dir).items()}


def load(path: Path) -> dict[str, Any]:
    checkpoint: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return checkpoint


def assert_same_training_state(got: Path, want: Path) -> None:
    """Weights and optimizer moments equal bit for bit, at the same global_step."""
    a, b = load(got), load(want)
    assert a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    (opt_a,), (opt_b,) = a["optimizer_states"], b["optimizer_states"]
    for index, state in opt_b["state"].items():
        for name, value in state.items():
            assert torch.equal(opt_a["state"][index][name], value), (index, name)
    assert a["lr_schedulers"] == b["lr_schedulers"]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """The uninterrupted reference: the script alone, its callback active as under a daemon
    (TRAINWARDEN_RUN_DIR set), so it writes the same checkpoints and step lines."""
    run_dir = tmp_path_factory.mktemp("straight")
    script = write_trainer(run_dir)
    env = {**os.environ, **OFFLINE, "TRAINWARDEN_RUN_DIR": str(run_dir)}
    done = subprocess.run(
        [PYTHON, str(script), str(STEPS), str(SAVE_EVERY)],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses = step_lines(done.stdout)
    assert sorted(losses) == list(range(1, STEPS + 1)), done.stdout[-2000:]
    return run_dir, losses


def final_checkpoint(run_dir: Path, step: int = STEPS) -> Path:
    return run_dir / "checkpoints" / lightning_checkpoint_name(step)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_save_wait_commits_a_checkpoint_and_stop_saves_and_exits_zero(tmp_path: Path):
    # No periodic saves: every checkpoint here is one the daemon asked for.
    run_dir = lightning_run(tmp_path / "run", 100_000, 100_000, TEST_STEP_SLEEP_S="0.05")
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status()["step"] or 0) >= 3, 120, 0.2, what="step 3")
        status = daemon.status()
        assert set(status["handles"]) == {"SIGTERM", "SIGUSR1"}, status["handles"]
        pid = status["trainer_pid"]

        saved = cli("save", "--wait", str(run_dir))
        assert saved.returncode == 0, saved.stderr
        (name,) = [p.name for p in (run_dir / "checkpoints").glob("step=*.ckpt")]
        assert name in saved.stdout
        step = int(name[5:-5])
        assert step >= 3
        # Training goes on in the same process.
        wait_for(lambda: (daemon.status()["step"] or 0) >= step + 3, 120, 0.2, what="more steps")
        assert daemon.status()["trainer_pid"] == pid and pid_alive(pid)

        stopped = cli("stop", str(run_dir))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        (outcome,) = [r for r in journal(run_dir) if r["kind"] == "stop_outcome"]
        assert outcome["outcome"] == "saved" and outcome["steps_lost"] == 0, outcome
        last = max(int(p.name[5:-5]) for p in (run_dir / "checkpoints").glob("step=*.ckpt"))
        assert last == max(newest_losses(run_dir))
        log = (run_dir / "training.log").read_text()
        assert f"fit returned on rank 0 at step {last}" in log
        assert "SIGTERMException" not in log
        (exited,) = [r for r in journal(run_dir) if r["kind"] == "trainer_stopped"]
        assert exited["returncode"] == 0 and exited["pid"] == pid
        assert daemon.status()["state"] == "stopped"


# A soak (about 50 s beside a busy loop: three kills, one mid-write), in the slow tier;
# .ci/run runs it. One kill and a restart: the daemon-SIGKILL test below (its trainer is
# stopped by the next daemon and resumed from its checkpoint).
@pytest.mark.slow
def test_three_sigkills_one_mid_write_end_bit_identical_with_every_step_once(
    tmp_path: Path, straight_run: tuple[Path, dict[int, float]]
):
    straight_dir, straight_losses = straight_run
    run_dir = lightning_run(tmp_path / "run", TEST_SLOW_SAVE_S="0.5", TEST_STEP_SLEEP_S="0.15")
    kills = 0
    with running_daemon(run_dir) as daemon:
        while kills < 3:
            status = daemon.wait_state("running", "finished", timeout=120)
            assert status["state"] == "running", "finished before three kills"
            pid = status["trainer_pid"]
            if kills == 1:
                # Land this one while a checkpoint is being written (between its halves).
                wait_for(
                    lambda: list((run_dir / "checkpoints").glob("*.ckpt.tmp")),
                    120,
                    0.01,
                    what="a checkpoint write",
                )
            else:
                # Mid-epoch, a few steps past a verified checkpoint (not at a save).
                def past_a_checkpoint() -> bool:
                    now = daemon.status()
                    newest = now["last_checkpoint_step"]
                    return bool(newest) and (now["step"] or 0) >= newest + 3

                wait_for(past_a_checkpoint, 120, 0.05, what="steps past a checkpoint")
            assert pid_alive(pid)
            os.kill(pid, signal.SIGKILL)
            kills += 1
            wait_for(lambda p=pid: daemon.status()["trainer_pid"] not in (p, None), 120, 0.1)
        daemon.wait_state("finished", timeout=240)

    records = journal(run_dir)
    crashes = [r for r in records if r["kind"] == "crash"]
    assert len(crashes) == 3 and all("SIGKILL" in r["cause"] for r in crashes)
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    # Every restart resumed from a verified Lightning checkpoint at its global_step.
    spawns = [r for r in records if r["kind"] == "spawn"]
    assert len(spawns) == 4
    resumed = {r["seg"]: r["resume"] for r in spawns}
    assert all(resumed[seg] and resumed[seg]["name"].endswith(".ckpt") for seg in (2, 3, 4))
    # global_step continuous: each start logged the steps right after its checkpoint's.
    history = loss_history(run_dir)
    assert sorted(history) == list(range(1, STEPS + 1))
    by_seg: dict[int, list[int]] = {}
    for step, rows in history.items():
        for seg, _ in rows:
            by_seg.setdefault(seg, []).append(step)
    for seg, steps in by_seg.items():
        first = resumed[seg]["step"] + 1 if resumed[seg] else 1
        assert sorted(steps) == list(range(first, first + len(steps))), (seg, first)
    # The resumed losses are the uninterrupted run's, and so are the final weights.
    assert newest_losses(run_dir) == straight_losses
    assert all(loss == straight_losses[step] for step, rows in history.items() for _, loss in rows)
    assert_same_training_state(final_checkpoint(run_dir), final_checkpoint(straight_dir))


@pytest.mark.slow  # an uninterrupted Lightning run to compare with: 60-90 s; run by .ci/run
def test_a_daemon_sigkill_and_restart_keep_the_loss_history_steps_right(
    tmp_path: Path, straight_run: tuple[Path, dict[int, float]]
):
    straight_dir, straight_losses = straight_run
    run_dir = lightning_run(tmp_path / "run", TEST_STEP_SLEEP_S="0.05")
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        wait_for(lambda: (daemon.status()["step"] or 0) >= 12, 120, 0.1, what="step 12")
        daemon.kill()
        # The orphaned trainer goes on printing while no daemon follows the log.
        logged = len(step_lines((run_dir / "training.log").read_text()))
        wait_for(
            lambda: len(step_lines((run_dir / "training.log").read_text())) >= logged + 5,
            120,
            0.1,
            what="steps logged with no daemon",
        )
        daemon.start()
        daemon.wait_state("finished", timeout=240)
    finally:
        daemon.cleanup()
    history = loss_history(run_dir)
    assert sorted(history) == list(range(1, STEPS + 1))
    # Every step recorded, under any start, carries that step's loss: nothing renumbered.
    for step, rows in history.items():
        assert all(loss == straight_losses[step] for _, loss in rows), (step, rows)
    assert_same_training_state(final_checkpoint(run_dir), final_checkpoint(straight_dir))


def test_under_ddp_a_signal_to_rank_0_alone_saves_and_stops_every_rank_at_one_step(
    tmp_path: Path,
):
    # Only the main process (rank 0) gets the signals: without the flags all-reduced,
    # rank 1 would never call save_checkpoint and rank 0 would wait in its barrier.
    run_dir = lightning_run(
        tmp_path / "run", 100_000, 100_000, "main", TEST_DEVICES="2", TEST_STEP_SLEEP_S="0.05"
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status()["step"] or 0) >= 3, 180, 0.2, what="step 3")
        saved = cli("save", "--wait", str(run_dir))
        assert saved.returncode == 0, saved.stdout + saved.stderr
        step = daemon.status()["step"]
        wait_for(lambda: (daemon.status()["step"] or 0) >= step + 3, 120, 0.2, what="more steps")
        stopped = cli("stop", str(run_dir))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    (outcome,) = [r for r in journal(run_dir) if r["kind"] == "stop_outcome"]
    assert outcome["outcome"] == "saved" and outcome["steps_lost"] == 0, outcome
    last = max(int(p.name[5:-5]) for p in (run_dir / "checkpoints").glob("step=*.ckpt"))
    log = (run_dir / "training.log").read_text()
    assert f"fit returned on rank 0 at step {last}" in log
    assert f"fit returned on rank 1 at step {last}" in log
    (exited,) = [r for r in journal(run_dir) if r["kind"] == "trainer_stopped"]
    assert exited["returncode"] == 0
