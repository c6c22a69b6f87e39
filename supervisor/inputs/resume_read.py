"""Whether a trainer start opened the checkpoint it was given to resume from.

Evidence before blame: a start that dies before it logs a step counts against its
checkpoint only if it read it (core.lifecycle.crashed); a start that died before touching
it (a syntax error in train.py, a missing program, a venv being reinstalled) is the
trainer's failure, and its checkpoints stay as they are.

The executor makes this watch on the checkpoint (the file, a checkpoint folder, or an
in-place trainer's fixed file) just before it forks the trainer, after its own reads of
it (the digest check, a snapshot's restore), so an open reported here is the start's: the
trainer's, or a process it started. The mirror copying that very checkpoint meanwhile
would read as one too (the mirror copies new commits, rarely the one a start resumes
from). Without inotify (no kernel support, the watch limit spent) there is no evidence of
this kind: a start that dies at once is then taken for the trainer's failure.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from trainwarden.supervisor.inputs.inotify import IN_OPEN, Inotify


class ResumeReadWatch:
    """One inotify watch for opens of `path` (or, for a folder, of what is in it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._opened = False
        self._inotify: Inotify | None = None
        try:
            inotify = Inotify()
        except OSError:
            return
        try:
            inotify.add_watch(path, IN_OPEN)
        except OSError:
            inotify.close()
            return
        self._inotify = inotify

    @property
    def watching(self) -> bool:
        """Whether opens can be seen at all (False: no inotify, or no such path)."""
        return self._inotify is not None

    def opened(self) -> bool:
        """Whether anything opened the checkpoint since the watch was made."""
        if not self._opened and self._inotify is not None:
            with contextlib.suppress(OSError):
                self._opened = any(e.mask & IN_OPEN for e in self._inotify.read_events())
        return self._opened

    def close(self) -> None:
        if self._inotify is not None:
            self.opened()  # what is queued still counts
            self._inotify.close()
            self._inotify = None
