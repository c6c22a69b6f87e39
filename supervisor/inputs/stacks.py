"""A trainer's stacks, read from outside: py-spy's dump of every Python thread of each
process, and the kernel's wait channel and stack of each thread where readable (native
code stuck in a driver call shows there, not in Python)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TOP_FRAMES = 5
"""Frames of the main thread a dump's summary names (innermost first)."""
MAX_TEXT_BYTES = 256 * 1024
"""One process's py-spy text kept at most (a process with thousands of threads)."""
_THREAD = re.compile(r"^Thread (\d+) ")


@dataclass(frozen=True)
class ProcessStacks:
    pid: int
    python: str
    """py-spy's text for the process ("" when it could not attach)."""
    error: str | None
    """Why py-spy could not dump it (None: it did)."""
    kernel: str
    """Each thread's wait channel and kernel stack, as far as readable."""

    @property
    def main_frames(self) -> list[str]:
        """The main thread's frames, innermost first ("function (file:line)")."""
        frames: list[str] = []
        inside = False
        for line in self.python.splitlines():
            thread = _THREAD.match(line)
            if thread:
                if inside:
                    break
                inside = int(thread.group(1)) == self.pid
            elif inside and line.startswith("    ") and line.strip():
                frames.append(line.strip())
        return frames


@dataclass(frozen=True)
class StackDump:
    processes: tuple[ProcessStacks, ...]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def top_frames(self) -> list[str]:
        """The innermost frames of the trainer's main thread: the main process's (its data
        loader workers and other children idle meanwhile), unless that is a launcher only
        waiting on its workers (torchrun's agent): then the first worker's. Failing those,
        the first process py-spy could read."""
        readable = [frames for p in self.processes if (frames := p.main_frames)]
        workers = [frames for frames in readable if not _launcher(frames)]
        return (workers or readable or [[]])[0][:TOP_FRAMES]

    @property
    def error(self) -> str | None:
        """Why py-spy dumped no process at all (None: it dumped at least one)."""
        if any(p.error is None for p in self.processes):
            return None
        errors = sorted({p.error for p in self.processes if p.error})
        return "; ".join(errors) or "no process to dump"


LAUNCHER_FILES = ("torch/distributed/elastic/", "torch/distributed/run.py")
"""Where a launcher's main thread waits on its workers (torchrun's elastic agent)."""


def _launcher(frames: list[str]) -> bool:
    return any(place in frame for frame in frames for place in LAUNCHER_FILES)


def find_py_spy(configured: str | None) -> str | None:
    """The py-spy binary: the configured one, else the one beside this Python, else on PATH."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    beside = Path(sys.executable).parent / "py-spy"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def capture(pids: list[int], py_spy: str | None, timeout_s: float, missing: str) -> StackDump:
    """Every process's stacks, py-spy run on all of them at once and given `timeout_s` in
    all; `missing` says why there is no py-spy when `py_spy` is None."""
    deadline = time.monotonic() + timeout_s
    python: dict[int, tuple[str, str | None]]
    if py_spy is None:
        python = {pid: ("", missing) for pid in pids}
    else:
        python = _py_spy_all(py_spy, pids, deadline)
    return StackDump(
        tuple(ProcessStacks(pid, *python[pid], kernel=kernel_stacks(pid)) for pid in pids)
    )


def _py_spy_all(py_spy: str, pids: list[int], deadline: float) -> dict[int, tuple[str, str | None]]:
    env = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
    results: dict[int, tuple[str, str | None]] = {}
    with contextlib.ExitStack() as files:
        running: list[tuple[int, subprocess.Popen[bytes], IO[bytes]]] = []
        for pid in pids:
            # To a file, not a pipe: a process with many threads must not block on a full
            # pipe while another one is being waited for.
            out: IO[bytes] = files.enter_context(tempfile.TemporaryFile())
            try:
                proc = subprocess.Popen(
                    [py_spy, "dump", "--pid", str(pid)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,  # its group is ended with it on a timeout
                )
            except OSError as exc:
                results[pid] = ("", f"cannot run {py_spy}: {exc.strerror or exc}")
                continue
            running.append((pid, proc, out))
        for pid, proc, out in running:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                results[pid] = ("", "py-spy did not finish in time")
                continue
            out.seek(0)
            text = out.read(MAX_TEXT_BYTES).decode(errors="replace")
            results[pid] = (text, None) if proc.returncode == 0 else ("", _py_spy_error(text))
    return results


PTRACE_DENIED = (
    "py-spy: permission denied attaching to the process (the daemon's user may not ptrace"
    " it: run the daemon as the trainer's user with kernel.yama.ptrace_scope 0 or 1, or give"
    " py-spy CAP_SYS_PTRACE)"
)


def _py_spy_error(text: str) -> str:
    """py-spy's own reason, one line: its `Error:` line and the first cause under it (a
    denied attach said in the daemon's terms, not as py-spy's advice to rerun it by sudo)."""
    if "permission denied" in text.lower():
        return PTRACE_DENIED
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("Error:")), None)
    if error is None:
        return lines[0][:300] if lines else "py-spy failed without a message"
    causes = lines[lines.index(error) + 1 :]
    cause = next((c for c in causes if re.match(r"^\d+: ", c)), None)
    message = error.removeprefix("Error:").strip()
    return f"py-spy: {message}" + (f" ({cause.split(': ', 1)[1]})" if cause else "")


def kernel_stacks(pid: int) -> str:
    """Each thread's wait channel and kernel stack, as far as /proc lets us read them."""
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError as exc:
        return f"(no /proc/{pid}/task: {exc.strerror})"
    lines: list[str] = []
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        wchan = _read(f"{base}/wchan") or "?"
        lines.append(f"task {tid} wchan {wchan}")
        stack = _read(f"{base}/stack")
        lines += [f"    {frame}" for frame in (stack or "").splitlines()]
    return "\n".join(lines)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(64 * 1024).decode(errors="replace").strip()
    except OSError:
        return None  # gone, or not ours to read (kernel stacks need CAP_SYS_ADMIN)
