"""Whether the run's config file still holds what the daemon read.

The daemon reads trainwarden.toml once, at its start: an edit made while it runs takes
effect only in a new daemon. So that an edit is never silently ignored, the file's identity
(size, mtime_ns and a SHA-256 of its bytes) is recorded when the daemon reads it, and each
check compares the file with it: one stat, and the file read and digested again only when
the stat differs from the last one seen (an editor's save of the same bytes is no change).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from trainwarden.supervisor.store.journal import Journal

StatKey = tuple[int, int, int]
"""(size, mtime_ns, inode): what tells a check that the file may have changed."""


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stat_key(path: Path) -> StatKey | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class ConfigWatch:
    """The config file's identity when the daemon read it, and whether it still holds it."""

    def __init__(self, path: Path, run_dir: Path, read_at: float) -> None:
        self.path = path
        self.run_dir = run_dir
        self.read_at = read_at
        """Wall-clock time (time.time()) the daemon read the file."""
        self._seen = _stat_key(path)
        """The stat the answer below is for: (size, mtime_ns, inode) as read, then as last seen."""
        try:
            self.digest: str | None = digest_of(path)
        except OSError:
            self.digest = None  # unreadable now: nothing to tell a change by
        self._changed = False
        self._gone = False

    def changed(self) -> bool:
        """Whether the file's bytes differ from what the daemon read (or it is gone)."""
        if self.digest is None:
            return False
        key = _stat_key(self.path)
        if key == self._seen:
            return self._changed
        self._seen = key
        try:
            self._gone = key is None
            self._changed = self._gone or digest_of(self.path) != self.digest
        except OSError:
            self._gone = self._changed = True
        return self._changed

    def notice(self) -> str | None:
        """One line for the operator when the file changed: what the daemon runs and what to
        do; None while it holds what the daemon read."""
        if not self.changed():
            return None
        name = self.path.name
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.read_at))
        run = shlex.quote(str(self.run_dir))
        if self._gone:
            return (
                f"{name} is gone since the daemon read it at {when}: the daemon still runs the"
                f" settings it read then; a new daemon needs the file back in {run}"
            )
        return (
            f"{name} changed since the daemon read it at {when}: the daemon still runs the old"
            f" settings; `trainwarden shutdown {run}` then `trainwarden daemon --detach {run}`"
            " to use the new ones"
        )


async def watch(
    config: ConfigWatch, journal: Journal, interval_s: float, told: Callable[[], None]
) -> None:
    """Every `interval_s`: journal `config_changed` the first time the file is seen changed,
    and call `told` whenever that answer changes (the daemon pushes its state topic;
    status asks on its own)."""
    changed_before = False
    journaled = False
    while True:
        await asyncio.sleep(interval_s)
        changed = config.changed()
        if changed == changed_before:
            continue
        changed_before = changed
        if changed and not journaled:
            journaled = True
            journal.append(
                {
                    "kind": "config_changed",
                    "path": str(config.path),
                    "read_at": config.read_at,
                    "notice": config.notice(),
                },
            )
        told()
