"""`trainwarden demo`'s run and its quit, without the TUI: the demo's config plans no total
(so no percentage and no ETA towards the trainer's far-off --steps), and a demo that starts
the trainer of a stopped run asks on quit as for its own run (yes by default) and then stops
that trainer only, leaving the daemon it found. Real daemons over the scripted trainer."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest

from tests.support import running_daemon, scripted_run, wait_for
from trainwarden.supervisor.cli.demo import (
    DEMO_STEPS,
    QUIT_LEAVES_ATTACHED,
    QUIT_STOPS_OWN_RUN,
    ask_to_stop,
    ensure_daemon,
    prepare,
    stop_trainer,
)
from trainwarden.supervisor.cli.main import main
from trainwarden.supervisor.config import load_config

pytestmark = pytest.mark.timeout(300)

RUNNING = ("--steps", "100000000", "--save-every", "25", "--dt", "0.02")


class Terminal(io.StringIO):
    """Typed answers, as read from a terminal."""

    def isatty(self) -> bool:
        return True


def test_the_demos_config_plans_no_total_steps(tmp_path: Path):
    run_dir = tmp_path / "demo"
    assert prepare(run_dir)
    cfg = load_config(run_dir)
    assert cfg.trainer.total_steps is None
    command = cfg.trainer.command
    assert command[command.index("--steps") + 1] == str(DEMO_STEPS)  # trains until stopped
    assert "total_steps =" not in (run_dir / "trainwarden.toml").read_text()


def test_a_run_without_total_steps_reports_no_eta(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run_dir = scripted_run(tmp_path / "run", *RUNNING)
    assert load_config(run_dir).trainer.total_steps is None
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running")
        wait_for(lambda: (daemon.status().get("steps_per_min") or 0) > 0, 60, what="a speed")
        assert main(["status", str(run_dir), "--json"]) == 0
        status = orjson.loads(capsys.readouterr().out)
    assert status["steps_per_min"] > 0  # a rate the ETA could have used
    assert status["total_steps"] is None and status["eta_s"] is None


def test_starting_the_trainer_of_a_stopped_run_makes_it_the_demos_to_stop(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", *RUNNING)
    cfg = load_config(run_dir)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running")
        daemon.request("stop", timeout=60)
        daemon.wait_state("stopped")

        out = io.StringIO()
        started = ensure_daemon(cfg, out)
        assert (started.daemon, started.trainer, started.own) == (False, True, True)
        assert started.quit_means == QUIT_STOPS_OWN_RUN
        assert "started it again from its newest checkpoint" in out.getvalue()
        assert "quitting leaves it running" not in out.getvalue()
        daemon.wait_state("running")

        # Quit asks as for the demo's own run, yes by default, and says the daemon stays.
        out = io.StringIO()
        assert ask_to_stop(Terminal("\n"), out, started.own, daemon_stays=True) is True
        assert "this demo started its trainer" in out.getvalue()
        assert out.getvalue().endswith("[Y/n] ")
        assert stop_trainer(cfg, out) is True
        assert "trainer stopped" in out.getvalue()
        assert daemon.alive and daemon.status()["state"] == "stopped"

        # A run that is going when the demo attaches stays someone else's.
        daemon.request("start", timeout=60)
        daemon.wait_state("running")
        attached = ensure_daemon(cfg, io.StringIO())
        assert not attached.own and attached.quit_means == QUIT_LEAVES_ATTACHED
