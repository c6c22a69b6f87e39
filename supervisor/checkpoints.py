"""The checkpoint directory: scanning, verification, quarantine, deletion, and the watcher.

Every path this module touches is a direct child of the checkpoint directory (or of its
quarantine/ folder) named by a format plugin, so no checkpoint name or step number can
make it write outside the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
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
            if not member.exists():
                continue
            target = self.quarantine_dir / member.name
            if target.exists():
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
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        if in_flight:
            fsync_dir(self.dir)
        return in_flight

    def quarantined(self) -> list[str]:
        try:
            return sorted(p.name for p in self.quarantine_dir.iterdir())
        except FileNotFoundError:
            return []


class CheckpointWatcher(FileSystemEventHandler):
    """inotify on the checkpoint directory, reporting into the asyncio loop.

    A checkpoint counts when it appears under its final name by a rename (the commit
    point of the contract) or when a file written in place under its final name is
    closed; a bare create is ignored until then, so a half-copied file is never judged.
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
        self.observer.schedule(self, str(self.store.dir), recursive=False)
        self.observer.daemon = True
        self.observer.start()

    def stop(self) -> None:
        self.observer.stop()
        with contextlib.suppress(RuntimeError):
            self.observer.join(timeout=2)

    def _final(self, path: str) -> str | None:
        p = Path(path)
        if p.parent != self.store.dir:
            return None
        return p.name if self.store.fmt.step_of(p) is not None else None

    def on_any_event(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileSystemMovedEvent):  # a file or a whole checkpoint directory
            name = self._final(os.fsdecode(event.dest_path))
        elif isinstance(event, FileClosedEvent):
            name = self._final(os.fsdecode(event.src_path))
        else:
            name = None
            if isinstance(
                event, FileModifiedEvent | FileCreatedEvent
            ) and self.store.fmt.is_in_flight(Path(os.fsdecode(event.src_path))):
                now = time.monotonic()
                if now - self._last_writing >= 1.0:
                    self._last_writing = now
                    self.loop.call_soon_threadsafe(self.on_writing)
            return
        if name is not None:
            self.loop.call_soon_threadsafe(self.on_committed, name)
