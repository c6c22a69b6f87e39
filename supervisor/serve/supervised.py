"""What the control server needs from the daemon it serves (the daemon satisfies it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core.policy import Command, Reply
from trainwarden.supervisor.protocol import (
    CheckpointsView,
    DumpResult,
    HistoryOfResult,
    HistoryResult,
    RelatedRun,
    StateView,
    StatusResult,
)
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.rundir import RunFiles


class Supervised(Protocol):
    cfg: Config
    files: RunFiles
    journal: Journal | None

    async def operator(
        self, command: Command, uid: int | None, progress: Callable[[str], None] | None = None
    ) -> Reply:
        """Have the policy decide on an operator command; its reply. `progress` gets its
        progress lines; cancelling the call abandons the request."""
        ...

    def add_journal_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call `listener` with each journal record as it is appended."""
        ...

    def status_view(self) -> StatusResult: ...

    def checkpoints_view(self) -> CheckpointsView: ...

    def state_view(self) -> StateView: ...

    async def history_query(self, start: int | None, end: int | None, points: int) -> HistoryResult:
        """The decimated loss history (computed off the event loop)."""
        ...

    async def history_of_query(
        self, run: str, start: int | None, end: int | None, points: int, peer: int | None = None
    ) -> HistoryOfResult:
        """Another run's history from its files (off the event loop); NotARun for a path
        that is no run directory, or for `peer` (a client of another user) one that is not
        related to this run or that user may not read."""
        ...

    async def related_runs(self) -> list[RelatedRun]:
        """Runs to overlay on this one: ancestors, then run directories beside it."""
        ...

    async def dump_stacks(self) -> DumpResult | None:
        """Dump the live trainer's stacks now, without stopping it (None: no trainer)."""
        ...

    def snapshot(self, topic: str) -> Any:
        """The newest frame of a telemetry topic."""
        ...
