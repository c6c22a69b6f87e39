"""Stray output: lines the run log gains while no start's main process runs (a leftover
helper's, an orphaned worker's). They are counted and journaled, never decided on: one
`stray_output` record for many lines, at most one per STRAY_INTERVAL_S while they keep
coming.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainwarden.supervisor.store.journal import Journal

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import StrayOutput

log = logging.getLogger("trainwarden.telemetry")

STRAY_INTERVAL_S = 5.0
"""At most one `stray_output` record per this many seconds while lines keep coming."""
FIRST_LINE_CHARS = 500


class StrayLines:
    def __init__(
        self, journal: Journal, loop: asyncio.AbstractEventLoop, is_step: Callable[[str], bool]
    ) -> None:
        self.journal = journal
        self.loop = loop
        self.is_step = is_step
        """Whether a line is a step line to the configured parser (counted apart)."""
        self._counted: StrayOutput | None = None
        self._handle: asyncio.TimerHandle | None = None

    def note(self, seg: int, lines: list[str]) -> None:
        """Count the non-blank `lines`, read after segment `seg` ended."""
        lines = [line for line in lines if line.strip()]
        if not lines:
            return
        if self._counted is None:
            self._counted = {
                "kind": "stray_output",
                "seg": seg,
                "lines": 0,
                "step_lines": 0,
                "first": lines[0][:FIRST_LINE_CHARS],
            }
            self._handle = self.loop.call_later(STRAY_INTERVAL_S, self.flush)
        self._counted["lines"] += len(lines)
        self._counted["step_lines"] += sum(self.is_step(line) for line in lines)

    def flush(self) -> None:
        """Journal the lines counted so far."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        counted, self._counted = self._counted, None
        if counted is not None:
            self.journal.append(counted)
            log.warning("%d stray log lines after seg %s ended", counted["lines"], counted["seg"])
