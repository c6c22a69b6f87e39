"""The ETA a user reads in a real 80x24 terminal after the trainer stood stopped for a
minute: the rate of the new start only, so the ETA is the steps left at the pace the
trainer keeps now (the stopped minute is not training time). Slow tier: the stop is 60 s."""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.support import running_daemon, scripted_run, wait_for
from tests.tui.terminal import Tmux

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

TOTAL = 2_000_000
STOPPED_S = 60.0
ETA = re.compile(r"ETA (?:(\d+)d (\d+)h|(\d+)h (\d+)m|(\d+)m (\d+)s|(\d+)s)")


def eta_seconds(screen: str) -> float | None:
    """The header's ETA in seconds, None when it shows none."""
    found = ETA.search(screen.splitlines()[0] if screen else "")
    if found is None:
        return None
    d, dh, h, hm, m, ms, s = (int(g) if g else 0 for g in found.groups())
    return d * 86400 + dh * 3600 + h * 3600 + hm * 60 + m * 60 + ms + s


def test_after_a_minute_stopped_the_eta_is_the_new_starts_pace(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        *("--steps", str(TOTAL), "--save-every", "200", "--dt", "0.02", "--usr1", "save"),
        trainer={"total_steps": TOTAL},
    )
    tmux = Tmux()
    with running_daemon(run_dir) as daemon:
        try:
            daemon.wait_state("running", timeout=90)
            tmux.start([sys.executable, "-m", "trainwarden.supervisor", "tui", str(run_dir)])
            wait_for(lambda: eta_seconds(tmux.screen()), 60, 0.2, what="an ETA")
            daemon.request("stop", timeout=60)
            daemon.wait_state("stopped", timeout=60)
            time.sleep(STOPPED_S)
            daemon.request("start")
            daemon.wait_state("running", timeout=60)
            # The pace the trainer keeps now, measured from outside over 10 s of stepping.
            wait_for(lambda: (daemon.status().get("steps_per_min") or 0) > 0, 60, what="a step")
            first = daemon.status()
            t0 = time.monotonic()
            time.sleep(10.0)
            second = daemon.status()
            rate = (second["step"] - first["step"]) / (time.monotonic() - t0)
            assert rate > 0, (first, second)
            expected = (TOTAL - second["step"]) / rate
            eta = wait_for(lambda: eta_seconds(tmux.screen()), 30, 0.2, what="an ETA again")
            # Within 20 % of what is left at today's pace (before the fix: the stopped minute
            # counted as training time, and the ETA was many times this).
            assert abs(eta - expected) <= 0.2 * expected, (eta, expected, tmux.screen())
            assert abs(second["eta_s"] - expected) <= 0.2 * expected, (second, expected)
        finally:
            tmux.close()
