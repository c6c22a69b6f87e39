"""Watching the checkpoint directory: commits and writes in flight, reported to the loop.

Which events commit a checkpoint is the commit rule (`checkpoint_commit`). A write to a
name already committed (a file rewritten in place, a file inside a committed folder
changed) is reported to on_touched: the daemon compares it with the digest taken at its
commit. The daemon drains the queue (`drain`) before it acts on an operator's request,
and before it acts on a trainer's exit also waits for the checks those events started in
worker threads (`settle`), so a commit made before either is seen before the decision.

An in-place trainer's fixed file or folder is reported to on_fixed when a new version of
it is there (`checkpoint_fixed` says which events are one); writes to it count as a save
in progress. The daemon's staging folder for its snapshots, like quarantine/, is not
watched.

A checkpoint folder (hf-trainer's checkpoint-N/) is watched too: any write inside it is
activity of that folder, but only the file its format names (`commits_folder`) commits
it, when that file is closed or renamed into place; a whole folder renamed in commits
at once. Opens and read-only closes (the daemon's own verification, a mirror copying,
`ls`) are not asked for, so they never wake the watcher; quarantine/ is not watched.

A name that is none of these is reported to on_unrecognised once
(`checkpoint_unrecognised`); on_resolved hears of a reported name that went away.

The inotify descriptor is read on the loop; the one blocking check (verifying a regular
file created under a final name) runs in a worker thread. Without inotify the directory
is scanned every POLL_S in a thread instead (`checkpoint_poll`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from trainwarden.supervisor.inputs.checkpoint_commit import (
    UNWATCHED,
    arrived_whole,
    final_name,
    unit_of,
)
from trainwarden.supervisor.inputs.checkpoint_fixed import (
    FixedEvent,
    fixed_folder_arrived,
    in_fixed_file,
    in_fixed_folder,
)
from trainwarden.supervisor.inputs.checkpoint_folders import DIR_MASK, FolderWatches
from trainwarden.supervisor.inputs.checkpoint_poll import FixedScan, Rescan
from trainwarden.supervisor.inputs.checkpoint_unrecognised import UnrecognisedNames
from trainwarden.supervisor.inputs.inotify import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
    InotifyEvent,
    WatchThread,
)
from trainwarden.supervisor.store.checkpoints import CheckpointStore, Verdict

T = TypeVar("T")

log = logging.getLogger("trainwarden.checkpoints")

WRITING_EVERY_S = 1.0
"""on_writing is called at most this often."""
POLL_S = 1.0
"""How often the directory is scanned when inotify cannot be had."""
SETTLE_MAX_S = 60.0
"""How long settle() waits for the checks it started (a file system that hangs them)."""


class CheckpointWatcher:
    """Reports committed checkpoint names (on_committed) and writes in flight (on_writing),
    both called on `loop`; start() and stop() on the loop's thread."""

    def __init__(
        self,
        store: CheckpointStore,
        loop: asyncio.AbstractEventLoop,
        on_committed: Callable[[str], None],
        on_writing: Callable[[], None],
        on_touched: Callable[[str], None] | None = None,
        on_verified: Callable[[str, Verdict], None] | None = None,
        on_unrecognised: Callable[[str, bool], None] | None = None,
        on_resolved: Callable[[str], None] | None = None,
        fixed: str | None = None,
        on_fixed: Callable[[], None] | None = None,
        fixed_commit_file: str | None = None,
    ) -> None:
        self.store = store
        self.loop = loop
        self.on_committed = on_committed
        self.on_writing = on_writing
        self.on_touched = on_touched
        """A committed name (or a file inside a committed folder) was written to."""
        self.on_verified = on_verified
        """Instead of on_committed, when the watcher had to verify the file itself to tell
        a whole file (a hard link) from one still being written: the verdict, so the
        checkpoint is not verified twice."""
        self.fixed = store.dir / fixed if fixed is not None else None
        """The file an in-place trainer overwrites ([checkpoints] fixed)."""
        self.unrecognised = UnrecognisedNames(store, loop, on_unrecognised, on_resolved, self.fixed)
        self.on_fixed = on_fixed
        """The fixed file was closed after a write, or a file was renamed onto it (for a
        fixed folder: its commit file, or a folder renamed onto the fixed name)."""
        self.fixed_commit_file = fixed_commit_file
        """Set when the fixed name is a folder: the file in it written last."""
        self._inotify: Inotify | None = None
        self._dir_wd = -1
        self._watches = FolderWatches()
        self._poller: WatchThread | None = None
        self._checks: set[asyncio.Future[Any]] = set()  # see _check
        self._last_writing = 0.0
        self._attached = False
        self._stopped = False

    def start(self) -> None:
        self._stopped = self._attached = False
        self.unrecognised.start()
        try:
            self._inotify = Inotify()
            self._dir_wd = self._inotify.add_watch(self.store.dir, DIR_MASK)
            for entry in os.scandir(self.store.dir):  # the folders there now: watched, not judged
                if entry.name not in UNWATCHED and entry.is_dir(follow_symlinks=False):
                    self._watch_folder(Path(entry.path))
                self.unrecognised.consider(Path(entry.path))
        except OSError as exc:
            self._fall_back(exc, Rescan(self.store, baseline=True))
            return
        self._inotify.attach(self.loop, self.on_events)
        self._attached = True

    def stop(self) -> None:
        self._stopped = True
        self.unrecognised.stop()
        if self._poller is not None:
            self._poller.stop()
            self._poller = None
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._watches.clear()

    def drain(self) -> None:
        """Handle every event queued now, at once (before a decision that must know of
        every commit made so far). Scanning without inotify has nothing to drain."""
        if self._inotify is not None and self._attached:
            self._inotify.dispatch(self.on_events)

    async def settle(self) -> None:
        """drain(), then wait for the checks it started in worker threads (a folder whose
        committing file was written before its watch came, a rescan after lost events) and
        drain again, until none is left: every commit made so far has been reported."""
        self.drain()
        deadline = time.monotonic() + SETTLE_MAX_S
        while self._checks:
            left = deadline - time.monotonic()
            if left <= 0:
                # A check stuck on the file system: the commit is reported when it returns.
                log.warning(
                    "%d checkpoint checks still running; deciding without them", len(self._checks)
                )
                return
            await asyncio.wait(list(self._checks), timeout=left)
            self.drain()

    def _check(self, work: Callable[[], T], then: Callable[[asyncio.Future[T]], None]) -> None:
        """Run `work` in a worker thread, then `then` with its future on the loop; settle()
        waits for it."""
        job = self.loop.run_in_executor(None, work)
        self._checks.add(job)

        def done(future: asyncio.Future[T]) -> None:
            self._checks.discard(future)
            then(future)

        job.add_done_callback(done)

    # -- inotify, on the loop ----------------------------------------------------

    def on_events(self, events: list[InotifyEvent]) -> None:
        overflow = False
        for event in events:
            # An exception here must not leave the loop's reader broken for every later event.
            try:
                overflow |= self._event(event)
            except Exception:
                log.exception("checkpoint event %r", event)
            if self._inotify is None:
                return  # fell back to scanning
        if overflow:
            self._rescan()

    def _event(self, event: InotifyEvent) -> bool:
        """Handle one event; True when events were lost and everything must be looked at."""
        if event.mask & IN_Q_OVERFLOW:
            return True
        if event.wd == self._dir_wd:
            if event.mask & (IN_IGNORED | IN_MOVE_SELF):
                self._fall_back(OSError(errno.ENOENT, f"{self.store.dir} moved or deleted"), None)
                return False
            self._in_directory(event, self.store.dir / os.fsdecode(event.name))
        elif event.mask & IN_IGNORED:
            self._watches.forget(event.wd)
        elif event.wd in self._watches.folders and event.name:
            folder = self._watches.folders[event.wd]
            self._in_file(event.mask, folder / os.fsdecode(event.name))
        return False

    def _in_directory(self, event: InotifyEvent, path: Path) -> None:
        if path.name in UNWATCHED:
            return
        if event.mask & (IN_DELETE | IN_MOVED_FROM):
            self.unrecognised.gone(path.name)
        elif event.mask & (IN_CREATE | IN_MOVED_TO):
            self.unrecognised.consider(path)
        if not event.mask & IN_ISDIR:
            self._in_file(event.mask, path)
        elif event.mask & IN_MOVED_FROM:
            self._unwatch_folder(path)
        elif event.mask & (IN_CREATE | IN_MOVED_TO):
            self._watch_folder(path)
            if path == self.fixed and self.fixed_commit_file is not None:
                moved = bool(event.mask & IN_MOVED_TO)
                self._fixed(fixed_folder_arrived(path, self.fixed_commit_file, moved=moved))
                return
            name = final_name(self.store, path) if event.mask & IN_MOVED_TO else None
            if name is not None:
                self.on_committed(name)  # a whole folder renamed into place
            else:
                # Made here, or renamed in unfinished: what was written before the watch.
                self._look_inside(path)

    def _in_file(self, mask: int, path: Path) -> None:
        if path == self.fixed:
            self._fixed(in_fixed_file(mask))
            return
        if self.fixed_commit_file is not None and path.parent == self.fixed:
            self._fixed(in_fixed_folder(mask, path, self.fixed_commit_file))
            return
        if mask & IN_ISDIR and not mask & IN_MOVED_TO:
            return  # a folder inside a checkpoint folder: only its arrival by rename counts
        if mask & (IN_MOVED_TO | IN_CLOSE_WRITE):
            name = final_name(self.store, path)
            if name is not None:
                self.on_committed(name)
                return
        if mask & (IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE):
            self._touched(path)
        if mask & (IN_MOVED_TO | IN_CLOSE_WRITE):
            return
        if mask & IN_CREATE:
            if final_name(self.store, path) is None:
                self._writing(path)
                return
            self._check(lambda: self._arrived_whole(path), lambda done: self._created(path, done))
        elif mask & IN_MODIFY:
            self._writing(path)

    def _fixed(self, seen: FixedEvent | None) -> None:
        if seen == "version":
            if self.on_fixed is not None:
                self.on_fixed()
        elif seen == "saving":
            self._writing(None)  # a save in progress, like a .tmp being written

    def _created(
        self, path: Path, whole: asyncio.Future[tuple[str, Verdict | None] | None]
    ) -> None:
        if self._stopped or whole.cancelled():
            return
        if whole.exception() is not None:
            log.error("checking %s", path, exc_info=whole.exception())
            return
        found = whole.result()
        if found is None:
            self._writing(path)
            return
        name, verdict = found
        if verdict is not None and self.on_verified is not None:
            self.on_verified(name, verdict)
        else:
            self.on_committed(name)

    def _touched(self, path: Path) -> None:
        """A write at `path`: report the committed checkpoint it belongs to, if any (the
        daemon tells a committed one from a checkpoint still being written)."""
        if self.on_touched is None:
            return
        unit = unit_of(self.store, path, committing=False)
        if unit is not None and self.store.fmt.step_of(unit) is not None:
            self.on_touched(unit.name)

    def _look_inside(self, folder: Path) -> None:
        """A folder's entries as if each had just been created in it."""
        try:
            entries = [entry.name for entry in os.scandir(folder)]
        except OSError:
            return
        for name in entries:
            self._in_file(IN_CREATE, folder / name)

    def _watch_folder(self, folder: Path) -> None:
        if self._inotify is None:
            return  # scanning instead
        try:
            self._watches.add(self._inotify, folder)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return  # gone again, or a link to a folder: nothing to watch inside
            if not self._attached:
                raise  # start() falls back
            self._fall_back(exc, None)  # out of watches (ENOSPC): a folder would go unseen

    def _unwatch_folder(self, folder: Path) -> None:
        """A folder left `folder`: its watch goes, but not that of a folder now there."""
        if self._inotify is not None:
            self._watches.left(self._inotify, folder)

    def _rescan(self) -> None:
        """After lost events: watch every folder again and report everything committed
        (the daemon tells a known checkpoint by its mtime)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.store.dir):
                if entry.name not in UNWATCHED and entry.is_dir(follow_symlinks=False):
                    self._watch_folder(Path(entry.path))

        def report(done: asyncio.Future[tuple[list[str], list[str]]]) -> None:
            if self._stopped or done.cancelled() or done.exception() is not None:
                return
            committed, in_flight = done.result()
            for name in committed:
                self.on_committed(name)
            if in_flight:
                self._writing(None)

        self._check(self.store.scan, report)

    # -- writes ---------------------------------------------------------------------

    def _arrived_whole(self, path: Path) -> tuple[str, Verdict | None] | None:
        """In a worker thread: whether a final name was created whole (`arrived_whole`)."""
        return arrived_whole(self.store, path)

    def _writing(self, path: Path | None) -> None:
        """A write of `path` (None: of something in flight), reported at most once a second."""
        now = time.monotonic()
        if now - self._last_writing < WRITING_EVERY_S:
            return
        if path is not None:
            unit = unit_of(self.store, path, committing=False)
            if unit is None:
                return
            # A write inside a checkpoint folder is that folder being written, even when the
            # event is read after the file that will commit it appeared (under load).
            if unit == path and not self.store.fmt.is_in_flight(unit):
                return
        self._last_writing = now
        self.on_writing()

    # -- without inotify -----------------------------------------------------------

    def _fall_back(self, exc: OSError, rescan: Rescan | None) -> None:
        """Scan the directory every POLL_S from now on. Without a baseline the first scan
        reports every checkpoint there, so nothing committed in between is missed."""
        log.warning("%s; scanning %s every %g s instead", exc, self.store.dir, POLL_S)
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._watches.clear()
        scanner = rescan or Rescan(self.store, baseline=False)
        fixed = FixedScan(self.fixed)

        def poll() -> None:
            committed, writing = scanner.changes()
            for name in committed:
                self._post(self.on_committed, name)
            rewritten, fixed_writing = fixed.changes()
            if rewritten and self.on_fixed is not None:
                self._post(self.on_fixed)
            if writing or fixed_writing:
                self._post(self._writing, None)

        self._poller = WatchThread(
            f"checkpoints:{self.store.dir.name}", None, lambda events: None, poll, POLL_S
        )
        self._poller.start()

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while we scanned
            self.loop.call_soon_threadsafe(self._unless_stopped, callback, *args)

    def _unless_stopped(self, callback: Callable[..., None], *args: object) -> None:
        if not self._stopped:
            callback(*args)
