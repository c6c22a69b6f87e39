"""SIGUSR1 saves and continues; injected faults fire once per run directory."""

from __future__ import annotations

import math
import re
import signal
import time

from tests.trainer.trainer_process import (
    PACED,
    checkpoint,
    floats,
    live_trainer,
    read_bin,
    run_trainer,
    step_losses,
)
from trainwarden.plugins.formats.andrea_bin import AndreaBin

SHORT = ("--steps", "30", "--save-every", "100", "--sample-every", "0", "--device", "cpu")


def test_sigusr1_saves_and_continues_sigterm_saves_and_exits_0(tmp_path):
    # Every save is slow here, so the later signals surely land in the middle of one.
    env = {**PACED, "TRAINER_TEST_SLOW_SAVE_S": "0.5"}
    in_flight = tmp_path / "checkpoints"
    # Long enough to outlast both saves: the loop trains on while a save writes.
    args = ("--steps", "400", *SHORT[2:])
    with live_trainer(tmp_path, *args, env=env) as trainer:
        trainer.read_until("step: 10,")
        trainer.signal(signal.SIGUSR1)
        saved_line = trainer.read_until("checkpoint:")
        assert "saved (save requested" in saved_line
        saved_at = int(re.search(r"step_(\d+)\.bin", saved_line).group(1))
        trainer.read_until("step: ")  # still training

        trainer.signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list(in_flight.glob("*.bin.tmp")):
            time.sleep(0.01)
        # Mid-save now: another SIGTERM and a SIGUSR1 only set flags already handled.
        trainer.signal(signal.SIGTERM)
        trainer.signal(signal.SIGUSR1)
        assert trainer.finish() == 0

    saves = [line for line in trainer.lines if line.startswith("checkpoint:")]
    assert len(saves) == 2 and "stop requested" in saves[1], saves
    stopped_at = max(step_losses(trainer.lines))
    assert saved_at < stopped_at < 400
    for step in (saved_at, stopped_at):
        assert AndreaBin().verify(checkpoint(tmp_path, step)).step == step
    assert not list(in_flight.glob("*.tmp"))


def test_crash_fires_once_then_a_restart_trains_past_it(tmp_path):
    args = ("--steps", "12", "--save-every", "5", "--sample-every", "0", "--crash-at-step", "7")
    crashed = run_trainer(tmp_path, *args)
    assert crashed.returncode == 3
    assert max(step_losses(crashed.stdout)) == 7
    assert (tmp_path / ".faults" / "crash-7").exists()
    assert not checkpoint(tmp_path, 10).exists()

    again = run_trainer(tmp_path, *args, env={"TRAINWARDEN_RESUME": str(checkpoint(tmp_path, 5))})
    assert again.returncode == 0, again.stderr
    assert sorted(step_losses(again.stdout)) == list(range(6, 13))


def test_nan_fault_logs_nan_and_poisons_the_weights(tmp_path):
    args = ("--steps", "6", "--save-every", "100", "--sample-every", "0", "--nan-at-step", "4")
    result = run_trainer(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    losses = step_losses(result.stdout)
    assert all(math.isfinite(float(losses[step])) for step in (1, 2, 3))
    assert math.isnan(float(losses[4]))
    assert (tmp_path / ".faults" / "nan-4").exists()
    _, _, weights, _, _ = read_bin(checkpoint(tmp_path, 6))
    assert not all(math.isfinite(w) for w in floats(weights))


def test_hang_ignores_sigterm_until_sigkill(tmp_path):
    args = ("--steps", "50", "--save-every", "100", "--sample-every", "0", "--hang-at-step", "3")
    with live_trainer(tmp_path, *args) as trainer:
        trainer.read_until("step: 3,")
        trainer.signal(signal.SIGTERM)
        time.sleep(1.0)
        assert trainer.process.poll() is None, "a hung trainer must not react to SIGTERM"
        trainer.signal(signal.SIGKILL)
        assert trainer.finish() == -signal.SIGKILL
    assert max(step_losses(trainer.lines)) == 3
    assert not (tmp_path / "checkpoints").exists() or not any(
        (tmp_path / "checkpoints").glob("*.bin")
    )
    assert (tmp_path / ".faults" / "hang-3").exists()
