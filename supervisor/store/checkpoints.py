"""The checkpoint directory: scanning, verification, quarantine and deletion.

Every path this module touches is a direct child of the checkpoint directory (or of its
quarantine/ folder) named by a format plugin, so no checkpoint name or step number can
make it write outside the run directory.

The directory is resolved once, when the store is made (checkpoints/ may be a link to a
bigger disk), and the store works there from then on. Before anything is deleted or moved
its parent is resolved again and must still be that directory, so a link put in the
directory's place later, or a quarantine/ that is a link, never sends a delete or a move
anywhere else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointFormat, CheckpointInfo
from trainwarden.supervisor.contract import MAX_STEP
from trainwarden.supervisor.core.events import Outcome
from trainwarden.supervisor.errors import CheckpointInvalid
from trainwarden.supervisor.store.rundir import fsync_dir

QUARANTINE = "quarantine"


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one committed checkpoint."""

    name: str
    step: int | None
    outcome: Outcome
    info: CheckpointInfo | None = None
    """Set when the outcome is VERIFIED."""
    reason: str = ""
    """Why it is not verified, for the journal and the operator."""


def _beyond_max_step(name: str, step: int) -> Verdict:
    # Refused here, where a format's step first enters the daemon, for every format: no
    # later step arithmetic, journal record or reply ever sees such a number.
    return Verdict(
        name, step, Outcome.INVALID, reason=f"{name}: step {step} is beyond {MAX_STEP} (2^31-1)"
    )


def _refused(why: str) -> OSError:
    # errno and strerror both set: the executor journals strerror as the failure's reason.
    return OSError(errno.EXDEV, why)


class CheckpointStore:
    def __init__(self, directory: Path, fmt: CheckpointFormat) -> None:
        self.configured_dir = directory
        """The directory as configured (run/checkpoints, perhaps a link)."""
        self.dir = Path(os.path.realpath(directory))
        """The directory it resolved to when the store was made: where everything happens."""
        self.fmt = fmt
        self.quarantine_dir = self.dir / QUARANTINE
        self.quarantine_notes: dict[str, dict[str, Any]] = {}
        """Why each checkpoint was quarantined, by name: the daemon fills it from the
        journal at start-up, then with each quarantine it performs (see store.quarantine)."""

    def _child(self, name: str) -> Path:
        """A direct child of the checkpoint directory; refuses anything that would escape."""
        if not name or "/" in name or name in (".", "..") or "\x00" in name:
            raise ValueError(f"refusing checkpoint name {name!r}")
        return self.dir / name

    def ensure(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

    def scan(self) -> tuple[list[str], list[str]]:
        """(committed checkpoint names oldest first, in-flight names)."""
        committed: list[tuple[int, str]] = []
        in_flight: list[str] = []
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return [], []
        for entry in entries:
            path = Path(entry.path)
            if entry.name == QUARANTINE:
                continue
            step = self.fmt.step_of(path)
            if step is not None:
                committed.append((step, entry.name))
            elif self.fmt.is_in_flight(path):
                in_flight.append(entry.name)
        return [name for _, name in sorted(committed)], in_flight

    def verify(self, name: str) -> Verdict:
        path = self._child(name)
        step = self.fmt.step_of(path)
        if step is not None and step > MAX_STEP:
            return _beyond_max_step(name, step)
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            return Verdict(
                name, step, Outcome.VANISHED, reason="vanished before it could be verified"
            )
        if stat.S_ISLNK(mode):
            # Never judged through the link: its target may be anywhere, even outside the run.
            return Verdict(
                name,
                step,
                Outcome.INVALID,
                reason=f"{name}: a symbolic link, not a checkpoint file",
            )
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            # A FIFO or device would block or feed the reader forever.
            return Verdict(
                name, step, Outcome.INVALID, reason=f"{name}: not a regular file or folder"
            )
        try:
            info = self.fmt.verify(path)
        except CheckpointInvalid as exc:
            return Verdict(name, step, Outcome.INVALID, reason=str(exc))
        except FileNotFoundError:
            return Verdict(
                name, step, Outcome.VANISHED, reason="vanished before it could be verified"
            )
        except Exception as exc:  # a plugin bug must not take the daemon down
            return Verdict(
                name,
                step,
                Outcome.INVALID,
                reason=f"verification failed: {type(exc).__name__}: {exc}",
            )
        if info.step > MAX_STEP:
            return _beyond_max_step(name, info.step)
        return Verdict(name, info.step, Outcome.VERIFIED, info)

    def _members(self, name: str) -> list[Path]:
        path = self._child(name)
        members = [path]
        for companion in self.fmt.companions(path):
            if companion.parent == self.dir and companion.name != name:
                members.append(companion)
        return members

    def files_of(self, name: str) -> list[Path]:
        """The checkpoint's main path and the companions present beside it."""
        return [m for i, m in enumerate(self._members(name)) if i == 0 or os.path.lexists(m)]

    def _check_inside(self, member: Path) -> None:
        """Refuse to act on `member` unless its parent still resolves to the directory."""
        parent = os.path.realpath(member.parent)
        if parent != str(self.dir):
            raise _refused(
                f"refusing to touch {member.name}: its folder {member.parent} now resolves to "
                f"{parent}, not the checkpoint directory {self.dir}"
            )

    def _ensure_quarantine(self) -> None:
        """quarantine/ as a real folder directly in the directory; a link there is refused."""
        with contextlib.suppress(FileExistsError):
            self.quarantine_dir.mkdir()
        mode = self.quarantine_dir.lstat().st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            what = "a link" if stat.S_ISLNK(mode) else "not a folder"
            raise _refused(f"refusing to quarantine into {self.quarantine_dir}: it is {what}")
        self._check_inside(self.quarantine_dir)

    def quarantine(self, name: str) -> list[str]:
        """Move a checkpoint and its companions into quarantine/; never deletes them."""
        members = self._members(name)
        for member in members:
            self._check_inside(member)
        self._ensure_quarantine()
        moved = []
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        for member in members:
            # lexists: a dangling link is moved too (as the link), never skipped or followed.
            if not os.path.lexists(member):
                continue
            target = self.quarantine_dir / member.name
            if os.path.lexists(target):
                target = self.quarantine_dir / f"{member.name}.{stamp}"
            os.replace(member, target)
            moved.append(target.name)
        fsync_dir(self.dir)
        fsync_dir(self.quarantine_dir)
        return moved

    def delete(self, name: str) -> list[str]:
        members = self._members(name)
        for member in members:
            self._check_inside(member)
        removed = []
        for member in members:
            with contextlib.suppress(FileNotFoundError):
                if member.is_dir() and not member.is_symlink():
                    shutil.rmtree(member)
                else:
                    member.unlink()
                removed.append(member.name)
        fsync_dir(self.dir)
        return removed

    def remove_stale_in_flight(self) -> list[str]:
        """Remove leftover .tmp writes; only call when no trainer can be writing."""
        _, in_flight = self.scan()
        for name in in_flight:
            path = self._child(name)
            self._check_inside(path)
            with contextlib.suppress(FileNotFoundError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        if in_flight:
            fsync_dir(self.dir)
        return in_flight

    def quarantined(self) -> list[str]:
        if self.quarantine_dir.is_symlink():  # not ours: nothing was ever moved there
            return []
        try:
            return sorted(p.name for p in self.quarantine_dir.iterdir())
        except OSError:  # none yet, or something that is not a folder in its place
            return []
