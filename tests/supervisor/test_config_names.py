"""A config written before the reference trainer's module was renamed (`python -m trainer`)
is refused when it is loaded, in one line that says what to write instead."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import PYTHON, make_run
from trainwarden.supervisor.config import load_config
from trainwarden.supervisor.errors import ConfigError

pytestmark = pytest.mark.timeout(120)

OLD = ["python", "-m", "trainer", "--run-dir", ".", "--preset", "tiny"]
NEW = ["python", "-m", "trainwarden.trainer", "--run-dir", ".", "--preset", "tiny"]


def run_dir_with(tmp_path: Path, command: list[str]) -> Path:
    run_dir = tmp_path / "run"
    make_run(run_dir, command)
    return run_dir


@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detach"])
def test_the_daemon_refuses_python_m_trainer_and_does_not_start(tmp_path: Path, detach: bool):
    run_dir = run_dir_with(tmp_path, OLD)
    argv = [PYTHON, "-m", "trainwarden.supervisor", "daemon", *(["--detach"] if detach else [])]
    done = subprocess.run(
        [*argv, str(run_dir)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2, f"expected exit 2 for a config error, got {done.returncode}"
    assert done.stdout == "", f"nothing belongs on stdout: {done.stdout!r}"
    lines = done.stderr.splitlines()
    assert len(lines) == 1, f"the error is one line, got:\n{done.stderr}"
    (line,) = lines
    assert "Traceback" not in line
    assert str(run_dir / "trainwarden.toml") in line, "the error names the file"
    assert "'trainer.command'" in line, "the error names the key"
    assert f"write command = {json.dumps(NEW)}" in line, "the error says what to write"
    assert "trainwarden-trainer" in line, "the error names the console script too"
    state = run_dir / ".trainwarden"
    started = sorted(p.name for p in state.iterdir()) if state.exists() else []
    assert started == [], f"the daemon started (it left {started} in {state})"
    assert not (run_dir / "training.log").exists(), "a trainer was started"


@pytest.mark.parametrize(
    ("command", "fixed"),
    [
        (
            ["python", "-mtrainer", "--steps", "5"],
            ["python", "-mtrainwarden.trainer", "--steps", "5"],
        ),
        (
            ["python3", "-u", "-m", "trainer.cli"],
            ["python3", "-u", "-m", "trainwarden.trainer.cli"],
        ),
        (
            ["torchrun", "--nproc-per-node", "2", "-m", "trainer"],
            ["torchrun", "--nproc-per-node", "2", "-m", "trainwarden.trainer"],
        ),
    ],
    ids=["joined", "submodule", "torchrun"],
)
def test_every_spelling_of_the_old_module_is_refused_with_its_fix(
    tmp_path: Path, command: list[str], fixed: list[str]
):
    run_dir = run_dir_with(tmp_path, command)
    with pytest.raises(ConfigError) as caught:
        load_config(run_dir)
    assert f"write command = {json.dumps(fixed)}" in str(caught.value)
    # The suggested command is itself a valid config.
    make_run(run_dir, fixed)
    assert load_config(run_dir).trainer.command == fixed


@pytest.mark.parametrize(
    "command",
    [
        NEW,
        ["trainwarden-trainer", "--run-dir", "."],
        ["python", "train.py", "-m", "trainer-notes"],
        ["python", "trainer.py"],
    ],
    ids=["new-module", "script", "other-module", "a-file"],
)
def test_commands_that_do_not_run_the_old_module_load(tmp_path: Path, command: list[str]):
    assert load_config(run_dir_with(tmp_path, command)).trainer.command == command


@pytest.mark.parametrize("own", ["trainer.py", "trainer/__init__.py"])
def test_a_run_directory_with_its_own_trainer_module_may_run_it(tmp_path: Path, own: str):
    run_dir = run_dir_with(tmp_path, OLD)
    (run_dir / own).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / own).write_text("print('step: 1, loss: 1.0, dt: 0.1')\n")
    assert load_config(run_dir).trainer.command == OLD


def test_commands_that_only_talk_to_a_daemon_still_read_the_old_config(tmp_path: Path):
    """An operator can still reach (and stop) a running daemon before fixing its config."""
    run_dir = run_dir_with(tmp_path, OLD)
    assert load_config(run_dir, check_plugins=False).trainer.command == OLD
    done = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "status", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "trainer.command" not in done.stderr, done.stderr
