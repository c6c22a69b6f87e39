"""`trainwarden demo` and its run directory: a finished demo run is not reused silently,
`--fresh` stops the daemon that supervises it (by the pid in its pid file) and empties it,
and a directory the demo did not make is never deleted. Real daemons and trainers."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tests.support import (
    DaemonProcess,
    pid_alive,
    reference_run,
    running_daemon,
    scripted_run,
    trainer_pid,
    wait_for,
)
from trainwarden.supervisor.cli.demo import (
    DEFAULT_DIR_NAME,
    DEMO_FAULTS,
    finished_at,
    offer_fresh,
    prepare,
    run_demo,
    shutdown,
    start_over,
    stop_daemon,
)
from trainwarden.supervisor.cli.start_checks import load_for_start

pytestmark = pytest.mark.timeout(300)

FAULT_HOOKS = Path(__file__).resolve().parent / "fault_hooks"


class Terminal(io.StringIO):
    """Typed answers, as read from a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def finished_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A demo directory from before the demo trained without end: 30 steps, run to the end.
    run_dir = tmp_path_factory.mktemp("finished") / DEFAULT_DIR_NAME
    reference_run(run_dir, steps=30, save_every=10)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=180)
        daemon.stop()
    return run_dir


def test_a_finished_demo_says_so_and_without_a_terminal_names_the_command(finished_demo: Path):
    config = (finished_demo / "trainwarden.toml").read_text()
    out = io.StringIO()
    assert run_demo(finished_demo, stdin=io.StringIO(""), out=out) == 1
    said = out.getvalue()
    assert f"the demo run in {finished_demo} has finished at step 30" in said
    assert f"run `trainwarden demo --fresh {finished_demo}`" in said
    assert "[y/N]" not in said  # no prompt without a terminal
    assert (finished_demo / "trainwarden.toml").read_text() == config  # not reused, not touched


def test_on_a_terminal_it_offers_a_fresh_run_no_by_default(finished_demo: Path):
    out = io.StringIO()
    assert offer_fresh(finished_demo, 30, Terminal("\n"), out) is False
    assert "Start a fresh demo run there (deletes the finished one)? [y/N]" in out.getvalue()
    assert f"`trainwarden demo --fresh {finished_demo}` starts it over" in out.getvalue()
    assert offer_fresh(finished_demo, 30, Terminal("y\n"), io.StringIO()) is True


def test_fresh_stops_the_supervising_daemon_by_its_pid_file_then_empties_the_directory(
    tmp_path: Path,
):
    run_dir = tmp_path / "demo"
    assert prepare(run_dir)
    config = (run_dir / "trainwarden.toml").read_text()
    for flag, step in DEMO_FAULTS.items():
        assert f'"{flag}", "{step}"' in config
    daemon = DaemonProcess(run_dir).start()
    try:
        trainer = wait_for(lambda: trainer_pid(run_dir), 60, what="the demo's trainer")
        out = io.StringIO()
        assert start_over(run_dir, out) is True
        said = out.getvalue()
        assert f"stopping the daemon that supervises it (pid {daemon.pid})" in said
        assert "the daemon has exited" in said
        assert not daemon.alive and not pid_alive(trainer)
        assert list(run_dir.iterdir()) == []
        assert finished_at(run_dir) is None
    finally:
        daemon.cleanup()


def test_fresh_never_deletes_a_directory_the_demo_did_not_make(tmp_path: Path):
    run_dir = tmp_path / "my-run"
    scripted_run(run_dir, "--steps", "5")
    (run_dir / "notes.txt").write_text("mine\n")
    out = io.StringIO()
    assert run_demo(run_dir, stdin=io.StringIO(""), out=out, fresh=True) == 1
    assert "is not a demo run directory" in out.getvalue()
    assert (run_dir / "notes.txt").read_text() == "mine\n"
    assert (run_dir / "trainwarden.toml").exists()


def _slow_exiting_daemon(run_dir: Path) -> DaemonProcess:
    """A daemon whose interpreter ends 3 s after it lets go of the run (a fault hook)."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOKS), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, "TRAINWARDEN_TEST_SLOW_EXIT": "3"}
    return DaemonProcess(scripted_run(run_dir, "--steps", "100000"), env).start()


@pytest.mark.parametrize("how", ["fresh", "quit"])
def test_the_demo_says_the_daemon_exited_only_once_it_has(tmp_path: Path, how: str):
    """It let go of the run's lock and pid file before its interpreter ended: the demo
    (`--fresh`, and quitting the demo it started) said "the daemon has exited" while it
    still ran."""
    daemon = _slow_exiting_daemon(tmp_path / "run")
    try:
        wait_for(lambda: trainer_pid(tmp_path / "run"), 60, what="the trainer")
        out = io.StringIO()
        if how == "fresh":
            assert stop_daemon(tmp_path / "run", out) is True
        else:
            assert shutdown(load_for_start(tmp_path / "run"), out) is True
        assert "the daemon has exited" in out.getvalue()
        assert not daemon.alive
    finally:
        daemon.cleanup()
