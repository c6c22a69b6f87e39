"""The real command in a real 80x24 terminal (tmux), read back as an operator over SSH sees it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import pid_alive
from tests.tui.conftest import LiveRun
from tests.tui.terminal import Tmux

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def tui_command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "trainwarden.supervisor", "tui", str(run_dir)]


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    session = Tmux()
    try:
        yield session
    finally:
        session.close()


def test_tui_command_in_an_80x24_terminal(tmux: Tmux, live: LiveRun):
    pid = live.daemon.wait_state("running", timeout=90)["trainer_pid"]
    tmux.start(tui_command(live.run_dir))
    # Waiting for all of it also waits out a frame still being painted.
    screen = tmux.wait_for(
        "RUNNING", "/ 100,000", "ln V 5.55", "bandit", "docs", "✓", "checkpoint", "q quit"
    )
    lines = screen.splitlines()
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80
    assert f"pid {pid}" in lines[0]
    assert lines[-1].lstrip().startswith("s save")

    tmux.keys("?")
    tmux.wait_for("trainwarden - keys", "quit the TUI; the run goes on")
    tmux.keys("Escape")
    tmux.wait_for("telemetry", "RUNNING")

    # Shift+P from a real terminal pins the selected (newest) checkpoint; again unpins it.
    tmux.keys("P")
    pinned = tmux.wait_for("checkpoint at step", " pinned", timeout=20)
    step = int(pinned.split("checkpoint at step ")[1].split()[0])
    assert step in [
        c["step"] for c in live.daemon.request("checkpoints")["checkpoints"] if c["pinned"]
    ]
    tmux.keys("P")
    tmux.wait_for(f"checkpoint at step {step} unpinned", timeout=20)

    tmux.keys("l")
    log = tmux.wait_for("training.log", "step: ")
    assert "loss: " in log
    tmux.keys("Escape")
    tmux.wait_for("telemetry")

    tmux.keys("q")
    deadline = time.monotonic() + 20
    while not tmux.pane_dead():
        assert time.monotonic() < deadline, f"the TUI did not quit:\n{tmux.screen()}"
        time.sleep(0.2)
    # Quitting the TUI never touches the run.
    status = live.daemon.status()
    assert status["state"] == "running" and status["trainer_pid"] == pid and pid_alive(pid)


def test_unreachable_daemon_is_one_line_naming_the_socket(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "trainwarden.tui", "--socket", str(tmp_path / "nobody.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "nobody.sock") in lines[0]
