"""What the daemon shows of the checkpoint directory beside its state: the newest verified
commit (its step, its commit time) and the names in the folder that the configured format
does not read, each with the option that would read it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from trainwarden.plugins.api import CheckpointInfo
from trainwarden.supervisor.checkpoint_hints import unrecognised_hint
from trainwarden.supervisor.protocol import UnrecognisedCheckpoint
from trainwarden.supervisor.store.journal import Journal

log = logging.getLogger("trainwarden.telemetry")

UNRECOGNISED_SHOWN = 20
"""Unrecognised names status lists at most (the newest; the journal has every one)."""


class CheckpointView:
    def __init__(self, journal: Journal, fmt: str, changed: Callable[[], None]) -> None:
        self.journal = journal
        self.fmt = fmt
        """[checkpoints] format."""
        self.changed = changed
        """Told when what is shown changed (the telemetry frame is published again)."""
        self.newest: CheckpointInfo | None = None
        self.newest_t: float | None = None
        """Wall time the newest checkpoint was committed (its file's mtime)."""
        self.unrecognised: dict[str, UnrecognisedCheckpoint] = {}
        """Names in the checkpoint directory the format does not read, oldest first."""

    def committed(self, info: CheckpointInfo, mtime: float) -> bool:
        """A verified commit and its file's mtime (the commit time, which a daemon restart
        does not change); whether it is the newest now."""
        if self.newest is not None and info.step <= self.newest.step:
            return False
        self.newest = info
        self.newest_t = mtime or None
        return True

    def unrecognised_name(self, name: str, is_dir: bool) -> None:
        """The checkpoint watcher found a name the format does not read: say which option
        would (journaled once per name by the watcher's own bookkeeping)."""
        hint = unrecognised_hint(name, is_dir, self.fmt)
        self.journal.append(
            {
                "kind": "checkpoint_unrecognised",
                "name": name,
                "folder": is_dir,
                "format": self.fmt,
                "hint": hint,
            },
        )
        log.warning("%s", hint)
        self.unrecognised[name] = {"name": name, "hint": hint}
        while len(self.unrecognised) > UNRECOGNISED_SHOWN:
            del self.unrecognised[next(iter(self.unrecognised))]
        self.changed()

    def resolved(self, name: str) -> None:
        """An unrecognised name went away."""
        if self.unrecognised.pop(name, None) is not None:
            self.changed()
