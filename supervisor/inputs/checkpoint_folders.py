"""The inotify watches on the checkpoint directory and on the checkpoint folders in it.

A folder's watch is kept with the folder's inode, so a swap (renameat2 RENAME_EXCHANGE,
a fixed folder's restore), which reports the new folder's arrival before the old one's
leaving, does not take the new folder's watch away.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from trainwarden.supervisor.inputs.inotify import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    Inotify,
)

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


class FolderWatches:
    """Which checkpoint folder each watch watches."""

    def __init__(self) -> None:
        self.folders: dict[int, Path] = {}  # watch -> the checkpoint folder it watches
        self._inodes: dict[int, int] = {}  # watch -> that folder's inode

    def add(self, inotify: Inotify, folder: Path) -> None:
        """Watch `folder`; add_watch's OSError is the caller's to judge."""
        wd = inotify.add_watch(folder, FOLDER_MASK)
        self.folders[wd] = folder
        with contextlib.suppress(OSError):
            self._inodes[wd] = os.lstat(folder).st_ino

    def left(self, inotify: Inotify, folder: Path) -> None:
        """A folder left `folder`: its watch goes, but not that of a folder now there."""
        try:
            there = os.lstat(folder).st_ino
        except OSError:
            there = None
        for wd, path in list(self.folders.items()):
            if path == folder and (there is None or self._inodes.get(wd) != there):
                del self.folders[wd]
                self._inodes.pop(wd, None)
                inotify.rm_watch(wd)

    def forget(self, wd: int) -> None:
        """The kernel dropped watch `wd` (its folder is gone)."""
        self.folders.pop(wd, None)
        self._inodes.pop(wd, None)

    def clear(self) -> None:
        self.folders.clear()
        self._inodes.clear()
