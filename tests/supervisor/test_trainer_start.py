"""Where and how a trainer starts: [trainer] cwd, and PYTHONUNBUFFERED for a Python trainer
whose stdout is the run log (a file, so Python block-buffers it)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support import PYTHON, journal, journal_kinds, make_run, refused_start, running_daemon

pytestmark = pytest.mark.timeout(180)

BUFFERED_TRAINER = """\
import time
for step in range(1, {steps} + 1):
    time.sleep(0.2)
    print(f"step: {{step}}, loss: {{3.0 - step / 100:.4f}}, dt: 0.2")
"""
"""Plain print, no flush: what many trainers do. Its lines total far less than Python's
block buffer, so a buffered run shows nothing in the log until it exits."""

QUICK_RESTARTS = {"backoff_initial_s": 0.0, "backoff_max_s": 1.0}

# The daemon is given PYTHONUNBUFFERED="" (which Python reads as unset) so that what the
# trainer gets is the daemon's doing, whatever the test runner's environment holds.
NOT_UNBUFFERED = {"PYTHONUNBUFFERED": ""}


def buffered_run(run_dir: Path, steps: int, **trainer: object) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "train.py").write_text(BUFFERED_TRAINER.format(steps=steps))
    return make_run(
        run_dir,
        [PYTHON, "train.py"],
        trainer={"stop_timeout_s": 5.0, **trainer},
        restart={**QUICK_RESTARTS, "stall_timeout_s": 2.0, "max_restarts_without_progress": 1},
    )


def test_a_buffered_python_trainer_is_not_killed_as_hung(tmp_path: Path):
    # 20 steps at 0.2 s: 4 s of training under a 2 s stall timeout.
    run_dir = buffered_run(tmp_path / "run", 20)
    with running_daemon(run_dir, NOT_UNBUFFERED) as daemon:
        status = daemon.wait_state("finished", "crash_loop", "backoff", timeout=120)
        kinds = journal_kinds(run_dir)
        assert status["state"] == "finished", (status, kinds)
        assert "stall" not in kinds
        assert status["step"] == 20


def test_trainer_env_may_turn_unbuffered_output_off(tmp_path: Path):
    # Python reads an empty PYTHONUNBUFFERED as unset: the config's value wins over the
    # daemon's default, and the run then looks hung, as it would without the default.
    assert subprocess.run(
        [PYTHON, "-c", "import sys; print(sys.stdout.line_buffering, sys.stdout.write_through)"],
        env={**os.environ, "PYTHONUNBUFFERED": ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split() == ["False", "False"]
    run_dir = buffered_run(tmp_path / "run", 40, env=NOT_UNBUFFERED)
    with running_daemon(run_dir, {"PYTHONUNBUFFERED": "1"}) as daemon:
        daemon.wait_state("crash_loop", "finished", timeout=120)
        assert "stall" in journal_kinds(run_dir)


def test_the_trainer_starts_in_its_configured_cwd(tmp_path: Path):
    run_dir = tmp_path / "run"
    code = run_dir / "code"
    (code / "data").mkdir(parents=True)
    (code / "data" / "losses.txt").write_text("3.5\n3.25\n3.0\n")
    script = code / "train.py"
    script.write_text(
        f"#!{PYTHON}\n"
        "import os\n"
        "losses = open('data/losses.txt').read().split()\n"
        "for step, loss in enumerate(losses, 1):\n"
        "    print(f'step: {step}, loss: {loss}, dt: 0.1', flush=True)\n"
        "print('cwd:', os.getcwd(), flush=True)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    # A relative program is looked up in cwd too, by the start-up check and by the spawn.
    make_run(run_dir, ["./train.py"], trainer={"cwd": "code"})
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("finished", "crash_loop", "backoff", timeout=120)
        assert status["state"] == "finished", journal(run_dir)
        assert status["step"] == 3
    assert f"cwd: {code}\n" in (run_dir / "training.log").read_text()


def test_a_missing_cwd_is_one_line_and_exit_2(tmp_path: Path):
    run_dir = make_run(tmp_path / "run", [PYTHON, "train.py"], trainer={"cwd": "nanogpt"})
    line = refused_start(run_dir)
    assert "'trainer.cwd' = 'nanogpt' is invalid: expected an existing folder" in line


def test_a_cwd_removed_while_the_daemon_runs_is_named_when_the_next_start_fails(tmp_path: Path):
    run_dir = tmp_path / "run"
    (run_dir / "code").mkdir(parents=True)
    script = run_dir / "train.py"
    script.write_text("import os, shutil, sys\nshutil.rmtree(os.getcwd())\nsys.exit(1)\n")
    make_run(
        run_dir,
        [PYTHON, str(script)],
        trainer={"cwd": "code"},
        restart={**QUICK_RESTARTS, "max_restarts_without_progress": 2},
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("crash_loop", timeout=120)
    causes = [r["cause"] for r in journal(run_dir) if r["kind"] == "crash"]
    assert "1" in causes[0] and "working directory" not in causes[0], causes
    assert any(
        f"its working directory {run_dir / 'code'} ([trainer] cwd) is gone" in c for c in causes[1:]
    ), causes
