"""Snapshots of a checkpoint the trainer overwrites in place (`[checkpoints] fixed`).

A trainer such as nanoGPT rewrites one file, `ckpt.pt`, with a plain torch.save: no step in
its name and no atomic commit. Each time it is closed after a write, `take` copies it into
a staging folder, reads its step from the copy, names the copy as the format names a
committed checkpoint (`ckpt_000600.pt`), verifies it there and only then renames it into
the checkpoint directory. From there on it is an ordinary committed checkpoint: retention,
digests, quarantine, the mirror, pins and restarts all work on the snapshots. A write that
does not verify (torn, empty, killed mid torch.save) never leaves the staging folder.

The snapshots live in the checkpoint directory itself, beside the fixed file: the same
file system, so a reflink and the final rename work, and every part of the daemon that
reads that directory sees them with no special case. The staging folder (STAGING) is a
hidden folder in it that is never a checkpoint.

`restore` puts a snapshot back at the fixed name before a start: copied to a temporary
name beside it, fsynced, renamed over it, the directory fsynced, so a torn file left by a
kill mid-save is replaced whole or not at all.

Copies are reflinks (ioctl FICLONE: no data copied, no extra space until one side
changes) where the file system supports them (btrfs, XFS, bcachefs), else a streamed copy;
either way fsynced before it is renamed anywhere.

A fixed FOLDER (`fixed_commit_file`) is store.fixed_folder's FixedFolder, built on this one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainwarden.plugins.api import CheckpointFormat
from trainwarden.supervisor.errors import CheckpointInvalid
from trainwarden.supervisor.store.rundir import fsync_dir

STAGING = ".snapshots"
"""The hidden folder in the checkpoint directory where a copy waits for its verdict."""
INCOMING = "incoming"
FICLONE = 0x40049409
"""_IOW(0x94, 9, int) from linux/fs.h: share the source's extents with the target."""
NO_REFLINK = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM}
)
STEP_REGEX_BYTES = 1 << 20
"""How much of a fixed file step_regex is searched in."""
COPY_CHUNK = 8 << 20


def snapshot_name(fixed: str, step: int) -> str:
    """The snapshot of `fixed` at `step`: ckpt.pt -> ckpt_000600.pt."""
    stem, dot, suffix = fixed.partition(".")
    return f"{stem}_{step:06d}{dot}{suffix}"


def copy_durably(src: Path, dst: Path) -> str:
    """Copy the file `src` to the new file `dst` and fsync it; "reflink" or "copy"."""
    with open(src, "rb") as source:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.ioctl(fd, FICLONE, source.fileno())
                how = "reflink"
            except OSError as exc:
                if exc.errno not in NO_REFLINK:
                    raise
                os.ftruncate(fd, 0)
                with open(fd, "wb", closefd=False) as target:
                    shutil.copyfileobj(source, target, COPY_CHUNK)
                how = "copy"
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(dst)
            raise
        os.close(fd)
    return how


def step_by_regex(path: Path, pattern: str) -> int:
    """The step `pattern`'s group finds in the first STEP_REGEX_BYTES of the file."""
    with open(path, "rb") as file:
        head = file.read(STEP_REGEX_BYTES)
    match = re.search(pattern.encode(), head)
    digits = match.group(1) if match else None
    if digits is None or not digits.isdigit():
        raise CheckpointInvalid(f"no step matching {pattern!r} in its first MiB")
    return int(digits)


@dataclass(frozen=True)
class Taken:
    """What became of one write of the fixed file."""

    outcome: str
    """"taken" (a new snapshot), "known" (that step has one already), "rejected" (it does
    not verify, or it was written while it was copied: the write's close asks again),
    "absent"."""
    step: int | None = None
    name: str = ""
    how: str = ""
    bytes: int = 0
    reason: str = ""


