"""CPU contention on demand: busy loops beside a test whose point is behaviour under load
(the control-plane flood, NaN -> kill, the chaos soak), and beside nothing else.

`busy_loops()` keeps one spinning interpreter per core for the block and stops each by its
pid after it. The `loaded` marker (tests/conftest.py) wraps a test in it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

SPIN = [sys.executable, "-c", "while True: pass"]


def cores() -> int:
    """The cores this process may run on (what the busy loops compete for)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def busy_loops(count: int | None = None) -> Iterator[list[int]]:
    """`count` (default: one per core) busy loops for the block; their pids."""
    loops = [subprocess.Popen(SPIN) for _ in range(cores() if count is None else count)]
    try:
        yield [loop.pid for loop in loops]
    finally:
        for loop in loops:
            loop.kill()
        for loop in loops:
            loop.wait(10)
