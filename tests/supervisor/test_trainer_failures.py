"""The trainer's own failures are not blamed on its checkpoint, and a run that had
checkpoints never starts from scratch by itself: through the real daemon, the CLI and real
processes (a train.py that runs the scripted trainer, broken and repaired by the test).

- A train.py with a syntax error, killed and restarted: its starts die in milliseconds
  before reading the checkpoint; no checkpoint is quarantined, the run halts in crash_loop
  with the trainer's last line as the cause, and `start` after the repair resumes from the
  newest verified checkpoint.
- A program that is gone: the spawn fails; the same, no checkpoint suspected.
- No verified checkpoint left: the daemon halts in no_checkpoint and alerts; `start` is
  refused in one line naming `--from-scratch`, which starts over (journaled).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import (
    PYTHON,
    SCRIPTED_TRAINER,
    belongs_to_run,
    checkpoints,
    journal,
    make_run,
    running_daemon,
    trainer_pid,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)

TRAIN_PY = f"""import runpy, sys
sys.argv[0] = {str(SCRIPTED_TRAINER)!r}
runpy.run_path({str(SCRIPTED_TRAINER)!r}, run_name="__main__")
"""
BROKEN = "def broken(:\n"
TRAINER_ARGS = ("--steps", "100000000", "--save-every", "10", "--dt", "0.02")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", *args], capture_output=True, text=True, timeout=60
    )


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def kill_trainer(run_dir: Path) -> None:
    pid = trainer_pid(run_dir)
    assert pid is not None and belongs_to_run(pid, run_dir)
    os.kill(pid, signal.SIGKILL)


def alerts(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "alerts.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def test_a_broken_train_py_halts_in_crash_loop_with_its_last_line_and_no_checkpoint_blamed(
    tmp_path: Path,
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.py").write_text(TRAIN_PY)
    make_run(
        run_dir,
        [PYTHON, "train.py", *TRAINER_ARGS],
        trainer={"stop_timeout_s": 10.0},
        restart={
            "backoff_initial_s": 0.1,
            "backoff_max_s": 0.2,
            "max_restarts_without_progress": 3,
        },
        checkpoints={"keep_last": 3},
        alerts={"command": ["sh", "-c", f"cat >> {run_dir / 'alerts.jsonl'}"]},
    )
    with running_daemon(run_dir) as daemon:
        wait_for(
            lambda: len(daemon.request("checkpoints")["checkpoints"]) >= 2, 60, what="checkpoints"
        )
        (run_dir / "train.py").write_text(BROKEN)
        kill_trainer(run_dir)
        status = daemon.wait_state("crash_loop", timeout=60)
        kept = sorted(c["step"] for c in daemon.request("checkpoints")["checkpoints"])
        newest = kept[-1]
        assert "SyntaxError" in status["detail"]["reason"], status["detail"]
        assert not records(run_dir, "quarantine") and not records(run_dir, "fallback")
        assert checkpoints(run_dir)[-len(kept) :] == kept
        failed = records(run_dir, "trainer_failed_before_resume")
        assert failed and all(r["step"] == newest for r in failed)
        assert any("SyntaxError" in (r.get("last_line") or "") for r in records(run_dir, "crash"))
        halted = wait_for(lambda: [a for a in alerts(run_dir) if a.get("event") == "halted"], 30)
        assert "SyntaxError" in orjson.dumps(halted[0]).decode()

        (run_dir / "train.py").write_text(TRAIN_PY)
        started = cli("start", str(run_dir))
        assert started.returncode == 0, started.stderr
        assert f"trainer starting from step {newest}" in started.stdout
        daemon.wait_state("running", timeout=60)
        wait_for(lambda: (daemon.status().get("step") or 0) > newest, 60, what="steps past it")
    assert f"from step {newest}," in (run_dir / "training.log").read_text().split("SyntaxError")[-1]


def test_a_program_gone_at_restart_is_the_trainers_failure_not_the_checkpoints(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = run_dir / "train.sh"
    script.write_text(f'#!/bin/sh\nexec {PYTHON} {SCRIPTED_TRAINER} "$@"\n')
    script.chmod(0o755)
    make_run(
        run_dir,
        ["./train.sh", *TRAINER_ARGS],
        trainer={"stop_timeout_s": 10.0},
        restart={
            "backoff_initial_s": 0.1,
            "backoff_max_s": 0.2,
            "max_restarts_without_progress": 3,
        },
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: daemon.request("checkpoints")["checkpoints"], 60, what="a checkpoint")
        script.rename(run_dir / "train.sh.away")
        kill_trainer(run_dir)
        status = daemon.wait_state("crash_loop", timeout=60)
        assert "could not start the trainer" in status["detail"]["reason"], status["detail"]
        assert not records(run_dir, "quarantine") and not records(run_dir, "fallback")
        newest = max(c["step"] for c in daemon.request("checkpoints")["checkpoints"])
        (run_dir / "train.sh.away").rename(script)
        started = cli("start", str(run_dir))
        assert started.returncode == 0 and f"from step {newest}" in started.stdout, started


def test_no_verified_checkpoint_left_halts_and_only_an_explicit_choice_starts_over(
    tmp_path: Path,
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(SCRIPTED_TRAINER, run_dir / "train.py")
    make_run(
        run_dir,
        [PYTHON, "train.py", *TRAINER_ARGS],
        trainer={"stop_timeout_s": 10.0},
        restart={"backoff_initial_s": 0.1, "backoff_max_s": 0.2},
        alerts={"command": ["sh", "-c", f"cat >> {run_dir / 'alerts.jsonl'}"]},
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: len(checkpoints(run_dir)) >= 2, 60, what="checkpoints")
        # Deleted by hand (or lost with a disk), then the trainer dies.
        for path in (run_dir / "checkpoints").glob("step_*"):
            path.unlink()
        kill_trainer(run_dir)
        status = daemon.wait_state("no_checkpoint", timeout=60)
        assert "no verified checkpoint is left" in status["detail"]["reason"]
        spawns = records(run_dir, "spawn")
        assert spawns[0]["resume"] is None and all(s["resume"] for s in spawns[1:])
        halted = wait_for(lambda: [a for a in alerts(run_dir) if a.get("event") == "halted"], 30)
        assert "--from-scratch" in orjson.dumps(halted[0]).decode()

        refused = cli("start", str(run_dir))
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
        assert "no_checkpoint" in refused.stderr and "--from-scratch" in refused.stderr
        assert len(records(run_dir, "spawn")) == len(spawns)

        over = cli("start", "--from-scratch", str(run_dir))
        assert over.returncode == 0 and "trainer starting from scratch" in over.stdout, over
        daemon.wait_state("running", timeout=60)
        assert records(run_dir, "start_from_scratch")
        (operator,) = [r for r in records(run_dir, "operator") if r["cmd"] == "start"][-1:]
        assert operator["args"] == {"from_scratch": True}
        assert records(run_dir, "spawn")[-1]["resume"] is None


def test_an_exit_0_before_total_steps_is_finished_early_and_alerted(tmp_path: Path):
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, str(SCRIPTED_TRAINER), "--steps", "55", "--save-every", "10", "--dt", "0.005"],
        trainer={"stop_timeout_s": 10.0, "total_steps": 100_000},
        alerts={"command": ["sh", "-c", f"cat >> {tmp_path / 'run' / 'alerts.jsonl'}"]},
    )
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("finished", timeout=60)
        assert status["detail"]["reason"] == (
            "the trainer exited 0 at step 55 of 100000 ([trainer] total_steps), before the end"
        )
        (finished,) = records(run_dir, "trainer_finished")
        assert finished["early"] is True and finished["total_steps"] == 100_000
        alert = wait_for(lambda: [a for a in alerts(run_dir) if a.get("event") == "finished"], 30)
        assert "exited 0 at step 55 of 100000" in alert[0]["happened"], alert


def test_commits_without_step_lines_raise_a_hint_and_an_alert(tmp_path: Path):
    """The trainer's stdout goes nowhere (closed, redirected): its saves keep coming while
    the daemon reads no loss. After three commits in a row with no step line: the hint."""
    trainer = f"exec {PYTHON} {SCRIPTED_TRAINER} --steps 100000 --save-every 10 --dt 0.01"
    run_dir = make_run(
        tmp_path / "run",
        ["sh", "-c", trainer + " > /dev/null"],
        trainer={"stop_timeout_s": 10.0},
        alerts={"command": ["sh", "-c", f"cat >> {tmp_path / 'run' / 'alerts.jsonl'}"]},
    )
    with running_daemon(run_dir):
        (hint,) = wait_for(lambda: records(run_dir, "no_step_lines"), 60, what="the hint")
        assert hint["commits"] == 3 and hint["last_step"] is None
        assert "NaN and spike detection are off" in hint["hint"]
        alert = wait_for(
            lambda: [a for a in alerts(run_dir) if a.get("event") == "no_step_lines"], 30
        )
        assert "with no step line this start" in alert[0]["happened"]
