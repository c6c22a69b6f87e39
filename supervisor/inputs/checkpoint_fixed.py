"""An in-place trainer's fixed file or folder: which of its events is a new version.

An in-place trainer's fixed file ([checkpoints] fixed, never a committed name itself) has
a new version when it is closed after a write or a file is renamed onto it; writes to it
count as a save in progress. A fixed folder (fixed_commit_file set) has one when its
commit file is closed or renamed into place, or when the folder arrives whole; writes
inside it count as a save in progress. The daemon's staging folder for its snapshots,
like quarantine/, is not watched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from trainwarden.supervisor.inputs.inotify import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVED_TO,
)

FixedEvent = Literal["version", "saving"]
"""A new version to snapshot, or a save in progress (like a .tmp being written)."""


def in_fixed_file(mask: int) -> FixedEvent | None:
    """An event on the fixed file itself."""
    if mask & IN_ISDIR:
        return None
    if mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
        return "version"
    if mask & (IN_CREATE | IN_MODIFY):
        return "saving"
    return None


def in_fixed_folder(mask: int, path: Path, commit_file: str) -> FixedEvent | None:
    """A write inside the fixed folder: its commit file closed (or renamed into place)
    is a new version; any other write is a save in progress."""
    if path.name == commit_file and mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
        return None if mask & IN_ISDIR else "version"
    if mask & (IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO):
        return "saving"
    return None


def fixed_folder_arrived(path: Path, commit_file: str, *, moved: bool) -> FixedEvent:
    """The fixed folder was made, or a folder renamed onto its name (the daemon's own
    restore, or a trainer that swaps in a whole folder). What was written in it before
    its watch came is looked at: a commit file there already may be a whole version."""
    return "version" if moved or os.path.lexists(path / commit_file) else "saving"
