"""torch-pt's verifier worker: one long-lived `python -I -c PROBE` that loads the
checkpoints sent to it with torch, one at a time, so the daemon never imports torch nor
unpickles anything (see torch_pt, whose docstring says what the worker is asked and how
a check that hangs, or a worker that dies, is told).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

PROBE_MARK = "TRAINWARDEN_PROBE "
PROBE_MARK_BYTES = PROBE_MARK.encode()
CLOSE_GRACE_S = 1.0
"""How long close() lets the worker exit on its own after its stdin is closed."""

# The verifier's worker: `python -I -c PROBE`, no site-packages of the user, no current
# directory on the path. It imports torch once, then answers one request per line of its
# stdin ({"path": ..., "step_keys": [...]}) with one MARK line on its stdout, and ends when
# its stdin closes (also when the daemon dies: the pipe's write end goes with it).
PROBE = r"""
import gc, json, os, sys
MARK = b"TRAINWARDEN_PROBE "
# Answers go to a private copy of stdout; anything else written to fd 1 goes to stderr.
answers = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)

def say(**fields):
    answers.write(MARK + json.dumps(fields).encode() + b"\n")

def reason(exc):
    lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("Weights only load failed") and len(lines) > 1:
        return "weights_only refused it: " + lines[1]
    return lines[0]

try:
    import torch
    missing = None
    # torch's objects are never garbage: left out of every collection, one costs ~0 ms.
    gc.freeze()
except Exception as exc:
    missing = ("cannot import torch in the probe interpreter " + sys.executable + " ("
               + reason(exc) + "): install it with pip install 'trainwarden[trainer]'")

def check(path, step_keys):
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap can only be used" not in str(exc):
            raise
        obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict):
        return {"error": "top-level object is a " + type(obj).__name__ + ", expected a dict"}
    step = None
    for key in step_keys:
        if key in obj:
            value = obj[key]
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, int):
                return {"error": key + " is " + repr(value)[:60] + ", expected an integer"}
            step = value
            break
    n_params = None
    model = obj.get("model")
    if not isinstance(model, dict):
        model = obj.get("state_dict")  # a Lightning checkpoint's weights
    if isinstance(model, dict):
        tensors = [v for v in model.values() if isinstance(v, torch.Tensor)]
        if tensors:
            n_params = sum(t.numel() for t in tensors)
    return {"keys": sorted(str(k) for k in obj), "step": step, "n_params": n_params}

for line in sys.stdin.buffer:
    if missing is not None:
        say(error=missing)
        break
    try:
        request = json.loads(line)
        say(**check(request["path"], request["step_keys"]))
    except Exception as exc:
        say(error=reason(exc))
    # Unmap the file now: a checkpoint deleted by retention must not stay mapped here.
    gc.collect()
"""


class _Died(Exception):
    """The worker ended without answering: `reason` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProbeWorker:
    """One long-lived `python -I -c PROBE` that checks paths sent to it, one at a time.

    Started on the first check; killed (SIGKILL) when a check outlives its timeout, and
    started afresh by the next check then, or when it was found dead. Thread-safe: checks
    are serialised. The worker shares nothing with the daemon but two pipes and a file
    that catches its stderr.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._python: str | None = None
        self._stderr: IO[bytes] | None = None
        self._pending = b""

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def check(
        self, path: Path, *, python: str, step_keys: list[str], timeout_s: float
    ) -> dict[str, Any]:
        request = json.dumps({"path": str(path), "step_keys": step_keys}).encode() + b"\n"
        with self._lock:
            deadline = time.monotonic() + timeout_s
            for attempt in range(2):
                try:
                    fresh = self._start(python)
                except OSError as exc:
                    return {"error": f"cannot start the probe interpreter {python}: {exc.strerror}"}
                try:
                    return self._exchange(request, deadline)
                except TimeoutError:
                    self._end(kill=True)
                    return {"error": f"the probe did not finish within {timeout_s:g} s (killed)"}
                except _Died as died:
                    # A worker that had served before may have been killed from outside
                    # while idle: the request deserves one fresh worker before a verdict.
                    if fresh or attempt:
                        return {"error": died.reason}
            raise AssertionError("unreachable")

    def close(self) -> None:
        """End the worker: its stdin closed, a moment to exit, then SIGKILL.

        With a check in flight the worker is only killed: that check sees the death,
        cleans up and gets its verdict from a fresh worker, which ends with its stdin.
        """
        proc = self._proc
        if self._lock.acquire(blocking=False):
            try:
                self._end(kill=False)
            finally:
                self._lock.release()
        elif proc is not None and proc.poll() is None:
            proc.kill()

    def _start(self, python: str) -> bool:
        """Have a live worker for `python`; True when it was started just now."""
        proc = self._proc
        if proc is not None and proc.poll() is None and self._python == python:
            return False
        self._end(kill=True)
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker)
        try:
            self._proc = subprocess.Popen(
                [python, "-I", "-c", PROBE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd="/",
                env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
                start_new_session=True,
            )
        except OSError:
            stderr.close()
            raise
        self._python, self._stderr, self._pending = python, stderr, b""
        return True

    def _exchange(self, request: bytes, deadline: float) -> dict[str, Any]:
        proc, stderr = self._proc, self._stderr
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        assert stderr is not None
        # The stderr file keeps only this request's messages (the offset is shared).
        os.ftruncate(stderr.fileno(), 0)
        os.lseek(stderr.fileno(), 0, os.SEEK_SET)
        try:
            proc.stdin.write(request)
            proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it died: its stdout says so below
        fd = proc.stdout.fileno()
        while True:
            line, newline, rest = self._pending.partition(b"\n")
            if newline:
                self._pending = rest
                if not line.startswith(PROBE_MARK_BYTES):
                    continue
                try:
                    report = json.loads(line[len(PROBE_MARK_BYTES) :])
                except ValueError:
                    report = None
                if not isinstance(report, dict):
                    self._end(kill=True)
                    raise _Died("the probe answered something unreadable")
                return report
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _Died(self._death(max(0.1, deadline - time.monotonic())))
            self._pending += chunk

    def _death(self, wait_s: float) -> str:
        """Why the worker closed its stdout, once it has exited (killed if it lingers)."""
        proc, stderr = self._proc, self._stderr
        assert proc is not None and stderr is not None
        try:
            code = proc.wait(timeout=min(wait_s, 5.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        size = os.fstat(stderr.fileno()).st_size
        tail = os.pread(stderr.fileno(), 4096, max(0, size - 4096)).decode(errors="replace")
        self._end(kill=True)
        if code < 0:
            return f"the probe died of signal {-code}"
        lines = tail.strip().splitlines()
        return f"the probe exited {code}: {lines[-1] if lines else 'no output'}"

    def _end(self, *, kill: bool) -> None:
        proc, stderr = self._proc, self._stderr
        self._proc = self._stderr = None
        if proc is not None:
            _end_process(proc, grace_s=0.0 if kill else CLOSE_GRACE_S)
        if stderr is not None:
            stderr.close()


def _end_process(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    if grace_s:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
