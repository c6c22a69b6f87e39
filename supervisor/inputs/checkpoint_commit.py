"""The commit rule: which checkpoint an event in the checkpoint directory stands for.

A checkpoint counts when it appears under its final name by a rename (IN_MOVED_TO, the
commit point of the contract, also from another folder), when a file written in place
under its final name is closed after writing (IN_CLOSE_WRITE), or when a final name is
created whole: anything but a regular file (a link, a FIFO, never written in place), a
regular file that already verifies, or a hard link to a file (judged at once, good or
bad). The create of a file still being written is not judged until it is closed, so a
half-copied file never is.

Inside a checkpoint folder (hf-trainer's checkpoint-N/) any write is activity of that
folder, but only the file its format names (`commits_folder`) commits it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainwarden.supervisor.store.checkpoints import QUARANTINE, CheckpointStore, Verdict
from trainwarden.supervisor.store.snapshots import STAGING

UNWATCHED = frozenset({QUARANTINE, STAGING})
"""Folders of the checkpoint directory that hold no checkpoint being written."""


def unit_of(store: CheckpointStore, path: Path, *, committing: bool) -> Path | None:
    """The direct child of the checkpoint directory an event's path stands for.

    Inside a checkpoint folder any write is activity of that folder, but only the file
    the format names (its optional `commits_folder`) can commit it: a late close of
    another file must not get a half-written folder judged.
    """
    if path.parent == store.dir:
        return path
    if path.parent.parent != store.dir or path.parent.name in UNWATCHED:
        return None
    if not committing:
        return path.parent
    commits_folder = getattr(store.fmt, "commits_folder", None)
    return path.parent if commits_folder is not None and commits_folder(path) else None


def final_name(store: CheckpointStore, path: Path) -> str | None:
    """The checkpoint name `path` commits when it is closed or renamed into place."""
    unit = unit_of(store, path, committing=True)
    if unit is None:
        return None
    return unit.name if store.fmt.step_of(unit) is not None else None


def arrived_whole(store: CheckpointStore, path: Path) -> tuple[str, Verdict | None] | None:
    """In a worker thread: (the name a final path commits, its verdict if it had to be
    verified) when it appeared complete: anything but a regular file (a link, a FIFO),
    which is never written in place, or a file that verifies already. A file still
    being written is not whole yet and is reported when it is closed."""
    name = final_name(store, path)
    if name is None:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return name, None
    verdict = store.verify(name)
    # A second link to a file is a file written elsewhere: judged now, good or bad.
    whole = verdict.info is not None or st.st_nlink > 1
    return (name, verdict) if whole else None
