"""Helper programs the daemon runs (an alert's command, an alert's send): each in its own
process group, with a total deadline after which the whole group is killed, its input
written without blocking, and only the tail of its output kept, so a helper that hangs,
trickles, floods its output or leaves children behind costs the daemon neither time nor
memory beyond the bounds given here."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

KEEP_BYTES = 4096
"""Of a helper's output, the last this many bytes are kept."""
READ_BYTES = 65536
AFTER_EXIT_S = 0.2
"""How long output is still read after the helper exited (a child it left holding the pipe
open must not hold the daemon)."""


@dataclass(frozen=True)
class Ran:
    returncode: int | None
    """None: still running at the deadline (the group was killed)."""
    tail: bytes
    """The last KEEP_BYTES (or `keep`) of what it wrote to stderr (and stdout if kept)."""


class Tail:
    """The last `keep` bytes of a stream read in pieces."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.keep:
            del self.data[: len(self.data) - self.keep]


def run_helper(
    argv: Sequence[str],
    *,
    deadline_s: float,
    stdin: bytes = b"",
    cwd: Path | None = None,
    keep: int = KEEP_BYTES,
    with_stdout: bool = False,
    stop: threading.Event | None = None,
) -> Ran:
    """Run `argv` with `stdin` for at most `deadline_s` s (or until `stop` is set), then
    kill its process group; keep the last `keep` bytes of its stderr (with its stdout when
    `with_stdout`, else that is discarded). OSError when it cannot be started."""
    deadline = time.monotonic() + deadline_s
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE if with_stdout else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if with_stdout else subprocess.PIPE,
        cwd=cwd,
        start_new_session=True,
    )
    out = proc.stdout if with_stdout else proc.stderr
    assert proc.stdin is not None and out is not None
    tail = Tail(keep)
    ended = False
    try:
        _exchange(proc, out, stdin, tail, deadline, stop)
        if stop is None or not stop.is_set():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        ended = proc.poll() is not None
    finally:
        if not ended:
            _kill_group(proc.pid)
        proc.wait()
        for pipe in (proc.stdin, out):
            with contextlib.suppress(OSError):
                pipe.close()
    return Ran(proc.returncode if ended else None, bytes(tail.data))


def _exchange(
    proc: subprocess.Popen[bytes],
    output: IO[bytes],
    data: bytes,
    tail: Tail,
    deadline: float,
    stop: threading.Event | None,
) -> None:
    """Write `data` to the helper and read its `output` until that ends, AFTER_EXIT_S
    after the helper exited, at the deadline, or at `stop`."""
    assert proc.stdin is not None
    out, into = output.fileno(), proc.stdin.fileno()
    os.set_blocking(out, False)
    os.set_blocking(into, False)
    pending = memoryview(data)
    with selectors.DefaultSelector() as sel:
        sel.register(out, selectors.EVENT_READ)
        if pending:
            sel.register(into, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        exited_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if now >= deadline or (stop is not None and stop.is_set()):
                return
            if exited_at is not None and now - exited_at >= AFTER_EXIT_S:
                return
            for key, _ in sel.select(min(0.05, deadline - now)):
                if key.fd == into:
                    try:
                        pending = pending[os.write(into, pending) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # it closed its stdin (BrokenPipe): it does not read it
                        pending = pending[len(pending) :]
                    if not pending:
                        sel.unregister(into)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(out, READ_BYTES)
                except BlockingIOError:
                    continue
                if chunk:
                    tail.add(chunk)
                else:
                    sel.unregister(out)


def _kill_group(pid: int) -> None:
    """SIGKILL the helper's process group: the helper and whatever it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
