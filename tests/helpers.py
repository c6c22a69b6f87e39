"""Shared test helpers: run directories for the reference trainer and a real daemon process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from trainwarden.supervisor.errors import CommandRefused, DaemonNotRunning, ProtocolError
from trainwarden.supervisor.protocol import Client
from trainwarden.supervisor.store.journal import read_records

PYTHON = sys.executable


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return orjson.dumps(value).decode()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return repr(value)


def write_config(run_dir: Path, tables: dict[str, dict[str, Any]]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        lines.append("")
    path = run_dir / "trainwarden.toml"
    path.write_text("\n".join(lines))
    return path


def trainer_argv(steps: int, save_every: int, *extra: str, seed: int = 1337) -> list[str]:
    return [
        PYTHON,
        "-m",
        "trainwarden.trainer",
        "--run-dir",
        ".",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        str(steps),
        "--save-every",
        str(save_every),
        "--seed",
        str(seed),
        *extra,
    ]


def reference_run(
    run_dir: Path,
    steps: int = 60,
    save_every: int = 10,
    *extra: str,
    trainer: dict[str, Any] | None = None,
    restart: dict[str, Any] | None = None,
    checkpoints: dict[str, Any] | None = None,
    telemetry: dict[str, Any] | None = None,
) -> Path:
    """A run directory whose trainer is the reference trainer on CPU."""
    write_config(
        run_dir,
        {
            "run": {"name": run_dir.name},
            "trainer": {
                "command": trainer_argv(steps, save_every, *extra),
                "stop_timeout_s": 30.0,
                "total_steps": steps,
                **(trainer or {}),
            },
            "checkpoints": {"keep_last": 3, **(checkpoints or {})},
            "restart": {
                "backoff_initial_s": 0.0,
                "backoff_max_s": 1.0,
                "max_restarts_without_progress": 5,
                "stall_timeout_s": 60.0,
                **(restart or {}),
            },
            "telemetry": {"vocab_size": 256, "n_params": "auto", **(telemetry or {})},
        },
    )
    return run_dir


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def journal(run_dir: Path) -> list[dict[str, Any]]:
    return list(read_records(run_dir / ".trainwarden" / "journal.jsonl"))


def journal_kinds(run_dir: Path) -> list[str]:
    return [r["kind"] for r in journal(run_dir)]


def trainer_pid(run_dir: Path) -> int | None:
    try:
        return int(orjson.loads((run_dir / ".trainwarden" / "trainer.pid").read_bytes())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        if f.read().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def kill_quietly(pid: int | None, group: bool = True) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


def checkpoints(run_dir: Path) -> list[int]:
    out = []
    for p in (run_dir / "checkpoints").glob("step_*.bin"):
        out.append(int(p.name[5:-4]))
    return sorted(out)


class DaemonProcess:
    """`trainwarden daemon RUN` in the foreground, as systemd would run it."""

    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.stderr_path = run_dir / "daemon-test.stderr"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.trainer_pids: set[int] = set()

    def start(self, wait: bool = True) -> DaemonProcess:
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "trainwarden.supervisor", "daemon", str(self.run_dir)],
                stdout=err,
                stderr=err,
                env=self.env,
                start_new_session=True,
            )
        if wait:
            self.wait_ready()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(self, timeout: float | None = 30.0) -> Client:
        return Client(self.run_dir / ".trainwarden" / "control.sock", timeout=timeout)

    def request(self, cmd: str, timeout: float | None = 60.0, **args: Any) -> Any:
        with self.client(timeout) as c:
            return c.request(cmd, **args)

    def wait_ready(self, timeout: float = 60.0) -> None:
        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.stderr()}")
            try:
                self.request("hello", timeout=2.0)
                return True
            except (DaemonNotRunning, ProtocolError, OSError, CommandRefused):
                return False

        wait_for(answers, timeout, what="the daemon's socket")

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

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the daemon alone (its trainer, in its own session, lives on)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def cleanup(self) -> None:
        pid = trainer_pid(self.run_dir)
        if pid:
            self.trainer_pids.add(pid)
        self.trainer_pids.update(
            r["pid"] for r in journal(self.run_dir) if r.get("kind") == "trainer_started"
        )
        self.kill()
        for tp in self.trainer_pids:
            # Only our own trainers: a pid may have been reused since it was recorded.
            if belongs_to_run(tp, self.run_dir):
                kill_quietly(tp)


def belongs_to_run(pid: int | None, run_dir: Path) -> bool:
    """Whether `pid` is a process of this run: working in its directory, or started by
    its daemon (TRAINWARDEN_RUN_DIR names it). Guards every kill of a recorded pid."""
    if not pid:
        return False
    run = str(run_dir.resolve())
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = ""
    if cwd == run or cwd.startswith(run + "/"):
        return True
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"TRAINWARDEN_RUN_DIR={run}".encode() in environ


@contextlib.contextmanager
def running_daemon(run_dir: Path, env: dict[str, str] | None = None) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.cleanup()
