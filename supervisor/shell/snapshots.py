"""In-place trainers (`[checkpoints] fixed`): the watcher's "the fixed file was written"
becomes a snapshot (or a journaled rejection) off the loop, and every start first puts the
chosen snapshot back at the fixed name (see store.snapshots for the file work, and
store.fixed_folder for a fixed folder, `fixed_commit_file`).

A start that resumes from nothing finds no fixed file: one left there (which did not
verify, or it would have a snapshot) is never resumed from and never silently overwritten
by the fresh trainer. What becomes of it is the policy's to say: the start reports it
(FixedFileLeftover) and is not made; the policy's next Spawn says to move it to
quarantine/ first (`Spawn.leftover`), and that is done here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointFormat
from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.errors import ConfigError
from trainwarden.supervisor.store.appendfile import no_space
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.fixed_folder import FixedFolder, folder_name, step_reader
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.snapshots import FixedFile, Taken, snapshot_name, step_by_regex

log = logging.getLogger("trainwarden.daemon")

SNAPSHOT_RETRY_S = 5.0
"""How often a snapshot that failed on a full disk is tried again."""


def fixed_file(cfg: Config, store: CheckpointStore) -> FixedFile | None:
    """The run's fixed file, checked against its format; None when none is configured."""
    ckpts = cfg.checkpoints
    if ckpts.fixed is None:
        return None
    fmt: CheckpointFormat = store.fmt
    where = f"{cfg.path}: 'checkpoints.fixed' = {ckpts.fixed!r}"
    if fmt.step_of(store.dir / ckpts.fixed) is not None:
        raise ConfigError(
            f"{where} is already a committed checkpoint name for {ckpts.format}: leave "
            "fixed unset, the checkpoints are step-named already"
        )
    if ckpts.fixed_commit_file is not None:
        return _fixed_folder(cfg, store, where)
    if (store.dir / ckpts.fixed).is_dir():
        raise ConfigError(
            f"{where} is a folder in {store.dir}: for a folder the trainer overwrites in "
            "place, name the file in it written last, for example "
            'fixed_commit_file = "trainer_state.json"'
        )
    probe = snapshot_name(ckpts.fixed, 123)
    if fmt.step_of(store.dir / probe) != 123:
        raise ConfigError(
            f"{where} is invalid: its snapshots are named like {probe}, which the "
            f"{ckpts.format} format does not take for a checkpoint of step 123; set "
            "checkpoints.options.pattern to match them"
        )
    if ckpts.step_key is not None:
        step_in = getattr(fmt, "step_in", None)
        if step_in is None:
            raise ConfigError(
                f"{cfg.path}: 'checkpoints.step_key' = {ckpts.step_key!r} is invalid for "
                f"{ckpts.format}, which cannot read keys: use step_regex instead"
            )
        key = ckpts.step_key
        return FixedFile(store.dir, ckpts.fixed, fmt, lambda path: int(step_in(path, key)))
    regex = ckpts.step_regex
    assert regex is not None  # the config's check: one of the two
    return FixedFile(store.dir, ckpts.fixed, fmt, lambda path: step_by_regex(path, regex))


def _fixed_folder(cfg: Config, store: CheckpointStore, where: str) -> FixedFolder:
    """The run's fixed folder: its snapshots must be names the format commits."""
    ckpts = cfg.checkpoints
    fixed, commit = ckpts.fixed, ckpts.fixed_commit_file
    assert fixed is not None and commit is not None
    fmt: CheckpointFormat = store.fmt
    if (store.dir / fixed).exists() and not (store.dir / fixed).is_dir():
        raise ConfigError(
            f"{where} is a file in {store.dir}, but fixed_commit_file = {commit!r} says it is "
            "a folder: leave fixed_commit_file unset for a file"
        )
    probe = folder_name(fmt, fixed, 123)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / probe
        folder.mkdir()
        (folder / commit).touch()
        commits_folder = getattr(fmt, "commits_folder", None)
        if fmt.step_of(folder) != 123 or (
            commits_folder is not None and not commits_folder(folder / commit)
        ):
            raise ConfigError(
                f"{where} is invalid with fixed_commit_file = {commit!r}: its snapshots are "
                f"folders named like {probe} holding {commit}, which the {ckpts.format} format "
                "does not take for a committed checkpoint of step 123 (hf-trainer: "
                'fixed_commit_file = "trainer_state.json")'
            )
    read_step = step_reader(commit, ckpts.step_key, ckpts.step_regex)
    return FixedFolder(store.dir, fixed, fmt, commit, read_step)


