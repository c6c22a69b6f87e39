"""A full disk under the run directory: the daemon keeps supervising, holds what it could not
write, writes it once space returns, and never tears a line.

The run directory is a small tmpfs filled with a filler file; the trainer's log and its
checkpoints sit on a second, roomy tmpfs each, so the trainer itself never sees the full disk.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import PYTHON, DaemonProcess, journal, scripted_run, wait_for
from tests.support.mounts import Mounts
from trainwarden.supervisor.errors import CommandRefused
from trainwarden.supervisor.store.losshistory import LossHistory

pytestmark = pytest.mark.timeout(240)

STEPS = 700


def small_run(tmp_path: Path, mounts: Mounts, *args: str) -> Path:
    run_dir = mounts.tmpfs(tmp_path / "run", "1m")
    mounts.tmpfs(run_dir / "logs", "16m")
    mounts.tmpfs(run_dir / "checkpoints", "16m")
    return scripted_run(run_dir, *args, run={"log": "logs/training.log"})


def fill(path: Path) -> None:
    """Write `path` until the file system has not one byte left."""
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 16, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(bytes(size))


def write_fails(run_dir: Path) -> bool:
    """The volume is full: a new byte cannot be written anywhere on it."""
    probe = run_dir / ".probe"
    try:
        with open(probe, "wb", buffering=0) as f:
            f.write(b"x")
    except OSError as exc:
        return exc.errno == errno.ENOSPC
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return False


def loss_lines(run_dir: Path) -> list[bytes]:
    return (run_dir / ".loss.json").read_bytes().split(b"\n")


def daemon_for(run_dir: Path, tmp_path: Path) -> DaemonProcess:
    # Its stderr off the full volume: the test reads what it said.
    return DaemonProcess(run_dir, stderr_path=tmp_path / "daemon.stderr")


def test_a_full_disk_under_the_journal_and_loss_history_loses_no_step(
    tmp_path: Path, mounts: Mounts
) -> None:
    run_dir = small_run(
        tmp_path, mounts, "--steps", str(STEPS), "--dt", "0.02", "--save-every", "100000",
        "--usr1", "save",
    )  # fmt: skip
    daemon = daemon_for(run_dir, tmp_path)
    try:
        daemon.start()
        wait_for(lambda: (daemon.status().get("step") or 0) >= 40, 60, what="step 40")
        fill(run_dir / "filler")
        assert write_fails(run_dir)

        def both_full() -> dict[str, Any] | None:
            status = daemon.status()
            names = {Path(f).name for f in status.get("disk_full_files") or []}
            if "journal.jsonl" not in names:
                # A save's checkpoint is journaled: records until the journal's page is full.
                with contextlib.suppress(CommandRefused):
                    daemon.request("save")
            return status if {"journal.jsonl", ".loss.json"} <= names else None

        full = wait_for(both_full, 60, interval=0.5, what="journal and .loss.json full")
        assert full["disk_full"] is True
        step_full = full["step"]
        # Supervising on: steps keep being decided while nothing reaches the disk.
        wait_for(
            lambda: (daemon.status().get("step") or 0) >= step_full + 100, 60, what="100 more steps"
        )
        assert daemon.alive
        assert write_fails(run_dir)
        (run_dir / "filler").unlink()
        wait_for(lambda: daemon.status().get("disk_full") is False, 30, what="disk_full false")
        daemon.wait_state("finished", timeout=120)
        assert daemon.alive
    finally:
        daemon.cleanup()

    said = (tmp_path / "daemon.stderr").read_text()
    assert "Traceback" not in said
    for name in (".loss.json", ".trainwarden/journal.jsonl"):
        assert f"{run_dir / name}: No space left on device" in said, "the log names the file"
    lines = loss_lines(run_dir)
    assert lines[-1] == b"", "the history ends with a whole line"
    records = [orjson.loads(line) for line in lines[:-1]]  # a torn or glued line fails here
    steps = [r["step"] for r in records]
    assert sorted(steps) == list(range(1, STEPS + 1)), "every step once, none lost"
    kinds = [r["kind"] for r in journal(run_dir)]
    assert "disk_full" in kinds
    assert "disk_recovered" in kinds
    assert kinds.index("disk_full") < kinds.index("disk_recovered")
    recovered = [r for r in journal(run_dir) if r["kind"] == "disk_recovered"]
    assert {Path(r["file"]).name for r in recovered} == {".loss.json", "journal.jsonl"}
    assert all(r["lost_records"] == 0 for r in recovered)


def test_a_daemon_started_on_a_full_disk_warns_in_one_line_and_supervises(
    tmp_path: Path, mounts: Mounts
) -> None:
    run_dir = small_run(
        tmp_path, mounts, "--steps", "300", "--dt", "0.02", "--save-every", "100000"
    )
    (run_dir / ".trainwarden").mkdir(mode=0o700)
    fill(run_dir / "filler")
    assert write_fails(run_dir)
    daemon = daemon_for(run_dir, tmp_path)
    try:
        daemon.start()
        status = wait_for(
            lambda: (s := daemon.status()).get("step") and s["step"] >= 20 and s, 60, what="steps"
        )
        assert status["disk_full"] is True
        stderr = (tmp_path / "daemon.stderr").read_text()
        assert "Traceback" not in stderr
        warnings = [
            line for line in stderr.splitlines() if "WARNING" in line and "no space" in line.lower()
        ]
        assert len(warnings) == 1, stderr
        assert "degraded" in warnings[0]
        said = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "status", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert said.returncode == 0, said.stderr
        disk_line = [line for line in said.stdout.splitlines() if line.startswith("disk ")]
        assert disk_line and "full" in disk_line[0] and "journal.jsonl" in disk_line[0]
        (run_dir / "filler").unlink()
        wait_for(lambda: daemon.status().get("disk_full") is False, 30, what="disk_full false")
        daemon.wait_state("finished", timeout=120)
    finally:
        daemon.cleanup()
    kinds = [r["kind"] for r in journal(run_dir)]
    assert kinds[0] == "daemon_start", "what it held from the start comes first, in order"
    assert "disk_recovered" in kinds
    steps = [orjson.loads(line)["step"] for line in loss_lines(run_dir)[:-1]]
    assert sorted(steps) == list(range(1, 301))


def test_steps_held_when_the_daemon_is_killed_are_read_again_from_the_log(
    tmp_path: Path, mounts: Mounts
) -> None:
    run_dir = small_run(
        tmp_path, mounts, "--steps", str(STEPS), "--dt", "0.02", "--save-every", "20"
    )
    daemon = daemon_for(run_dir, tmp_path)
    try:
        daemon.start()
        wait_for(lambda: (daemon.status().get("step") or 0) >= 40, 60, what="step 40")
        fill(run_dir / "filler")
        full = wait_for(
            lambda: (s := daemon.status()).get("disk_full") and s, 30, what="status disk_full"
        )
        # Past two checkpoints more: a resume from the newest replays none of the held steps.
        wait_for(lambda: (daemon.status().get("step") or 0) >= full["step"] + 100, 60, what="steps")
        daemon.kill()
        (run_dir / "filler").unlink()
        daemon.start()
        daemon.wait_state("finished", timeout=120)
    finally:
        daemon.cleanup()
    history = LossHistory.load(run_dir / ".loss.json")
    # A line the killed daemon had begun stays a torn line of its own, which readers skip.
    assert history.load_stats.garbage <= 1 and not history.load_stats.torn_tail
    steps = [row.step for row in history]
    assert steps == list(range(1, STEPS + 1)), "no step lost with the killed daemon"


def test_restarts_on_a_full_checkpoint_disk_are_no_crash_loop_and_the_run_resumes(
    tmp_path: Path, mounts: Mounts
) -> None:
    """The checkpoint volume fills: every save fails (the trainer exits 1 on ENOSPC), far
    more often than max_restarts_without_progress, and the run is not halted; once space
    returns it goes on from the newest checkpoint and finishes, nothing quarantined."""
    run_dir = tmp_path / "run"
    mounts.tmpfs(run_dir / "checkpoints", "1m")
    scripted_run(
        run_dir,
        *("--steps", "60", "--save-every", "10", "--dt", "0.01"),
        restart={
            "backoff_initial_s": 0.0,
            "backoff_max_s": 0.2,
            "max_restarts_without_progress": 2,
        },
    )
    filler = run_dir / "checkpoints" / "filler"
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        wait_for(lambda: (run_dir / "checkpoints" / "step_000010.bin").exists(), 60, what="10")
        fill(filler)
        wait_for(
            lambda: (
                sum(r.get("disk_full") is True for r in journal(run_dir) if r["kind"] == "crash")
                >= 4
            ),
            60,
            what="four crashes on the full disk",
        )
        assert daemon.status()["state"] != "crash_loop"
        filler.unlink()
        status = daemon.wait_state("finished", timeout=120)
    finally:
        daemon.cleanup()
    records = journal(run_dir)
    assert not [r for r in records if r["kind"] in ("quarantine", "halt", "fallback")]
    assert all(r.get("disk_full") for r in records if r["kind"] == "crash")
    assert status["last_checkpoint_step"] == 60
