"""The policy's clock: a `core.Tick` queued by the state's next deadline (a stall, a kill,
a backoff's end), from one timer.

The timer is moved only when the deadline comes earlier: a step line pushes the stall
deadline later each time, and a timer left armed too early just delivers a Tick that finds
nothing due, once per stall timeout, rather than a timer rescheduled per line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from trainwarden.supervisor.core import policy as core


class Ticks:
    def __init__(self, report: Callable[[Any], None]) -> None:
        self.report = report
        """The daemon's queue."""
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, due: float | None) -> None:
        """Have a Tick queued by `due` (time.monotonic(); None: nothing is due)."""
        if due is None:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + (due - time.monotonic())
        armed = self._handle
        if armed is not None:
            if armed.when() <= when:
                return
            armed.cancel()
        self._handle = loop.call_at(when, self._tick)

    def _tick(self) -> None:
        self._handle = None
        self.report(core.Tick(time.monotonic()))
