"""Checkpoints as the policy hears of them: each committed one verified (in a thread) and
reported once, as the start-up scan's verdicts or as an event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.shell.hub import TelemetryHub
from trainwarden.supervisor.store.checkpoints import CheckpointStore


class CheckpointReports:
    def __init__(
        self, store: CheckpointStore, hub: TelemetryHub, report: Callable[[core.Event], None]
    ) -> None:
        self.store = store
        self.hub = hub
        self.report = report
        self.known_commits: dict[str, float] = {}
        """name -> mtime of each commit reported (the watcher repeats itself); the executor
        forgets a name once it deletes or quarantines it."""

    async def scan(self) -> tuple[core.Scanned, ...]:
        """Every committed checkpoint in the directory, verified, oldest first."""
        names, _ = self.store.scan()
        verdicts = await asyncio.to_thread(lambda: [self.store.verify(n) for n in names])
        scanned = []
        for verdict in verdicts:
            if verdict.info is None:
                scanned.append(
                    core.Scanned(verdict.name, verdict.step, verdict.outcome, verdict.reason)
                )
                continue
            mtime = verdict.info.path.stat().st_mtime
            self.known_commits[verdict.name] = mtime
            scanned.append(
                core.Scanned(
                    verdict.name,
                    verdict.info.step,
                    verdict.outcome,
                    bytes=verdict.info.bytes,
                    mtime=mtime,
                )
            )
            self.hub.checkpoint_seen(verdict.info)
        return tuple(scanned)

    def committed(self, name: str) -> None:
        """The watcher saw `name` committed: verify it and report the verdict."""
        asyncio.get_running_loop().create_task(self._verify_and_report(name))

    async def _verify_and_report(self, name: str) -> None:
        verdict = await asyncio.to_thread(self.store.verify, name)
        info, outcome, mtime = verdict.info, verdict.outcome, 0.0
        if info is not None:
            try:
                mtime = info.path.stat().st_mtime
            except FileNotFoundError:
                outcome = core.Outcome.VANISHED
            else:
                if self.known_commits.get(name) == mtime:
                    return  # the watcher's second word on a commit already reported
                self.known_commits[name] = mtime
                self.hub.checkpoint_seen(info)
        self.report(
            core.checkpoint_event(
                time.monotonic(),
                name,
                info.step if info is not None else verdict.step,
                outcome,
                verdict.reason,
                info.bytes if info is not None else 0,
                mtime,
            )
        )
