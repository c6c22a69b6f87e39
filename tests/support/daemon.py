"""The daemon driver: `trainwarden daemon RUN` in the foreground, as systemd runs it, for
the unit tests, the chaos soak and the benchmarks alike.

One `DaemonProcess` stands for one run's daemon across restarts: `start` spawns it (again),
`kill` SIGKILLs it alone (its trainer, in its own session, lives on), `stop` asks it to end
with SIGTERM, and `cleanup` leaves nothing of the run alive (the daemon and every trainer
it was seen or recorded to start, each checked with `belongs_to_run` first).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.support.procs import belongs_to_run, kill_quietly
from tests.support.runs import PYTHON, started_trainer_pids, trainer_pid
from tests.support.wait import WaitTimeout, poll, wait_for
from trainwarden.supervisor.errors import CommandRefused, DaemonNotRunning, ProtocolError
from trainwarden.supervisor.inputs.proctree import marked_processes
from trainwarden.supervisor.protocol import Client

DAEMON = [PYTHON, "-m", "trainwarden.supervisor", "daemon"]
NO_ANSWER = (DaemonNotRunning, ProtocolError, OSError)
"""What a request raises while no daemon listens (not yet, or no longer)."""


class DaemonProcess:
    """One run's daemon. `env` is laid over this process's environment; `wrap` is argv put
    in front of the daemon's (`nsenter -t PID -m --`, say); `stderr_path` collects its
    stdout and stderr (appended across restarts); `cwd` is where it starts."""

    def __init__(
        self,
        run_dir: Path,
        env: dict[str, str] | None = None,
        *,
        wrap: Sequence[str] = (),
        stderr_path: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.socket = run_dir / ".trainwarden" / "control.sock"
        self.stderr_path = stderr_path or run_dir / "daemon-test.stderr"
        self.env = {**os.environ, **(env or {})}
        self.wrap = list(wrap)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_t = 0.0
        """time.monotonic() just before the latest spawn."""
        self.trainer_pids: set[int] = set()

    # ------------------------------------------------------------------ the process

    def start(self, wait: bool = True) -> DaemonProcess:
        self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
        self.started_t = time.monotonic()
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [*self.wrap, *DAEMON, str(self.run_dir)],
                stdout=err,
                stderr=err,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        if wait:
            self.wait_ready()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """Spawned and not exited (as far as its parent, this process, knows)."""
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.05) -> float:
        """time.monotonic() of the first answered `hello`; AssertionError if it exits first."""

        def answers() -> float | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.stderr()}")
            try:
                self.request("hello", timeout=2.0)
            except (*NO_ANSWER, CommandRefused):
                return None
            return time.monotonic()

        try:
            answered: float = wait_for(answers, timeout, interval, what="the daemon's socket")
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}: {self.stderr()}") from None
        return answered

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> int | None:
        """SIGKILL the daemon alone (its trainer lives on); its exit status, None if it was
        never started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait(10)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM (the daemon stops its trainer, then exits); after `grace` s, cleanup()."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        self.cleanup()

    def cleanup(self) -> None:
        """Kill the daemon and every trainer of the run it was seen or recorded to start."""
        self.kill()
        for pid in self.known_trainer_pids():
            # Only the run's own: a pid may have been reused since it was recorded.
            if belongs_to_run(pid, self.run_dir):
                kill_quietly(pid)
        # A fork of the daemon that had not yet exec'd its trainer when the daemon died
        # still runs the daemon's command line, with no marker yet: wait for its exec.
        poll(lambda: not self._pre_exec_forks(), 5.0)
        # And whatever carries a start marker of this run: a trainer forked just before the
        # daemon was killed has no record yet, nor has a helper it started.
        for pid in marked_processes(str(self.run_dir.resolve())):
            kill_quietly(pid, group=False)

    def _pre_exec_forks(self) -> list[int]:
        """Processes still running this daemon's command line after it was killed (the
        daemon's own, past any wrapper it was started through)."""
        argv = "\0".join([*DAEMON, str(self.run_dir)]).encode() + b"\0"
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            with contextlib.suppress(OSError), open(f"/proc/{name}/cmdline", "rb") as file:
                if file.read() == argv:
                    found.append(int(name))
        return found

    def known_trainer_pids(self) -> set[int]:
        pid = trainer_pid(self.run_dir)
        if pid:
            self.trainer_pids.add(pid)
        self.trainer_pids.update(started_trainer_pids(self.run_dir))
        return set(self.trainer_pids)

    def stderr(self, limit: int = 4000) -> str:
        """The last `limit` characters the daemon wrote to stdout and stderr."""
        try:
            return self.stderr_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    # ------------------------------------------------------------------ talking to it

    def client(self, timeout: float | None = 30.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def request(self, cmd: str, timeout: float | None = 60.0, **args: Any) -> Any:
        """The command's result; a refusal raises CommandRefused, no daemon DaemonNotRunning."""
        with self.client(timeout) as c:
            return c.request(cmd, **args)

    def ask(self, cmd: str, timeout: float = 10.0, **args: Any) -> Any:
        """request(), or None when no daemon answers right now (it is being killed, say)."""
        try:
            return self.request(cmd, timeout, **args)
        except NO_ANSWER:
            return None

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("status")
        if result.get("trainer_pid"):
            self.trainer_pids.add(result["trainer_pid"])
        return result

    def wait_state(self, *states: str, timeout: float = 120.0) -> dict[str, Any]:
        return wait_for(
            lambda: (s := self.status())["state"] in states and s,
            timeout,
            0.1,
            what=f"state in {states}",
        )


@contextlib.contextmanager
def running_daemon(run_dir: Path, env: dict[str, str] | None = None) -> Iterator[DaemonProcess]:
    """A started daemon (answering on its socket) for the block; cleaned up after it."""
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.cleanup()


def refused_start(run_dir: Path, timeout: float = 120.0) -> str:
    """Start a daemon on `run_dir` that must refuse its configuration: exit 2 with one line
    on stderr, no traceback and no trainer started (no run log). Returns that line."""
    done = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "daemon", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 2, f"expected exit 2, got {done.returncode}: {done.stderr}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (run_dir / "training.log").exists(), "a trainer was started"
    return lines[0]
