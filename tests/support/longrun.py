"""Scaffolding for long-run measurements (tests and bench): a trainer that logs many
steps quickly, and a daemon whose loss cache is rebuilt more often than by default."""

from __future__ import annotations

from tests.support.runs import PYTHON

FAST_TRAINER = """
import sys, time
steps, block = int(sys.argv[1]), int(sys.argv[2])
for lo in range(1, steps + 1, block):
    hi = min(lo + block, steps + 1)
    sys.stdout.write("".join(f"step: {s}, loss: {2.0 + 1.0 / s:.6f}, dt: 0.01\\n" for s in range(lo, hi)))
    sys.stdout.flush()
    time.sleep(0.1)
time.sleep(3600)
"""

SMALL_REFRESH = """
import runpy, sys
from trainwarden.supervisor.shell import run_history
run_history.CACHE_REFRESH_ROWS = int(sys.argv[1])
sys.argv = ["trainwarden", *sys.argv[5:]]
runpy.run_module("trainwarden.supervisor", run_name="__main__", alter_sys=True)
"""


def fast_trainer_argv(steps: int, per_second: int = 20_000) -> list[str]:
    """A trainer that prints `steps` step lines, `per_second` at most (a burst as fast as
    it can write would measure the log follower's backlog, not the history), then waits
    to be stopped."""
    return [PYTHON, "-c", FAST_TRAINER, str(steps), str(max(per_second // 10, 1))]


def small_refresh_wrap(rows: int) -> list[str]:
    """DaemonProcess `wrap`: the daemon with run_history.CACHE_REFRESH_ROWS set to `rows` (the
    daemon's own argv follows it)."""
    return [PYTHON, "-c", SMALL_REFRESH, str(rows)]
