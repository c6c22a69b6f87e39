"""`trainwarden demo` from nothing, in a real 80x24 terminal: run dir, daemon, TUI, the four
incidents it stages (each captioned, and on the events panel's top row until the next), and
what q does to the run (stops the demo's own, leaves one it attached to)."""

from __future__ import annotations

import io
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    DaemonProcess,
    belongs_to_run,
    checkpoints,
    journal,
    kill_quietly,
    pid_alive,
    trainer_pid,
    wait_for,
)
from tests.tui.terminal import Tmux
from trainwarden.supervisor.cli.demo import DEMO_FAULTS, DEMO_SAVE_EVERY, ask_to_stop, prepare

pytestmark = pytest.mark.timeout(360)


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


DEMO = (
    "import sys; from pathlib import Path; from trainwarden.supervisor.cli.demo import run_demo; "
    "sys.exit(run_demo(Path(sys.argv[1])))"
)
CRASH, NAN, HANG, SPIKE = (
    DEMO_FAULTS[f]
    for f in ("--crash-at-step", "--nan-at-step", "--hang-at-step", "--bad-data-at-step")
)
BEFORE = DEMO_SAVE_EVERY
"""Each fault fires halfway between two checkpoints: the daemon resumes from the one before."""
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def top_event(screen: str) -> str | None:
    """The kind in the events panel's first row, None when the panel shows no row."""
    lines = screen.splitlines()
    for i, line in enumerate(lines[:-1]):
        cells = line.split("│")
        for j, cell in enumerate(cells):
            if re.match(r"\s*UTC\s+kind\s+detail", cell):
                below = lines[i + 1].split("│")
                words = below[j].split() if j < len(below) else []
                return words[1] if len(words) > 1 else None
    return None


def watch_incidents(tmux: Tmux, incidents: list[tuple[set[str], str]], deadline: float) -> None:
    """Each incident's caption on screen in turn (the caption shows the newest only), and
    from the moment it shows until the next one's does, the incident on the events panel's
    first row in every capture, whatever routine records came after it (the next incident
    may take the row a moment before its caption shows). An incident may be more than one
    record: a hang is its `stall`, then the `crash` of the trainer killed for it, whose
    detail says "hang"."""
    seen = -1
    while seen < len(incidents) - 1:
        screen = tmux.screen()
        while seen < len(incidents) - 1 and incidents[seen + 1][1] in screen:
            seen += 1
        if seen >= 0:
            kinds = set().union(*(kinds for kinds, _ in incidents[seen : seen + 2]))
            assert top_event(screen) in kinds, (incidents[seen], screen)
        if time.monotonic() > deadline:
            raise AssertionError(f"{incidents[seen + 1][1]!r} not on screen:\n{screen}")
        time.sleep(0.2)


@needs_tmux
def test_demo_shows_a_crash_a_divergence_and_a_hang_then_quit_stops_its_own_run(demo_dir: Path):
    tmux = Tmux()
    try:
        started = time.monotonic()
        tmux.start([sys.executable, "-c", DEMO, str(demo_dir)])
        tmux.wait_for("RUNNING", "telemetry", "checkpoints", timeout=90)
        assert (demo_dir / "trainwarden.toml").exists()
        # Within 210 s of starting from nothing: each incident, captioned with what the
        # daemon did, as it happens, and on the events panel's top row until the next.
        spike_from = SPIKE - SPIKE % BEFORE - BEFORE
        watch_incidents(
            tmux,
            [
                (
                    {"crash"},
                    f"trainer crashed at step {CRASH} (exit 3); daemon restarted it from step"
                    f" {CRASH - CRASH % BEFORE}",
                ),
                (
                    {"divergence"},
                    f"loss nan at step {NAN:,}; daemon killed the trainer, rolled back to step"
                    f" {NAN - NAN % BEFORE:,}",
                ),
                (
                    {"stall", "crash"},
                    f"trainer hung at step {HANG:,}; daemon killed it, restarted it from step"
                    f" {HANG - HANG % BEFORE:,}",
                ),
                # At 80 columns the caption takes a second line for what the daemon did.
                ({"spike"}, f"loss spike at step {SPIKE:,} (2.0x average)"),
                ({"spike"}, f"daemon rolled back to {spike_from:,}, skips {spike_from + 1:,}-"),
            ],
            started + 210,
        )
        # The last incident still holds the top row once training goes on past it.
        kinds = [r["kind"] for r in journal(demo_dir)]
        assert {"crash", "divergence", "stall", "spike", "rollback"} <= set(kinds)
        # Still training after all four: new checkpoints past the spike's window.
        wait_for(lambda: max(checkpoints(demo_dir), default=0) > SPIKE, 90, what="training on")
        assert top_event(tmux.screen()) == "spike", tmux.screen()
        pid = trainer_pid(demo_dir)
        assert pid is not None and pid_alive(pid)
        daemon = int((demo_dir / ".trainwarden" / "daemon.pid").read_text())

        tmux.keys("?")  # the help says what q does here
        tmux.wait_for("the demo then stops the run it started", "escape closes", timeout=20)
        tmux.keys("Escape")
        tmux.wait_for("RUNNING", timeout=20)
        tmux.keys("q")
        screen = tmux.wait_for("Stop the demo's run (this demo started it)?", "[Y/n]", timeout=20)
        assert f"created the run directory {demo_dir}" in screen
        tmux.keys("Enter")
        screen = tmux.wait_for("the run directory is kept for inspection", timeout=90)
        assert "the daemon has exited" in screen
        assert not pid_alive(pid) and not pid_alive(daemon)
        assert not (demo_dir / ".trainwarden" / "daemon.pid").exists()
        assert checkpoints(demo_dir)  # the trainer saved before it stopped
    finally:
        tmux.close()


@needs_tmux
def test_demo_attached_to_a_run_it_did_not_start_leaves_it_running(demo_dir: Path):
    prepare(demo_dir)
    daemon = DaemonProcess(demo_dir).start()
    tmux = Tmux()
    try:
        tmux.start([sys.executable, "-c", DEMO, str(demo_dir)])
        tmux.wait_for("RUNNING", "telemetry", "checkpoints", timeout=90)
        tmux.keys("?")
        tmux.wait_for("the run goes on (the demo only attached to it)", timeout=20)
        tmux.keys("Escape")
        tmux.wait_for("RUNNING", timeout=20)
        tmux.keys("q")
        screen = tmux.wait_for("already going. Stop it? [y/N]", timeout=20)
        assert f"a daemon already supervises this run (pid {daemon.pid})" in screen
        tmux.keys("Enter")
        screen = tmux.wait_for("the run directory is kept for inspection", timeout=30)
        assert "the run goes on; watch it with `trainwarden tui" in screen
        assert daemon.alive
        assert daemon.status()["state"] in ("running", "starting", "backoff", "stopping")
    finally:
        tmux.close()
        daemon.cleanup()


def test_no_terminal_means_the_default_without_a_prompt():
    out = io.StringIO()
    assert ask_to_stop(io.StringIO("n\n"), out) is True
    assert "[Y/n]" not in out.getvalue()
    assert "stopping the demo's run (the default)" in out.getvalue()
    out = io.StringIO()
    assert ask_to_stop(io.StringIO("y\n"), out, own=False) is False
    assert "[y/N]" not in out.getvalue()
    assert "leaving the run going (the default)" in out.getvalue()
