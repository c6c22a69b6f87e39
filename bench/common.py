"""What every comparison needs: a scratch directory whose processes die with it, the
child programs' event files, a death watcher, latency statistics and the result shape.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from tests.support import DaemonProcess, belongs_to_run

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
PYTHON = sys.executable


def program(name: str, *args: str | Path) -> list[str]:
    """argv for one of bench/programs/*.py: standard library only, so `python -S` (no
    site-packages scan) keeps the interpreter's start-up small and equal for every peer."""
    return [PYTHON, "-S", str(PROGRAMS / name), *map(str, args)]


# ----------------------------------------------------------------------------- results


@dataclass
class Target:
    """One goal from DESIGN.md section 8 or the issue, and whether this run met it."""

    goal: str
    measured: str
    met: bool | None
    """None: not measured in this run (`why` says why)."""
    why: str = ""


@dataclass
class Section:
    """One comparison's part of RESULTS.md and results.json."""

    key: str
    title: str
    intro: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    """PNG file names, relative to the output directory."""
    targets: list[Target] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    extra_markdown: str = ""
    seconds: float = 0.0


@dataclass
class Context:
    quick: bool
    out: Path
    work: Workspace
    peers: Any = None
    """bench.peers.Peers: the tools we compare against, installed once per run."""


# ----------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of the values; nan when there are none.

    Nearest rank, not interpolation: with fewer than 100 samples p99 is the largest one,
    which is what a user waiting on the slowest restart would see."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(ms: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms) if ms else math.nan,
        "mean_ms": sum(ms) / len(ms) if ms else math.nan,
    }


def fmt_ms(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_ratio(value: float | None) -> str:
    if value is None or math.isnan(value) or math.isinf(value):
        return "-"
    return f"{value:,.0f}x" if value >= 10 else f"{value:.2f}x"


# ----------------------------------------------------------------------------- event files


def read_events(path: Path) -> list[tuple[str, int, float, list[str]]]:
    """(kind, pid, monotonic t, extra fields) for each complete line the programs wrote."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            with contextlib.suppress(ValueError):
                rows.append((parts[0], int(parts[1]), float(parts[2]), parts[3:]))
    return rows


class DeathWatch:
    """Notices a process's end from outside, without being its parent: a pidfd becomes
    readable the moment the process exits. Open it before provoking the death."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self.fd = os.pidfd_open(pid)

    def wait(self, timeout: float) -> float | None:
        """monotonic time of the death, or None if it did not die within timeout s."""
        try:
            if self.fd is not None:
                poller = select.poll()
                poller.register(self.fd, select.POLLIN)
                if poller.poll(timeout * 1000):
                    return time.monotonic()
                return None
            # No pidfd (kernel < 5.3): look at the process table every millisecond.
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not _alive(self.pid):
                    return time.monotonic()
                time.sleep(0.001)
            return None
        finally:
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads) from /proc/PID/stat."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def _stat_cpu_seconds(stat: Path) -> float:
    with open(stat) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """utime + stime per thread (tid -> s) from /proc/PID/task/TID/stat."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out[int(task.name)] = _stat_cpu_seconds(task / "stat")
    return out


def measure(pid: int, log: Path, window: float) -> dict[str, float]:
    """CPU (all threads, and the main thread alone) and RSS of `pid` over `window` s."""
    threads0 = thread_cpu_seconds(pid)
    cpu0, lines0, t0 = cpu_seconds(pid), count_lines(log), time.monotonic()
    time.sleep(window)
    cpu1, lines1, t1 = cpu_seconds(pid), count_lines(log), time.monotonic()
    threads1 = thread_cpu_seconds(pid)
    elapsed, cpu, lines = t1 - t0, cpu1 - cpu0, lines1 - lines0
    main = threads1.get(pid, 0.0) - threads0.get(pid, 0.0)
    return {
        "window_s": elapsed,
        "cpu_s": cpu,
        "main_thread_cpu_s": main,
        # Thread and process totals are separate 10 ms tick counts: never below zero.
        "other_threads_cpu_s": max(0.0, cpu - main),
        "core_pct": 100 * cpu / elapsed,
        "lines": lines,
        "lines_per_s": lines / elapsed,
        "cpu_us_per_line": 1e6 * cpu / lines if lines else math.nan,
        "rss_mb": rss_mb(pid),
        "peak_rss_mb": rss_mb(pid, "VmHWM"),
    }


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    """VmRSS (or VmHWM, the peak) from /proc/PID/status, in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    return math.nan


# ----------------------------------------------------------------------------- workspace


class Workspace:
    """A temporary directory and every process started for it.

    Processes start in their own sessions and are tracked; stop() and close() end them
    and what they started (by pid, and only processes of this directory by tests.support's
    belongs_to_run, so never anybody else's). close() then removes the directory.
    """

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="trainwarden-bench-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.daemons: list[DaemonProcess] = []
        self.known_pids: set[int] = set()

    def daemon(self, run_dir: Path) -> DaemonProcess:
        """trainwarden's daemon for run_dir (not started), ended by close() at the latest."""
        daemon = DaemonProcess(run_dir, stderr_path=run_dir / "daemon.stderr", cwd=REPO)
        self.daemons.append(daemon)
        return daemon

    def dir(self, *parts: str) -> Path:
        target = self.root.joinpath(*parts)
        target.mkdir(parents=True, exist_ok=True)
        return target

    def popen(
        self,
        argv: Sequence[str | Path],
        *,
        cwd: Path,
        stdout: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start argv in a new session; stdout and stderr appended to a file if given."""
        handle = open(stdout, "ab") if stdout is not None else None  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                [str(a) for a in argv],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=handle if handle is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if handle is not None else subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            if handle is not None:
                handle.close()  # the child holds its own copy
        self.procs.append(proc)
        return proc

    def descendants(self, proc: subprocess.Popen[bytes]) -> set[int]:
        """proc's live descendants, remembered for close() (they may outlive proc)."""
        found = self._descendants(proc)
        self.known_pids.update(found)
        return found

    def stop(
        self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 10.0
    ) -> None:
        """Ask proc to end (a supervisor stops what it supervises), then SIGKILL whatever
        of its tree is left after grace seconds."""
        descendants = self._descendants(proc)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        self._kill_tree(proc, descendants)

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.cleanup()
        for proc in self.procs:
            self._kill_tree(proc)
        self.kill_ours(self.known_pids)
        shutil.rmtree(self.root, ignore_errors=True)

    def kill_ours(self, pids: set[int]) -> None:
        """SIGKILL each of pids that is still one of this workspace's processes."""
        for pid in pids:
            if belongs_to_run(pid, self.root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    @staticmethod
    def _descendants(proc: subprocess.Popen[bytes]) -> set[int]:
        if proc.poll() is not None:
            return set()
        try:
            return {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def _kill_tree(self, proc: subprocess.Popen[bytes], known: set[int] | None = None) -> None:
        doomed = (known or set()) | self._descendants(proc)
        if proc.poll() is None:
            # Not reaped yet, so the pid (and the group it leads) is still ours.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.kill_ours(doomed)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


# ----------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    model = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    with contextlib.suppress(Exception):
        info["torch"] = metadata.version("torch")
    info["nvidia_gpu"] = Path("/dev/nvidia0").exists()
    return info
