"""Names in the checkpoint directory that the format does not read, reported once each.

A name that is none of these (no checkpoint, no write in flight, no companion of a
checkpoint there) is reported to on_unrecognised once, with whether it is a folder: the
trainer saves under names the format does not read. It is judged JUDGE_AFTER_S after it
appeared, in a worker thread, and not while anything is in flight there (a sidecar comes
before its checkpoint); quarantine/ and dot-names are never judged. The names there at
start are judged the same way. on_resolved hears of a reported name that went away.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwarden.supervisor.store.checkpoints import QUARANTINE, CheckpointStore

log = logging.getLogger("trainwarden.checkpoints")

JUDGE_AFTER_S = 1.0
"""How long after a name appears it is judged (recognised or not), and how often again
while a write is in flight."""
DEFER_MAX_S = 600.0
"""A name is judged after this long even if something stays in flight all that time."""


class UnrecognisedNames:
    """The names seen appearing in the checkpoint directory, judged on `loop` (the
    judging itself in a worker thread); consider() and gone() on the loop's thread."""

    def __init__(
        self,
        store: CheckpointStore,
        loop: asyncio.AbstractEventLoop,
        on_unrecognised: Callable[[str, bool], None] | None,
        on_resolved: Callable[[str], None] | None,
        fixed: Path | None,
    ) -> None:
        self.store = store
        self.loop = loop
        self.on_unrecognised = on_unrecognised
        """A name the format does not read (and whether it is a folder), once per name."""
        self.on_resolved = on_resolved
        """A name reported to on_unrecognised is gone (deleted, renamed away)."""
        self.fixed = fixed
        """An in-place trainer's fixed file or folder: never judged."""
        self._candidates: dict[str, float] = {}  # name -> when it was first seen
        self._reported: set[str] = set()
        self._judging: asyncio.TimerHandle | asyncio.Future[Any] | None = None
        self._stopped = False

    def start(self) -> None:
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True
        if isinstance(self._judging, asyncio.TimerHandle):
            self._judging.cancel()
        self._judging = None

    def consider(self, path: Path) -> None:
        """`path` appeared in the directory: judge it soon unless its name says what it is
        (the checks the commit rule makes for every event anyway)."""
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

    def gone(self, name: str) -> None:
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
