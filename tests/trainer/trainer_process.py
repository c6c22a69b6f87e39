"""Running the real trainer as a subprocess, and reading what it leaves behind."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support import REFERENCE_TRAINER, REPO

STEPS = 60
SAVE_EVERY = 10
COMMON_ARGS = (
    "--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--sample-every", "30",
    "--device", "cpu",
)  # fmt: skip
STEP_LINE = re.compile(r"^step: (\d+), loss: ([^,]+),")
# Slow enough that a signal sent after seeing step N lands within a step or two of N.
PACED = {"TRAINER_TEST_STEP_SLEEP_S": "0.02"}


def trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # The test process's own environment must not leak a resume or a test hook in.
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TRAINWARDEN_", "TRAINER_TEST_"))
    }
    env.update(extra or {})
    return env


def trainer_argv(run_dir: Path, *args: str) -> list[str]:
    return [*REFERENCE_TRAINER, "--run-dir", str(run_dir), *args]


def run_trainer(
    run_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        trainer_argv(run_dir, *args),
        cwd=REPO,
        env=trainer_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class LiveTrainer:
    """A trainer running in the background whose stdout is read line by line."""

    def __init__(self, run_dir: Path, args: Sequence[str], env: dict[str, str] | None) -> None:
        self.process = subprocess.Popen(
            trainer_argv(run_dir, *args),
            cwd=REPO,
            env=trainer_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []

    def read_until(self, pattern: str, timeout: float = 60) -> str:
        """Read stdout until a line starts with `pattern`; returns that line."""
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"trainer exited before {pattern!r}: {self.lines[-3:]}")
            self.lines.append(line.rstrip("\n"))
            if line.startswith(pattern):
                return line
        raise AssertionError(f"no {pattern!r} within {timeout} s")

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def finish(self, timeout: float = 60) -> int:
        stdout, _ = self.process.communicate(timeout=timeout)
        self.lines.extend(stdout.splitlines())
        return self.process.returncode

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.communicate(timeout=30)


@contextmanager
def live_trainer(
    run_dir: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[LiveTrainer]:
    trainer = LiveTrainer(run_dir, args, env)
    try:
        yield trainer
    finally:
        trainer.stop()


def step_losses(lines: str | Sequence[str]) -> dict[int, str]:
    """Logged loss per step, as printed (string compare = exact compare)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    losses = {}
    for line in lines:
        match = STEP_LINE.match(line)
        if match:
            losses[int(match.group(1))] = match.group(2)
    return losses


def checkpoint(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}.bin"


def read_bin(path: Path) -> tuple[int, int, bytes, bytes, bytes]:
    """(step, n_params, weights, m, v) with each region as raw little-endian bytes."""
    data = path.read_bytes()
    step, n_params = struct.unpack_from("<ii", data)
    region = 4 * n_params
    return (
        step,
        n_params,
        data[8 : 8 + region],
        data[8 + region : 8 + 2 * region],
        data[8 + 2 * region : 8 + 3 * region],
    )


def floats(region: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(region) // 4}f", region))
