"""`trainwarden demo` from nothing, in a real 80x24 terminal: run dir, daemon, TUI, stop prompt."""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import belongs_to_run, checkpoints, kill_quietly, pid_alive, trainer_pid
from tests.tui.terminal import Tmux
from trainwarden.supervisor.cli.demo import ask_to_stop

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def demo_dir(tmp_path: Path) -> Iterator[Path]:
    run_dir = tmp_path / "demo"
    try:
        yield run_dir
    finally:
        # Whatever happened, leave no daemon or trainer of this test behind.
        pid = trainer_pid(run_dir)
        if belongs_to_run(pid, run_dir):
            kill_quietly(pid)
        try:
            daemon = int((run_dir / ".trainwarden" / "daemon.pid").read_text())
        except (OSError, ValueError):
            daemon = None
        if belongs_to_run(daemon, run_dir):
            kill_quietly(daemon, group=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_demo_from_nothing_then_quit_and_stop(demo_dir: Path):
    tmux = Tmux()
    try:
        code = "import sys; from pathlib import Path; from trainwarden.supervisor.cli.demo import run_demo; "
        code += "sys.exit(run_demo(Path(sys.argv[1])))"
        tmux.start([sys.executable, "-c", code, str(demo_dir)])
        tmux.wait_for("RUNNING", "telemetry", "checkpoints", timeout=90)
        assert (demo_dir / "trainwarden.toml").exists()
        pid = trainer_pid(demo_dir)
        assert pid is not None and pid_alive(pid)

        tmux.keys("q")
        screen = tmux.wait_for("Stop the training run?", "[Y/n]", timeout=20)
        assert f"created the run directory {demo_dir}" in screen
        tmux.keys("Enter")
        screen = tmux.wait_for("the run directory is kept for inspection", timeout=90)
        assert "the daemon has exited" in screen
        assert not pid_alive(pid)
        assert not (demo_dir / ".trainwarden" / "daemon.pid").exists()
        assert checkpoints(demo_dir)  # the trainer saved before it stopped
    finally:
        tmux.close()


def test_no_terminal_means_the_default_without_a_prompt():
    out = io.StringIO()
    assert ask_to_stop(io.StringIO("n\n"), out) is True
    assert "[Y/n]" not in out.getvalue()
    assert "stopping the run (the default)" in out.getvalue()
