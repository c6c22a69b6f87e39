"""Watching the checkpoint directory: commits and writes in flight, reported to the loop.

A checkpoint counts when it appears under its final name by a rename (IN_MOVED_TO, the
commit point of the contract, also from another folder), when a file written in place
under its final name is closed after writing (IN_CLOSE_WRITE), or when a final name is
created whole: anything but a regular file (a link, a FIFO, never written in place), a
regular file that already verifies, or a hard link to a file (judged at once, good or bad). The create of a file still being
written is not judged until it is closed, so a half-copied file never is.

A write to a name already committed (a file rewritten in place, a file inside a committed
folder changed) is reported to on_touched: the daemon compares it with the digest taken at
its commit. The daemon drains the queue (`drain`) before it acts on an operator's request,
and before it acts on a trainer's exit also waits for the checks those events started in
worker threads (`settle`), so a commit made before either is seen before the decision.

An in-place trainer's fixed file ([checkpoints] fixed, never a committed name itself) is
reported to on_fixed when it is closed after a write or a file is renamed onto it; writes
to it count as a save in progress. A fixed folder (fixed_commit_file set) is reported when
its commit file is closed or renamed into place, or when the folder arrives whole; writes
inside it count as a save in progress. The daemon's staging folder for its snapshots, like
quarantine/, is not watched.

A checkpoint folder (hf-trainer's checkpoint-N/) is watched too: any write inside it is
activity of that folder, but only the file its format names (`commits_folder`) commits
it, when that file is closed or renamed into place; a whole folder renamed in commits
at once. Opens and read-only closes (the daemon's own verification, a mirror copying,
`ls`) are not asked for, so they never wake the watcher; quarantine/ is not watched.

A name that is none of these (no checkpoint, no write in flight, no companion of a
checkpoint there) is reported to on_unrecognised once, with whether it is a folder: the
trainer saves under names the format does not read. It is judged JUDGE_AFTER_S after it
appeared, in a worker thread, and not while anything is in flight there (a sidecar comes
before its checkpoint); quarantine/ and dot-names are never judged. The names there at
start are judged the same way. on_resolved hears of a reported name that went away.

The inotify descriptor is read on the loop; the one blocking check (verifying a regular
file created under a final name) runs in a worker thread. Without inotify the directory
is scanned every POLL_S in a thread instead (`Rescan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

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
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
    InotifyEvent,
    WatchThread,
)
from trainwarden.supervisor.store.checkpoints import QUARANTINE, CheckpointStore, Verdict
from trainwarden.supervisor.store.digest import Signature, signature_of
from trainwarden.supervisor.store.snapshots import STAGING

T = TypeVar("T")

log = logging.getLogger("trainwarden.checkpoints")

WRITING_EVERY_S = 1.0
"""on_writing is called at most this often."""
POLL_S = 1.0
"""How often the directory is scanned when inotify cannot be had."""
SETTLE_MAX_S = 60.0
"""How long settle() waits for the checks it started (a file system that hangs them)."""

JUDGE_AFTER_S = 1.0
"""How long after a name appears it is judged (recognised or not), and how often again
while a write is in flight."""
UNWATCHED = frozenset({QUARANTINE, STAGING})
"""Folders of the checkpoint directory that hold no checkpoint being written."""
DEFER_MAX_S = 600.0
"""A name is judged after this long even if something stays in flight all that time."""

# Only what a commit or a write makes. IN_MOVED_FROM: a folder leaving takes its watch along.
# IN_MOVE_SELF: the directory itself moved away, its watch now names the wrong path.
# IN_DELETE: an unrecognised name reported earlier is gone.
DIR_MASK = (
    IN_CREATE
    | IN_MODIFY
    | IN_CLOSE_WRITE
    | IN_MOVED_TO
    | IN_MOVED_FROM
    | IN_DELETE
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
FOLDER_MASK = IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_ONLYDIR


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
        self.on_unrecognised = on_unrecognised
        """A name the format does not read (and whether it is a folder), once per name."""
        self.on_resolved = on_resolved
        """A name reported to on_unrecognised is gone (deleted, renamed away)."""
        self._candidates: dict[str, float] = {}  # name -> when it was first seen
        self._reported: set[str] = set()
        self._judging: asyncio.TimerHandle | asyncio.Future[Any] | None = None
        self.fixed = store.dir / fixed if fixed is not None else None
        """The file an in-place trainer overwrites ([checkpoints] fixed)."""
        self.on_fixed = on_fixed
        """The fixed file was closed after a write, or a file was renamed onto it (for a
        fixed folder: its commit file, or a folder renamed onto the fixed name)."""
        self.fixed_commit_file = fixed_commit_file
        """Set when the fixed name is a folder: the file in it written last."""
        self._inotify: Inotify | None = None
        self._dir_wd = -1
        self._folders: dict[int, Path] = {}  # watch -> the checkpoint folder it watches
        self._folder_inodes: dict[int, int] = {}  # watch -> that folder's inode
        self._poller: WatchThread | None = None
        self._checks: set[asyncio.Future[Any]] = set()  # see _check
        self._last_writing = 0.0
        self._attached = False
        self._stopped = False

    def start(self) -> None:
        self._stopped = self._attached = False
        try:
            self._inotify = Inotify()
            self._dir_wd = self._inotify.add_watch(self.store.dir, DIR_MASK)
            for entry in os.scandir(self.store.dir):  # the folders there now: watched, not judged
                if entry.name not in UNWATCHED and entry.is_dir(follow_symlinks=False):
                    self._watch_folder(Path(entry.path))
                self._consider(Path(entry.path))
        except OSError as exc:
            self._fall_back(exc, Rescan(self.store, baseline=True))
            return
        self._inotify.attach(self.loop, self.on_events)
        self._attached = True

    def stop(self) -> None:
        self._stopped = True
        if isinstance(self._judging, asyncio.TimerHandle):
            self._judging.cancel()
        self._judging = None
        if self._poller is not None:
            self._poller.stop()
            self._poller = None
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._folders.clear()
        self._folder_inodes.clear()

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
            self._folders.pop(event.wd, None)
            self._folder_inodes.pop(event.wd, None)
        elif event.wd in self._folders and event.name:
            self._in_file(event.mask, self._folders[event.wd] / os.fsdecode(event.name))
        return False

    def _in_directory(self, event: InotifyEvent, path: Path) -> None:
        if path.name in UNWATCHED:
            return
        if event.mask & (IN_DELETE | IN_MOVED_FROM):
            self._gone(path.name)
        elif event.mask & (IN_CREATE | IN_MOVED_TO):
            self._consider(path)
        if not event.mask & IN_ISDIR:
            self._in_file(event.mask, path)
        elif event.mask & IN_MOVED_FROM:
            self._unwatch_folder(path)
        elif event.mask & (IN_CREATE | IN_MOVED_TO):
            self._watch_folder(path)
            if path == self.fixed and self.fixed_commit_file is not None:
                self._fixed_folder_arrived(path, moved=bool(event.mask & IN_MOVED_TO))
                return
            name = self._final(path) if event.mask & IN_MOVED_TO else None
            if name is not None:
                self.on_committed(name)  # a whole folder renamed into place
            else:
                # Made here, or renamed in unfinished: what was written before the watch.
                self._look_inside(path)

    def _in_file(self, mask: int, path: Path) -> None:
        if path == self.fixed:
            self._in_fixed(mask)
            return
        if self.fixed_commit_file is not None and path.parent == self.fixed:
            self._in_fixed_folder(mask, path)
            return
        if mask & IN_ISDIR and not mask & IN_MOVED_TO:
            return  # a folder inside a checkpoint folder: only its arrival by rename counts
        if mask & (IN_MOVED_TO | IN_CLOSE_WRITE):
            name = self._final(path)
            if name is not None:
                self.on_committed(name)
                return
        if mask & (IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE):
            self._touched(path)
        if mask & (IN_MOVED_TO | IN_CLOSE_WRITE):
            return
        if mask & IN_CREATE:
            if self._final(path) is None:
                self._writing(path)
                return
            self._check(lambda: self._arrived_whole(path), lambda done: self._created(path, done))
        elif mask & IN_MODIFY:
            self._writing(path)

    def _in_fixed(self, mask: int) -> None:
        if mask & IN_ISDIR:
            return
        if mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
            if self.on_fixed is not None:
                self.on_fixed()
        elif mask & (IN_CREATE | IN_MODIFY):
            self._writing(None)  # a save in progress, like a .tmp being written

    def _in_fixed_folder(self, mask: int, path: Path) -> None:
        """A write inside the fixed folder: its commit file closed (or renamed into place)
        is a new version; any other write is a save in progress."""
        if path.name == self.fixed_commit_file and mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
            if self.on_fixed is not None and not mask & IN_ISDIR:
                self.on_fixed()
        elif mask & (IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO):
            self._writing(None)

    def _fixed_folder_arrived(self, path: Path, *, moved: bool) -> None:
        """The fixed folder was made, or a folder renamed onto its name (the daemon's own
        restore, or a trainer that swaps in a whole folder). What was written in it before
        its watch came is looked at: a commit file there already may be a whole version."""
        if moved or os.path.lexists(path / str(self.fixed_commit_file)):
            if self.on_fixed is not None:
                self.on_fixed()
        else:
            self._writing(None)

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
        unit = self._unit(path, committing=False)
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
            wd = self._inotify.add_watch(folder, FOLDER_MASK)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return  # gone again, or a link to a folder: nothing to watch inside
            if not self._attached:
                raise  # start() falls back
            self._fall_back(exc, None)  # out of watches (ENOSPC): a folder would go unseen
            return
        self._folders[wd] = folder
        with contextlib.suppress(OSError):
            self._folder_inodes[wd] = os.lstat(folder).st_ino

    def _unwatch_folder(self, folder: Path) -> None:
        """A folder left `folder`: its watch goes, but not that of a folder now there. A
        swap (renameat2 RENAME_EXCHANGE, a fixed folder's restore) reports the new folder's
        arrival before the old one's leaving."""
        if self._inotify is None:
            return
        try:
            there = os.lstat(folder).st_ino
        except OSError:
            there = None
        for wd, path in list(self._folders.items()):
            if path == folder and (there is None or self._folder_inodes.get(wd) != there):
                del self._folders[wd]
                self._folder_inodes.pop(wd, None)
                self._inotify.rm_watch(wd)

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

    # -- names the format does not read -------------------------------------------

    def _consider(self, path: Path) -> None:
        """`path` appeared in the directory: judge it soon unless its name says what it is
        (the checks _final makes for every event anyway)."""
        name = path.name
        if (
            self.on_unrecognised is None
            or name == QUARANTINE
            or (self.fixed is not None and name == self.fixed.name)
            or name.startswith(".")
            or name in self._reported
            or name in self._candidates
        ):
            return
        fmt = self.store.fmt
        if fmt.step_of(path) is not None or fmt.is_in_flight(path):
            return
        self._candidates[name] = time.monotonic()
        self._judge_soon()

    def _gone(self, name: str) -> None:
        self._candidates.pop(name, None)
        if name in self._reported:
            self._reported.discard(name)
            if self.on_resolved is not None:
                self.on_resolved(name)

    def _judge_soon(self) -> None:
        if self._judging is None and not self._stopped:
            self._judging = self.loop.call_later(JUDGE_AFTER_S, self._judge)

    def _judge(self) -> None:
        self._judging = None
        if self._stopped or not self._candidates:
            return
        now = time.monotonic()
        names = dict(self._candidates)
        overdue = {name for name, seen in names.items() if now - seen >= DEFER_MAX_S}
        job = self.loop.run_in_executor(None, self._unrecognised, list(names), overdue)
        self._judging = job

        def judged(done: asyncio.Future[tuple[list[tuple[str, bool]], list[str]]]) -> None:
            self._judging = None
            if self._stopped or done.cancelled():
                return
            if done.exception() is not None:
                log.error("judging names in %s", self.store.dir, exc_info=done.exception())
                return
            found, deferred = done.result()
            for name in names:
                if name not in deferred:
                    self._candidates.pop(name, None)
            for name, is_dir in found:
                if name not in self._reported:
                    self._reported.add(name)
                    assert self.on_unrecognised is not None
                    self.on_unrecognised(name, is_dir)
            if self._candidates:
                self._judge_soon()

        job.add_done_callback(judged)

    def _unrecognised(
        self, names: list[str], overdue: set[str]
    ) -> tuple[list[tuple[str, bool]], list[str]]:
        """In a worker thread: (the names no checkpoint accounts for, each with whether it
        is a folder; the names to judge later, while a write is in flight)."""
        committed, in_flight = self.store.scan()
        if in_flight:
            deferred = [name for name in names if name not in overdue]
            names = [name for name in names if name in overdue]
        else:
            deferred = []
        fmt = self.store.fmt
        belongs = set(committed)
        for name in committed:
            belongs.update(p.name for p in fmt.companions(self.store.dir / name))
        found = []
        for name in names:
            path = self.store.dir / name
            if name in belongs or fmt.step_of(path) is not None or fmt.is_in_flight(path):
                continue
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue  # gone again
            found.append((name, stat.S_ISDIR(mode)))
        return found, deferred

    # -- what a path stands for --------------------------------------------------

    def _unit(self, path: Path, *, committing: bool) -> Path | None:
        """The direct child of the checkpoint directory an event's path stands for.

        Inside a checkpoint folder any write is activity of that folder, but only the file
        the format names (its optional `commits_folder`) can commit it: a late close of
        another file must not get a half-written folder judged.
        """
        if path.parent == self.store.dir:
            return path
        if path.parent.parent != self.store.dir or path.parent.name in UNWATCHED:
            return None
        if not committing:
            return path.parent
        commits_folder = getattr(self.store.fmt, "commits_folder", None)
        return path.parent if commits_folder is not None and commits_folder(path) else None

    def _final(self, path: Path) -> str | None:
        unit = self._unit(path, committing=True)
        if unit is None:
            return None
        return unit.name if self.store.fmt.step_of(unit) is not None else None

    def _arrived_whole(self, path: Path) -> tuple[str, Verdict | None] | None:
        """In a worker thread: (the name a final path commits, its verdict if it had to be
        verified) when it appeared complete: anything but a regular file (a link, a FIFO),
        which is never written in place, or a file that verifies already. A file still
        being written is not whole yet and is reported when it is closed."""
        name = self._final(path)
        if name is None:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return name, None
        verdict = self.store.verify(name)
        # A second link to a file is a file written elsewhere: judged now, good or bad.
        whole = verdict.info is not None or st.st_nlink > 1
        return (name, verdict) if whole else None

    def _writing(self, path: Path | None) -> None:
        """A write of `path` (None: of something in flight), reported at most once a second."""
        now = time.monotonic()
        if now - self._last_writing < WRITING_EVERY_S:
            return
        if path is not None:
            unit = self._unit(path, committing=False)
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
        self._folders.clear()
        self._folder_inodes.clear()
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


class Rescan:
    """The directory's changes since the last scan, for watching without inotify.

    A committed name is reported once it has looked the same at two scans in a row (a
    folder written in place may carry its final name before its last file is complete),
    and again whenever it changes. Anything in flight that changed between two scans
    counts as a write.
    """

    def __init__(self, store: CheckpointStore, *, baseline: bool) -> None:
        self.store = store
        self.reported: dict[str, Signature] = {}
        self.seen: dict[str, Signature] = {}
        self.in_flight: dict[str, Signature] = {}
        if baseline:  # what is there at start is the daemon's own scan's business
            committed, in_flight = self._look()
            self.reported = dict(committed)
            self.seen = dict(committed)
            self.in_flight = in_flight

    def changes(self) -> tuple[list[str], bool]:
        """(names committed or changed since the last scan, whether anything was written)."""
        committed, in_flight = self._look()
        new = [
            name
            for name, signature in committed.items()
            if self.seen.get(name) == signature and self.reported.get(name) != signature
        ]
        for name in new:
            self.reported[name] = committed[name]
        writing = any(self.in_flight.get(name) != sig for name, sig in in_flight.items())
        self.seen, self.in_flight = committed, in_flight
        return new, writing

    def _look(self) -> tuple[dict[str, Signature], dict[str, Signature]]:
        committed_names, in_flight_names = self.store.scan()
        committed = {name: _signature(self.store.dir / name) for name in committed_names}
        in_flight = {name: _signature(self.store.dir / name) for name in in_flight_names}
        return committed, in_flight


class FixedScan:
    """The fixed file's changes since the last scan, for watching without inotify: a new
    version is reported once it has looked the same at two scans in a row (it has no
    rename to commit it); a change between two scans is a write in progress."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.seen: Signature = _signature(path) if path is not None else ()
        self.reported = self.seen  # what is there at start is the daemon's own business

    def changes(self) -> tuple[bool, bool]:
        """(a new version to snapshot, whether it is being written)."""
        if self.path is None:
            return False, False
        now = _signature(self.path)
        settled = now == self.seen and now != self.reported and now != ()
        if settled:
            self.reported = now
        writing = now != self.seen
        self.seen = now
        return settled, writing


def _signature(path: Path) -> Signature:
    """What changes when a file, or a folder's files, are written or replaced."""
    try:
        return signature_of([path])
    except OSError:
        return ()
