"""Where the daemon keeps its own files inside a run directory, and the one-daemon lock."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from trainwarden.supervisor.contract import BANDIT_STATE_FILE, POLICY_FILE, SAMPLES_FILE
from trainwarden.supervisor.errors import LockHeld, UnsafePath
from trainwarden.supervisor.run_layout import EVAL_HISTORY, LOSS_HISTORY, STATE_DIR

APPEND_FLAGS = os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
"""How the daemon opens a file it appends to (journal, loss history, logs): never through a
symbolic link, which could send its writes to any file its user may write."""


@dataclass(frozen=True)
class RunFiles:
    run_dir: Path

    @property
    def state_dir(self) -> Path:
        return self.run_dir / STATE_DIR

    @property
    def journal(self) -> Path:
        return self.state_dir / "journal.jsonl"

    @property
    def lock(self) -> Path:
        return self.state_dir / "lock"

    @property
    def daemon_pid(self) -> Path:
        return self.state_dir / "daemon.pid"

    @property
    def trainer_pid(self) -> Path:
        return self.state_dir / "trainer.pid"

    @property
    def daemon_log(self) -> Path:
        return self.state_dir / "daemon.log"

    @property
    def log_offset(self) -> Path:
        return self.state_dir / "log.offset"

    @property
    def loss_history(self) -> Path:
        return self.run_dir / LOSS_HISTORY

    @property
    def eval_history(self) -> Path:
        return self.run_dir / EVAL_HISTORY

    @property
    def branch(self) -> Path:
        return self.run_dir / "branch.json"

    @property
    def bandit_state(self) -> Path:
        return self.run_dir / BANDIT_STATE_FILE

    @property
    def samples(self) -> Path:
        return self.run_dir / SAMPLES_FILE

    @property
    def policy(self) -> Path:
        return self.run_dir / POLICY_FILE

    def make_state_dir(self) -> None:
        """.trainwarden/ as a private folder of the daemon's user; a link or a file in its
        place is refused (a chmod through a link would make its target private instead).

        Only ever narrowed: anything beyond 0710 goes, but the group's search bit that a
        daemon with `[control] group` gave it stays (a second `daemon --detach` must not
        lock the allowed users out of the running daemon's socket); the control server sets
        the exact mode when it binds."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.state_dir, 0o700)
        except FileExistsError:
            pass
        try:
            fd = os.open(
                self.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError as exc:
            raise UnsafePath(_state_dir_problem(self.state_dir, exc)) from None
        try:
            os.fchmod(fd, (stat.S_IMODE(os.fstat(fd).st_mode) & 0o710) | 0o700)
        finally:
            os.close(fd)


def _state_dir_problem(path: Path, exc: OSError) -> str:
    try:
        mode = path.lstat().st_mode
    except OSError:
        mode = 0
    if stat.S_ISLNK(mode):
        what = f"a symbolic link (to {os.readlink(path)})"
    elif exc.errno == errno.ENOTDIR:
        what = "not a folder"
    else:
        what = f"not usable: {exc.strerror or exc}"
    return (
        f"{path} is {what}: the daemon keeps its journal, lock and socket in a private folder "
        f"of its own there and follows no link to it; move it away (`mv {path} {path}.old`) "
        "and start again"
    )


def open_for_append(path: Path, flags: int, mode: int) -> int:
    """A descriptor appending to `path` (created with `mode`), never through a link at it."""
    try:
        return os.open(path, APPEND_FLAGS | flags, mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise UnsafePath(
            f"{path} is a symbolic link (to {os.readlink(path)}): the daemon writes its own "
            "files only in place; remove the link and start again"
        ) from None


def acquire_lock(files: RunFiles) -> int:
    """Hold the run's lock for the daemon's lifetime; LockHeld names the holder's pid."""
    files.make_state_dir()
    fd = os.open(files.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = read_pid(files.daemon_pid)
        who = f"pid {holder}" if holder else "another process"
        raise LockHeld(
            f"another trainwarden daemon ({who}) already supervises {files.run_dir}; "
            f"stop it with `trainwarden shutdown {files.run_dir}` first"
        ) from None
    return fd


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write a small file so readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # A fresh file, never one already there: a link planted under the temporary name
    # would otherwise have its target truncated and overwritten.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # A full disk must not keep a half-written copy: it holds space, and the old
        # content stays the file's.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte: write(2) may take fewer (a disk filling up), then raises."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(path: Path) -> None:
    """A rename or unlink is durable only once its directory is fsynced."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
