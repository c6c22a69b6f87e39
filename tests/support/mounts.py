"""Small tmpfs mounts a test makes (root only), unmounted when the test ends."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class Mounts:
    """tmpfs mounts made by one test, unmounted (newest first) when it ends."""

    def __init__(self) -> None:
        self.points: list[Path] = []

    def tmpfs(self, point: Path, size: str) -> Path:
        point.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs for the full-disk test: {done.stderr.strip()}")
        self.points.append(point)
        return point

    def unmount_all(self) -> None:
        for point in reversed(self.points):
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.fixture
def mounts() -> Iterator[Mounts]:
    if os.geteuid() != 0:
        pytest.skip("not root: cannot mount a tmpfs to fill")
    made = Mounts()
    try:
        yield made
    finally:
        made.unmount_all()
