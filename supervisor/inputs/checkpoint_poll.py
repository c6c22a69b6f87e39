"""The checkpoint directory and the fixed file watched without inotify, by scanning.

The watcher falls back to these when inotify cannot be had (or loses its directory):
each scan reports what changed since the one before.
"""

from __future__ import annotations

from pathlib import Path

from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.digest import Signature, signature_of


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