class FixedFile:
    """The fixed file of one checkpoint directory and its snapshots; every method blocks
    (call them in a worker thread) and only one may run at a time."""

    def __init__(
        self,
        directory: Path,
        fixed: str,
        fmt: CheckpointFormat,
        read_step: Callable[[Path], int],
    ) -> None:
        self.dir = directory
        self.fixed = fixed
        self.path = directory / fixed
        self.fmt = fmt
        self.read_step = read_step
        """The step held in a copy of the fixed file; raises CheckpointInvalid."""
        self.staging = directory / STAGING
        self._restored: tuple[int, int, int] | None = None
        """The fixed file as the last restore left it: no new version while it stays so."""

    def _staging(self) -> Path:
        with contextlib.suppress(FileExistsError):
            self.staging.mkdir()
        mode = self.staging.lstat().st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            raise OSError(errno.ENOTDIR, f"{self.staging} is not a folder of the daemon's own")
        self.recover()
        empty_folder(self.staging)  # what a killed daemon left half done
        return self.staging

    def recover(self) -> None:
        """Put back what a daemon killed in a restore left in staging (a fixed file is
        replaced by one rename: nothing to put back)."""

    def warm(self) -> None:
        """Get the step reader ready (torch-pt's worker imports torch once, for seconds), so
        the first save is not overwritten by the next one while it waits."""
        with contextlib.suppress(CheckpointInvalid, OSError):
            self.read_step(self.staging / INCOMING)

    def take(self) -> Taken:
        """Snapshot the fixed file as it is now, if it verifies."""
        staging = self._staging()
        incoming = staging / INCOMING
        try:
            st = os.stat(self.path)
            if _identity(st) == self._restored:
                return Taken("known")  # the snapshot put back, not a write of the trainer's
            size = st.st_size
            if size == 0:
                return Taken("rejected", reason=f"{self.fixed}: empty file")
            how = copy_durably(self.path, incoming)
            after = os.stat(self.path)
        except FileNotFoundError:
            return Taken("absent")
        try:
            if _changed(st, after):
                # Rewritten in place while it was copied (torch.save truncates and writes
                # again): the copy may mix two saves and still verify. The write's close
                # asks for the next snapshot.
                return Taken("rejected", reason=f"{self.fixed}: changed while it was copied")
            step = self.read_step(incoming)
            name = snapshot_name(self.fixed, step)
            if os.path.lexists(self.dir / name):
                return Taken("known", step, name)
            staged = staging / name
            os.replace(incoming, staged)
            info = self.fmt.verify(staged)
            os.rename(staged, self.dir / name)
        except CheckpointInvalid as exc:
            return Taken("rejected", reason=f"{self.fixed}: {exc}")
        finally:
            empty_folder(staging)
        fsync_dir(self.dir)
        return Taken("taken", step, name, how, info.bytes)

    def restore(self, name: str) -> str:
        """Put the snapshot `name` at the fixed name atomically; "reflink" or "copy"."""
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"refusing snapshot name {name!r}")
        temporary = self.dir / f".{self.fixed}.restoring"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        how = copy_durably(self.dir / name, temporary)
        self._restored = _identity(os.stat(temporary))
        os.replace(temporary, self.path)
        # The rename is not durable until the directory is.
        fsync_dir(self.dir)
        return how


def empty_folder(folder: Path) -> None:
    """Remove everything in `folder` (files and folders), then fsync it. Every removal goes
    through a descriptor of the folder opened without following a link: `folder` swapped for
    a link (to a folder outside the run) meanwhile is refused (ELOOP), never emptied."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for entry in os.scandir(fd):
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.name, dir_fd=fd)
                else:
                    os.unlink(entry.name, dir_fd=fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def _changed(before: os.stat_result, after: os.stat_result) -> bool:
    """Whether a file was written or replaced between two stats of it."""
    return _identity(before) != _identity(after) or before.st_ctime_ns != after.st_ctime_ns


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    """What any write or replacement of a file changes."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)
