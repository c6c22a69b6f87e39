"""The checkpoint directory: scanning, verification, quarantine, deletion, and the watcher.

Every path this module touches is a direct child of the checkpoint directory (or of its
quarantine/ folder) named by a format plugin, so no checkpoint name or step number can
make it write outside the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
    FileSystemMovedEvent,
)
from watchdog.observers import Observer

from plugins.api import CheckpointFormat, CheckpointInfo
from supervisor.errors import CheckpointInvalid
from supervisor.rundir import fsync_dir

QUARANTINE = "quarantine"


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one committed checkpoint."""

    name: str
    step: int | None
    info: CheckpointInfo | None
    reason: str = ""


class CheckpointStore:
    def __init__(self, directory: Path, fmt: CheckpointFormat) -> None:
        self.dir = directory
        self.fmt = fmt
        self.quarantine_dir = directory / QUARANTINE

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
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            return Verdict(name, step, None, "vanished before it could be verified")
        if stat.S_ISLNK(mode):
            # Never judged through the link: its target may be anywhere, even outside the run.
            return Verdict(name, step, None, f"{name}: a symbolic link, not a checkpoint file")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            # A FIFO or device would block or feed the reader forever.
            return Verdict(name, step, None, f"{name}: not a regular file or folder")
        try:
            info = self.fmt.verify(path)
        except CheckpointInvalid as exc:
            return Verdict(name, step, None, str(exc))
        except FileNotFoundError:
            return Verdict(name, step, None, "vanished before it could be verified")
        except Exception as exc:  # a plugin bug must not take the daemon down
            return Verdict(name, step, None, f"verification failed: {type(exc).__name__}: {exc}")
        return Verdict(name, info.step, info)

    def _members(self, name: str) -> list[Path]:
        path = self._child(name)
        members = [path]
        for companion in self.fmt.companions(path):
            if companion.parent == self.dir and companion.name != name:
                members.append(companion)
        return members

    def quarantine(self, name: str) -> list[str]:
        """Move a checkpoint and its companions into quarantine/; never deletes them."""
        self.quarantine_dir.mkdir(exist_ok=True)
        moved = []
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        for member in self._members(name):
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
        removed = []
        for member in self._members(name):
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
            with contextlib.suppress(FileNotFoundError):
                path = self._child(name)
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        if in_flight:
            fsync_dir(self.dir)
        return in_flight

    def quarantined(self) -> list[str]:
        try:
            return sorted(p.name for p in self.quarantine_dir.iterdir())
        except OSError:  # none yet, or something that is not a folder in its place
            return []


class CheckpointWatcher(FileSystemEventHandler):
    """inotify on the checkpoint directory, reporting into the asyncio loop.

    A checkpoint counts when it appears under its final name by a rename (the commit
    point of the contract; a rename from another folder arrives as a create of a whole
    file) or when a file written in place under its final name is closed; the create of
    a file still being written is ignored until then, so a half-copied file is never judged.
    """

    def __init__(
        self,
        store: CheckpointStore,
        loop: asyncio.AbstractEventLoop,
        on_committed: Callable[[str], None],
        on_writing: Callable[[], None],
    ) -> None:
        self.store = store
        self.loop = loop
        self.on_committed = on_committed
        self.on_writing = on_writing
        self.observer = Observer()
        self._last_writing = 0.0

    def start(self) -> None:
        # Recursive: a checkpoint folder (hf-trainer) is committed by a file closed inside it.
        # Only the events a commit or a write makes: opens and read-only closes (the
        # daemon's own verification, a mirror copying, `ls`) never wake the watcher.
        self.observer.schedule(
            self,
            str(self.store.dir),
            recursive=True,
            event_filter=[
                FileCreatedEvent,
                FileModifiedEvent,
                FileMovedEvent,
                FileClosedEvent,
                DirCreatedEvent,
                DirMovedEvent,
            ],
        )
        self.observer.daemon = True
        self.observer.start()

    def stop(self) -> None:
        self.observer.stop()
        with contextlib.suppress(RuntimeError):
            self.observer.join(timeout=2)

    def _unit(self, path: str, *, committing: bool) -> Path | None:
        """The direct child of the checkpoint directory an event's path stands for.

        Inside a checkpoint folder any write is activity of that folder, but only the file
        the format names (its optional `commits_folder`) can commit it: a late close of
        another file must not get a half-written folder judged.
        """
        p = Path(path)
        if p.parent == self.store.dir:
            return p
        if p.parent.parent != self.store.dir or p.parent.name == QUARANTINE:
            return None
        if not committing:
            return p.parent
        commits_folder = getattr(self.store.fmt, "commits_folder", None)
        return p.parent if commits_folder is not None and commits_folder(p) else None

    def _final(self, path: str) -> str | None:
        unit = self._unit(path, committing=True)
        if unit is None:
            return None
        return unit.name if self.store.fmt.step_of(unit) is not None else None

    def _in_flight(self, path: str) -> bool:
        unit = self._unit(path, committing=False)
        return unit is not None and self.store.fmt.is_in_flight(unit)

    def _arrived_whole(self, path: str) -> bool:
        """A final name that appeared complete: renamed in from another folder (watchdog
        reports that as a create), or anything but a regular file (a link, a FIFO), which
        is never written in place. A file still being written in place is not whole yet
        and is reported when it is closed."""
        name = self._final(path)
        if name is None:
            return False
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return True
        except OSError:
            return False
        return self.store.verify(name).info is not None

    def on_any_event(self, event: FileSystemEvent) -> None:
        # An exception here would end watchdog's thread and blind the daemon for good.
        try:
            self._dispatch(event)
        except Exception:
            logging.getLogger("trainwarden.checkpoints").exception("checkpoint event %r", event)

    def _dispatch(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileSystemMovedEvent):  # a file or a whole checkpoint directory
            name = self._final(os.fsdecode(event.dest_path))
        elif isinstance(event, FileClosedEvent) or (
            isinstance(event, FileCreatedEvent) and self._arrived_whole(os.fsdecode(event.src_path))
        ):
            name = self._final(os.fsdecode(event.src_path))
        else:
            name = None
            if isinstance(event, FileModifiedEvent | FileCreatedEvent) and self._in_flight(
                os.fsdecode(event.src_path)
            ):
                now = time.monotonic()
                if now - self._last_writing >= 1.0:
                    self._last_writing = now
                    self.loop.call_soon_threadsafe(self.on_writing)
            return
        if name is not None:
            self.loop.call_soon_threadsafe(self.on_committed, name)
