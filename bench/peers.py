"""The supervisors people use instead of trainwarden, and trainwarden's own daemon, each
started the way its users start it.

supervisord is installed into a throwaway virtual environment inside the run's scratch
directory: its Python package is also called `supervisor`, so it must never share an
environment (or a working directory) with ours.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import PYTHON, Workspace
from tests.support.runs import make_run, merged

# ----------------------------------------------------------------------------- trainwarden


def trainwarden_config(run_dir: Path, command: list[str], **tables: dict[str, Any]) -> None:
    """A run directory supervising `command`, restarted after 5 s and never judged stalled
    within a benchmark; tables override these per key. The daemon itself is
    Workspace.daemon(run_dir), tests.support's driver."""
    defaults: dict[str, dict[str, Any]] = {
        "run": {"name": run_dir.name},
        "trainer": {"stop_timeout_s": 10.0},
        "restart": {"backoff_initial_s": 5.0, "stall_timeout_s": 600.0},
    }
    make_run(run_dir, command, **merged(defaults, tables))


# ----------------------------------------------------------------------------- torchrun


def torchrun_argv(child: list[str], max_restarts: int) -> list[str]:
    """torchrun's elastic agent, one local worker, running `child` as given (--no-python)."""
    return [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
        f"--max-restarts={max_restarts}", "--no-python", *child,
    ]  # fmt: skip


def torchrun_version() -> str:
    try:
        return f"torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        return "torch (not installed)"


# ----------------------------------------------------------------------------- supervisord


class Supervisord:
    """supervisord from PyPI in its own virtual environment under the scratch directory."""

    def __init__(self, work: Workspace) -> None:
        self.work = work
        self.venv = work.root / "supervisord-venv"
        self.bin = self.venv / "bin" / "supervisord"
        self.error: str | None = None
        self.version = ""
        self.install_s = 0.0
        self._tried = False

    def available(self) -> bool:
        if not self._tried:
            self._tried = True
            started = time.monotonic()
            self.error = self._install()
            self.install_s = time.monotonic() - started
        return self.error is None

    def _install(self) -> str | None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        venv_python = str(self.venv / "bin" / "python")
        pip_args = ["install", "--quiet", "--disable-pip-version-check", "supervisor"]
        # Our own pip, pointed at the new environment, saves bootstrapping a second pip.
        fast = [[PYTHON, "-m", "venv", "--without-pip", str(self.venv)],
                [PYTHON, "-m", "pip", "--python", venv_python, *pip_args]]  # fmt: skip
        slow = [[PYTHON, "-m", "venv", "--clear", str(self.venv)],
                [venv_python, "-m", "pip", *pip_args]]  # fmt: skip
        error = None
        for steps in (fast, slow):
            error = self._run_all(steps, env)
            if error is None:
                break
        if error is not None:
            return error
        try:
            done = subprocess.run(
                [str(self.bin), "--version"], cwd=self.work.root, capture_output=True, timeout=30
            )
            self.version = f"supervisor {done.stdout.decode().strip()}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"supervisord --version failed: {exc}"
        return None

    def _run_all(self, steps: list[list[str]], env: dict[str, str]) -> str | None:
        for argv in steps:
            try:
                done = subprocess.run(
                    argv, cwd=self.work.root, env=env, capture_output=True, timeout=300
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"`{shlex.join(argv[2:])}` failed: {exc}"
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
                return f"`{shlex.join(argv[2:])}` failed: {lines[-1] if lines else '?'}"
        return None

    def start(self, directory: Path, command: list[str], **program: str) -> subprocess.Popen[bytes]:
        """supervisord in the foreground running one program, `command`."""
        settings = {
            "command": shlex.join(command),
            "directory": str(directory),
            "autostart": "true",
            "autorestart": "true",
            "startsecs": "0",
            "startretries": "1000000",
            "stopasgroup": "true",
            "killasgroup": "true",
            "stdout_logfile": str(directory / "program.log"),
            "redirect_stderr": "true",
            **program,
        }
        conf = directory / "supervisord.conf"
        lines = [
            "[supervisord]",
            "nodaemon=true",
            f"logfile={directory / 'supervisord.log'}",
            f"pidfile={directory / 'supervisord.pid'}",
            f"childlogdir={directory}",
            *(["user=root"] if os.geteuid() == 0 else []),
            "",
            "[program:trainer]",
            *(f"{key}={value}" for key, value in settings.items()),
        ]
        conf.write_text("\n".join(lines) + "\n")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return self.work.popen(
            [str(self.bin), "-c", str(conf)],
            cwd=directory,
            stdout=directory / "supervisord.stdout",
            env=env,
        )


class Peers:
    """What a comparison may need, set up at most once per run."""

    def __init__(self, work: Workspace) -> None:
        self.supervisord = Supervisord(work)
        self.torchrun_version = torchrun_version()

    def versions(self) -> dict[str, str]:
        return {
            "torchrun": self.torchrun_version,
            "supervisord": self.supervisord.version or (self.supervisord.error or "not used"),
            "bash": _first_line(["bash", "--version"]),
            "tail": _first_line(["tail", "--version"]),
        }


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return done.stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"
