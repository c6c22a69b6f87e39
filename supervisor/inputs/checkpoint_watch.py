"""Watching the checkpoint directory: commits and writes in flight, reported to the loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable
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

from trainwarden.supervisor.store.checkpoints import QUARANTINE, CheckpointStore


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
