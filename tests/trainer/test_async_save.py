"""Checkpoints written in the background: the same bytes as a synchronous save, a loop that
trains on while they write, and the commit protocol's promises under SIGTERM, SIGKILL and
a full disk."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.trainer.trainer_process import (
    COMMON_ARGS,
    PACED,
    STEP_LINE,
    checkpoint,
    live_trainer,
    run_trainer,
    step_losses,
)
from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.supervisor.contract import parse_save_report

SLOW_WRITE = {**PACED, "TRAINER_TEST_SLOW_SAVE_S": "1.0"}
LONG = ("--steps", "2000", "--save-every", "10", "--sample-every", "0", "--eval-every", "0",
        "--device", "cpu")  # fmt: skip
"""Far more steps than a test waits for: it ends the trainer with a signal."""


def reports(lines: list[str]) -> list[tuple[int, str]]:
    """(index, line) of every save report in `lines`."""
    return [(at, line) for at, line in enumerate(lines) if parse_save_report(line)]


def sidecar_without_time(path: Path) -> dict:
    document = json.loads(path.with_suffix(".json").read_text())
    document.pop("saved_at")
    return document


def wait_for_file(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.01)
    assert path.exists(), f"{path.name} never appeared"


def test_an_async_save_writes_the_bytes_a_sync_save_writes(straight, tmp_path):
    synced = run_trainer(tmp_path, *COMMON_ARGS, "--sync-save")
    assert synced.returncode == 0, synced.stderr
    steps = sorted(int(p.stem[5:]) for p in (straight.run_dir / "checkpoints").glob("*.bin"))
    assert steps == list(range(10, 61, 10))
    for step in steps:
        ours, theirs = checkpoint(straight.run_dir, step), checkpoint(tmp_path, step)
        assert ours.read_bytes() == theirs.read_bytes(), f"step {step}: the .bin differs"
        assert sidecar_without_time(ours) == sidecar_without_time(theirs)
    assert step_losses(synced.stdout) == straight.losses


def test_the_loop_trains_on_while_a_save_writes_and_reports_its_stall(tmp_path):
    with live_trainer(tmp_path / "async", *LONG, env=SLOW_WRITE) as trainer:
        report = trainer.read_until("checkpoint: step_000010.bin saved")
        trainer.signal(signal.SIGTERM)
        assert trainer.finish() == 0
    at = trainer.lines.index(report.rstrip("\n"))
    stepped = [int(m.group(1)) for line in trainer.lines[:at] if (m := STEP_LINE.match(line))]
    assert max(stepped) > 10, "no step was trained while step 10's checkpoint was written"
    saved = parse_save_report(report)
    assert saved is not None and saved.stall_s is not None and saved.write_s is not None
    assert saved.stall_s < saved.write_s

    with live_trainer(tmp_path / "sync", *LONG, "--sync-save", env=SLOW_WRITE) as trainer:
        report = trainer.read_until("checkpoint: step_000010.bin saved")
        trainer.signal(signal.SIGTERM)
        assert trainer.finish() == 0
    at = trainer.lines.index(report.rstrip("\n"))
    assert trainer.lines[at - 1].startswith("step: 10,"), "a synchronous save let a step through"
    synced = parse_save_report(report)
    assert synced is not None and synced.stall_s == synced.write_s
    assert saved.stall_s < synced.stall_s


def test_sigterm_during_a_background_write_exits_0_with_both_checkpoints(tmp_path):
    # Saves 50 steps apart: the signal lands while step 50 writes (for a second) and the
    # loop trains on, so the stop saves a later step once that write is done.
    args = ("--steps", "2000", "--save-every", "50", *LONG[4:])
    in_flight = tmp_path / "checkpoints" / "step_000050.bin.tmp"
    with live_trainer(tmp_path, *args, env=SLOW_WRITE) as trainer:
        trainer.read_until("step: 52,")
        assert in_flight.exists() and not checkpoint(tmp_path, 50).exists()
        trainer.signal(signal.SIGTERM)
        assert trainer.finish() == 0

    saves = [line for _, line in reports(trainer.lines)]
    assert len(saves) == 2, saves
    assert "step_000050.bin saved (scheduled" in saves[0]
    assert "(stop requested" in saves[1]
    stopped_at = int(re.search(r"step_(\d+)\.bin", saves[1]).group(1))
    assert 50 < stopped_at == max(step_losses(trainer.lines)) < 100
    for step in (50, stopped_at):
        assert AndreaBin().verify(checkpoint(tmp_path, step)).step == step
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_sigkill_during_a_background_write_leaves_the_previous_checkpoint(tmp_path):
    committed = checkpoint(tmp_path, 10)
    in_flight = tmp_path / "checkpoints" / "step_000020.bin.tmp"
    with live_trainer(tmp_path, *LONG, env=SLOW_WRITE) as trainer:
        wait_for_file(committed)
        wait_for_file(in_flight)
        trainer.signal(signal.SIGKILL)
        trainer.finish()

    AndreaBin().verify(committed)
    assert not checkpoint(tmp_path, 20).exists()
    left = {p.name for p in (tmp_path / "checkpoints").iterdir()}
    # The sidecar goes first, so an orphan step_000020.json may remain beside the .tmp.
    assert left - {"step_000020.bin.tmp", "step_000020.json"} == {
        "step_000010.bin",
        "step_000010.json",
    }


def test_a_failed_background_write_stops_the_trainer_and_leaves_no_tmp(tmp_path, mounts):
    # Room for one tiny-preset checkpoint (1.4 MB) and not for two.
    mounts.tmpfs(tmp_path / "checkpoints", "2m")
    result = run_trainer(tmp_path, "--steps", "40", *LONG[2:], env=PACED)
    assert result.returncode != 0, "a checkpoint that could not be written went unnoticed"
    assert "No space left on device" in result.stderr
    AndreaBin().verify(checkpoint(tmp_path, 10))
    assert not checkpoint(tmp_path, 20).exists()
    assert not list((tmp_path / "checkpoints").glob("*.bin.tmp"))
    # It died at the next step boundary after the write failed, not training on past saves.
    assert max(step_losses(result.stdout)) < 30


# A soak (three kills and four starts of the real trainer), in the slow tier; .ci/run
# runs it.
@pytest.mark.slow
def test_sigkills_at_random_moments_then_resume_stay_bit_exact(straight, tmp_path):
    """Killed three times at moments that fall inside and outside background writes, then
    resumed from the newest commit each time: the losses and final state are the
    uninterrupted run's. (A synchronous save writes the same bytes, proven by
    test_an_async_save_writes_the_bytes_a_sync_save_writes; its resume through SIGTERM and
    SIGKILL by tests/trainer/test_resume_exact.py, whose SIGKILL test saves synchronously.)"""
    extra: tuple[str, ...] = ()
    env = {"TRAINER_TEST_STEP_SLEEP_S": "0.01", "TRAINER_TEST_SLOW_SAVE_S": "0.15"}
    losses: dict[int, str] = {}
    for kill_after in (13, 27, 44):
        newest = max(
            (p for p in (tmp_path / "checkpoints").glob("step_*.bin")),
            default=None,
            key=lambda p: p.name,
        )
        resume = ("--resume", str(newest)) if newest else ()
        with live_trainer(tmp_path, *COMMON_ARGS, *extra, *resume, env=env) as trainer:
            trainer.read_until(f"step: {kill_after},")
            trainer.signal(signal.SIGKILL)
            trainer.finish()
        logged = step_losses(trainer.lines)
        assert logged == {step: straight.losses[step] for step in logged}
        losses.update(logged)
    newest = max((tmp_path / "checkpoints").glob("step_*.bin"), key=lambda p: p.name)
    result = run_trainer(tmp_path, *COMMON_ARGS, *extra, "--resume", str(newest))
    assert result.returncode == 0, result.stderr
    losses.update(step_losses(result.stdout))
    assert losses == straight.losses, "some step was never trained"
    final = checkpoint(tmp_path, 60).read_bytes()
    assert final == checkpoint(straight.run_dir, 60).read_bytes()


def test_a_save_asked_for_during_a_write_waits_for_it_and_reports_the_wait(tmp_path):
    args = ("--steps", "2000", "--save-every", "50", *LONG[4:])
    in_flight = tmp_path / "checkpoints" / "step_000050.bin.tmp"
    with live_trainer(tmp_path, *args, env=SLOW_WRITE) as trainer:
        trainer.read_until("step: 52,")
        assert in_flight.exists(), "step 50's write ended before the request"
        trainer.signal(signal.SIGUSR1)
        trainer.read_until("checkpoint: step_000050.bin saved")
        requested = trainer.read_until("checkpoint: ")
        trainer.signal(signal.SIGTERM)
        assert trainer.finish() == 0
    previous_at = next(at for at, line in reports(trainer.lines) if "step_000050.bin saved" in line)
    report = parse_save_report(requested)
    assert report is not None and "(save requested" in requested, requested
    asked_at = int(re.search(r"step_(\d+)\.bin", requested).group(1))
    # The loop stood still from the request until step 50's write committed: the step it
    # saved is the last one logged before that commit.
    logged = [
        int(m.group(1)) for line in trainer.lines[:previous_at] if (m := STEP_LINE.match(line))
    ]
    assert asked_at == max(logged) > 50
    assert report.stall_s is not None and report.stall_s > 0.2, "the wait is not in the stall"