class Snapshots:
    """Takes one snapshot at a time; a write seen while one is taken asks for another."""

    def __init__(self, fixed: FixedFile, store: CheckpointStore, journal: Journal) -> None:
        self.fixed = fixed
        self.store = store
        self.journal = journal
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._restoring = False
        self._warming: asyncio.Task[None] | None = None
        self.failing: dict[str, Any] | None = None
        """Why the last snapshots failed, since when and how many in a row (status
        `snapshot_failing`); None once one is taken."""
        self._retry: asyncio.TimerHandle | None = None

    @property
    def path(self) -> Path:
        return self.fixed.path

    def written(self) -> None:
        """The fixed file was closed after a write, or renamed onto (on the loop)."""
        if self._task is not None or self._restoring:
            # One at a time: a restore's own rename onto the fixed name is looked at after it.
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._take_until_settled())

    async def _take_until_settled(self) -> None:
        try:
            while True:
                self._again = False
                await self.take()
                if not self._again:
                    return
        finally:
            self._task = None

    async def settle(self) -> None:
        """Let a snapshot under way finish (before a start replaces the fixed file)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def boot(self) -> None:
        """At start-up: snapshot what the trainer last wrote there (resumed from if it
        verifies); with nothing there, have the step reader ready in the background."""
        if os.path.lexists(self.path):
            await self.take()
        else:
            self._warming = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self.fixed.warm)
            )

    async def take(self) -> Taken | None:
        try:
            taken = await asyncio.to_thread(self.fixed.take)
        except Exception as exc:  # a full disk, or a format plugin's bug: never the loop's
            self._failed(exc)
            return None
        if taken.outcome in ("taken", "known"):
            self._succeeded()
        if taken.outcome == "taken":
            assert taken.step is not None  # a new snapshot always has its step
            self.journal.append(
                {
                    "kind": "snapshot_taken",
                    "fixed": self.fixed.fixed,
                    "step": taken.step,
                    "name": taken.name,
                    "how": taken.how,
                    "bytes": taken.bytes,
                },
            )
        elif taken.outcome == "rejected":
            self.journal.append(
                {"kind": "fixed_write_rejected", "fixed": self.fixed.fixed, "reason": taken.reason}
            )
        return taken

    def _failed(self, exc: Exception) -> None:
        """A snapshot failed: journaled; the first of a run of failures alerts (the
        journal's `snapshot_failed` with `first`), status says why; on a full disk it is
        tried again every SNAPSHOT_RETRY_S until space returns."""
        reason = f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
        first = self.failing is None
        now = time.time()
        self.failing = {
            "reason": reason,
            "since": self.failing["since"] if self.failing else now,
            "count": (self.failing["count"] if self.failing else 0) + 1,
        }
        self.journal.append(
            {"kind": "snapshot_failed", "fixed": self.fixed.fixed, "error": reason, "first": first}
        )
        log.error("snapshot of %s failed: %s", self.fixed.path, reason)
        if isinstance(exc, OSError) and no_space(exc):
            self.journal.space.filled(
                self.fixed.path, exc, "its snapshot is taken again when space returns"
            )
            if self._retry is None:
                self._retry = asyncio.get_running_loop().call_later(
                    SNAPSHOT_RETRY_S, self._retry_now
                )

    def _retry_now(self) -> None:
        self._retry = None
        self.written()

    def _succeeded(self) -> None:
        if self.failing is not None:
            self.journal.append(
                {
                    "kind": "snapshot_recovered",
                    "fixed": self.fixed.fixed,
                    "failed": self.failing["count"],
                }
            )
            self.failing = None
        self.journal.space.emptied(self.fixed.path, "its snapshot was taken")

    async def prepare(
        self, resume: core.Ckpt | None, leftover: core.Quarantine | None = None
    ) -> str | core.FixedFileLeftover | None:
        """Before a start: the snapshot it resumes from at the fixed name, or no fixed file
        for a fresh start. Why it could not be done, or None.

        A fresh start that finds a file at the fixed name moves it to quarantine/ as
        `leftover` (the policy's) says; with no `leftover`, nothing is done and the event
        for the policy (FixedFileLeftover) is returned instead.

        What the fixed file holds is snapshotted first (a write whose snapshot failed, on a
        full disk say): if that is newer than `resume`, it is not overwritten; the start is
        refused, and the next one resumes from the new snapshot."""
        await self.settle()
        if resume is not None and os.path.lexists(self.path):
            taken = await self.take()
            newer = (
                taken is not None
                and taken.outcome == "taken"
                and taken.step is not None
                and taken.step > resume.step
            )
            if newer:
                assert taken is not None
                return (
                    f"{self.fixed.fixed} holds step {taken.step}, newer than {resume.name}:"
                    f" snapshotted as {taken.name} and not overwritten"
                )
        if resume is None:
            return await self._clear(leftover)
        self._restoring = True
        try:
            how = await asyncio.to_thread(self.fixed.restore, resume.name)
        except (OSError, ValueError) as exc:
            reason = f"cannot restore {resume.name} to {self.fixed.fixed}: " + (
                f"{getattr(exc, 'strerror', None) or exc}"
            )
            self.journal.append(
                {"kind": "snapshot_restore_failed", "name": resume.name, "error": reason}
            )
            return reason
        finally:
            self._restoring = False
            if self._again:
                self._again = False
                self.written()
        self.journal.append(
            {
                "kind": "snapshot_restored",
                "fixed": self.fixed.fixed,
                "step": resume.step,
                "name": resume.name,
                "how": how,
            },
        )
        return None

    async def _clear(self, leftover: core.Quarantine | None) -> str | core.FixedFileLeftover | None:
        if not self.path.exists() and not self.path.is_symlink():
            return None
        if leftover is None:
            return core.FixedFileLeftover(time.monotonic(), self.fixed.fixed)
        try:
            moved = await asyncio.to_thread(self.store.quarantine, leftover.name)
        except (OSError, ValueError) as exc:
            reason = f"cannot move {leftover.name} to quarantine/: " + (
                f"{getattr(exc, 'strerror', None) or exc}"
            )
            self.journal.append(
                {"kind": "quarantine_failed", "name": leftover.name, "error": reason}
            )
            return reason
        self.journal.append(
            {
                "kind": "quarantine",
                "step": leftover.step,
                "name": leftover.name,
                "moved": moved,
                "reason": leftover.reason,
            },
        )
        return None
