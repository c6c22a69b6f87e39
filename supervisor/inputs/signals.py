"""Which of the signals the daemon sends a trainer would be caught rather than kill it.

The kernel lists a process's caught signals as the `SigCgt` bitmask of /proc/PID/status
(signal N caught when bit N-1 is set). SIGTERM and SIGUSR1 both kill by default, so a
trainer that catches neither is killed by a save request and loses its steps on a stop.
"""

from __future__ import annotations

import signal

import psutil

ASKED = {"SIGTERM": signal.SIGTERM, "SIGUSR1": signal.SIGUSR1}
"""The signals that ask the trainer something (SIGKILL asks nothing)."""


def caught(pid: int) -> frozenset[str] | None:
    """The ASKED signals `pid` catches; None when it cannot be read (gone, no /proc)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    mask = int(line.split()[1], 16)
                    return frozenset(
                        name for name, num in ASKED.items() if mask >> (int(num) - 1) & 1
                    )
    except (OSError, ValueError, IndexError):
        return None
    return None


def handled(pid: int, target: str) -> frozenset[str] | None:
    """The ASKED signals the trainer's signal target catches (None: unknown).

    "group" and "main": the main process must catch a signal (the rest of its group are
    its helpers, whose fate it owns). "children" (torchrun and other launchers): every
    worker, the main process's direct children, must catch it; none yet: unknown.
    """
    if target != "children":
        return caught(pid)
    try:
        workers = [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return None
    if not workers:
        return None
    found = [caught(w) for w in workers]
    if any(f is None for f in found):
        return None
    return frozenset.intersection(*(f for f in found if f is not None))
