"""The trainer as a child process: spawn it in its own session, signal it, find leftovers."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil

from trainwarden.supervisor.config_trainer import trainer_program_problem
from trainwarden.supervisor.inputs.proctree import descendants
from trainwarden.supervisor.shell.spare import Spare
from trainwarden.supervisor.store.rundir import APPEND_FLAGS, write_atomic


@dataclass(frozen=True)
class TrainerIdentity:
    """Enough to tell our trainer from an unrelated process that reused its pid."""

    pid: int
    create_time: float
    cmdline: list[str]
    marker: str = ""
    """The start's TRAINWARDEN_START marker ("" in a file from before markers)."""

    @classmethod
    def of(cls, pid: int, marker: str = "") -> TrainerIdentity:
        proc = psutil.Process(pid)
        cmdline = proc.cmdline()
        deadline = time.monotonic() + 2.0
        while not cmdline and time.monotonic() < deadline:
            # Right after fork the child may still be inside execve: its cmdline reads empty.
            time.sleep(0.01)
            cmdline = proc.cmdline()
        return cls(pid, proc.create_time(), cmdline, marker)

    def save(self, path: Path) -> None:
        data = {
            "pid": self.pid,
            "create_time": self.create_time,
            "cmdline": self.cmdline,
            "marker": self.marker,
        }
        write_atomic(path, orjson.dumps(data))

    @classmethod
    def load(cls, path: Path) -> TrainerIdentity | None:
        try:
            data = orjson.loads(path.read_bytes())
            return cls(
                int(data["pid"]),
                float(data["create_time"]),
                list(data["cmdline"]),
                str(data.get("marker", "")),
            )
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            return None

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return (
                abs(proc.create_time() - self.create_time) < 0.05
                and (not self.cmdline or proc.cmdline() == self.cmdline)
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


def _processes(pids: list[int]) -> list[psutil.Process]:
    """psutil handles (they refuse to signal a reused pid) for those still there."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(psutil.Process(pid))
    return found


def send_signal(pid: int, sig: int, target: str = "group") -> None:
    """Deliver sig to the trainer: its process group, only its main process, or its children.

    The trainer leads its own session, so its pgid is its pid. "children" serves
    launchers such as torchrun whose workers must get SIGUSR1 while the agent must not;
    SIGKILL always goes to the whole group so nothing is left behind.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if sig == signal.SIGKILL:
            # Launchers such as torchrun start workers in sessions of their own, out of the
            # trainer's group: find every descendant first (once the parent dies they are
            # reparented and lost), then kill the group and each of them.
            below = _processes(descendants(pid))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            for child in below:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        elif target == "group":
            os.killpg(pid, sig)
        elif target == "main":
            os.kill(pid, sig)
        else:
            for child in _processes(descendants(pid)):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.send_signal(sig)


class RunLogUnusable(OSError):
    """The run log cannot take the trainer's output; strerror says why, in full."""


def _open_run_log(log_path: Path) -> int:
    try:
        return os.open(log_path, APPEND_FLAGS | os.O_WRONLY, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            why = "it is a symbolic link, and the daemon appends through no link"
        elif exc.errno == errno.EISDIR:
            why = "it is a folder"
        else:
            why = exc.strerror or str(exc)
        raise RunLogUnusable(exc.errno, f"cannot open the run log {log_path}: {why}") from None


def end_partial_line(log_path: Path) -> bool:
    """End the run log's last line if the trainer died in the middle of writing it (killed
    between its text and its newline, say): else the next start's first line would be
    glued to it and read as one line of the new start. True if a newline was added."""
    try:
        fd = os.open(log_path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no log yet, or one the next spawn refuses in its own words
    try:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return False
        os.write(fd, b"\n")
        return True
    except OSError:
        return False  # a full disk: the line stays as it is
    finally:
        os.close(fd)


def spawn_failure(argv: list[str], cwd: Path, env: dict[str, str], exc: OSError) -> str:
    """What a failed spawn says: the run log's problem, or the program's in words (exec
    reports an empty name or a folder as "Permission denied")."""
    if isinstance(exc, RunLogUnusable):
        return str(exc.strerror)
    if not cwd.is_dir():
        return f"its working directory {cwd} ([trainer] cwd) is gone or not a folder"
    problem = trainer_program_problem(argv[0], cwd, env)
    return f"{argv[0]}: {problem or exc.strerror or exc}"


def _join_cgroup(procs_fd: int) -> None:
    """In the forked child, before exec: move itself into its start's cgroup ("0" names
    the writer). Only a write and no allocation of note, as befits a child forked from a
    threaded process; a refusal is left to the parent's join after the spawn."""
    try:
        os.write(procs_fd, b"0\n")
    except OSError:
        pass


async def spawn(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    log_path: Path,
    cgroup_procs_fd: int | None = None,
    spare: Spare | None = None,
) -> asyncio.subprocess.Process:
    """Start the trainer in a new session with stdout and stderr appended to the run log;
    with `cgroup_procs_fd` (a start cgroup's cgroup.procs), inside that cgroup from its
    first instruction, so nothing it forks at once can escape it; with `spare`, in that
    spare process, already in the start's cgroup (SpareGone: it died first)."""
    log_fd = _open_run_log(log_path)
    if spare is not None:
        try:
            return await spare.launch(argv, cwd, env, log_fd)
        finally:
            os.close(log_fd)
    join = None if cgroup_procs_fd is None else functools.partial(_join_cgroup, cgroup_procs_fd)
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_fd,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=join,
        )
    finally:
        os.close(log_fd)
