"""Throwaway users and groups for the tests that need another uid (root only).

Each one is created for the block (useradd/groupadd with a random name, no home) and
deleted after it; `as_user` runs a function as one of them in a forked child, `spawn_as`
keeps one running (a squatter, say) until `reap`.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


def can_make_users() -> bool:
    return os.geteuid() == 0 and all(
        Path(f"/usr/sbin/{tool}").exists() for tool in ("useradd", "userdel", "groupadd")
    )


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    """Supplementary groups the user's processes get."""


@contextlib.contextmanager
def throwaway_group() -> Iterator[int]:
    """A new group's gid for the block."""
    name = f"twg{secrets.token_hex(4)}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


@contextlib.contextmanager
def throwaway_user(groups: Sequence[int] = ()) -> Iterator[User]:
    """A new user (no home, no login) in `groups` besides its own, for the block."""
    name = f"twu{secrets.token_hex(4)}"
    argv = ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group"]
    if groups:
        argv += ["--groups", ",".join(grp.getgrgid(g).gr_name for g in groups)]
    subprocess.run([*argv, name], check=True, capture_output=True)
    try:
        entry = pwd.getpwnam(name)
        yield User(name, entry.pw_uid, entry.pw_gid, tuple(groups))
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def become(user: User) -> None:
    """Drop this (forked) process to `user`: groups first, the uid last."""
    os.setgroups([user.gid, *user.groups])
    os.setgid(user.gid)
    os.setuid(user.uid)


def as_user(user: User, func: Callable[[], int | None]) -> tuple[int, str, str]:
    """Run `func` in a forked child become `user`: (its exit status, stdout, stderr).

    Forked rather than executed: the interpreter may live where other users cannot
    reach it (a pyenv under /root), and the child needs nothing new."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into the test
            code = 70
            try:
                sys.stdout = open(os.dup(out.fileno()), "w")  # noqa: SIM115
                sys.stderr = open(os.dup(err.fileno()), "w")  # noqa: SIM115
                become(user)
                code = int(func() or 0)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return (
            os.waitstatus_to_exitcode(status),
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


def spawn_as(user: User, func: Callable[[Callable[[], None]], None]) -> int:
    """Fork a child become `user` running `func(ready)`; its pid once it called ready()."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            become(user)
            func(lambda: os.write(write_fd, b"r") and None)
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as ready:
        if ready.read(1) != b"r":
            os.waitpid(pid, 0)
            raise RuntimeError(f"the child as {user.name} exited before it was ready")
    return pid


def reap(pid: int) -> None:
    """Kill (by pid) and reap a child of spawn_as."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def reachable_by_all(path: Path) -> list[tuple[Path, int]]:
    """Give every folder above `path` the search bit for others; what to restore after."""
    changed = []
    for parent in path.parents:
        mode = os.stat(parent).st_mode
        if not mode & 0o001:
            changed.append((parent, mode))
            os.chmod(parent, mode | 0o001)
    return changed


def restore_modes(changed: list[tuple[Path, int]]) -> None:
    for path, mode in reversed(changed):
        with contextlib.suppress(OSError):
            os.chmod(path, mode)
