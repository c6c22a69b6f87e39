"""Time slices for answering control requests, so many busy clients cannot starve the loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

SLICE_S = 0.002
"""Request work the loop does between two looks at its other events (the log, the
trainer, timers): past it, the remaining requests wait for the next turn."""


class Turns:
    """Time slices for answering requests, so many busy clients cannot starve the loop:
    within one pass of the loop requests are answered for at most SLICE_S, then the rest
    wait until the loop has been round once (its I/O and timers handled).

    A request's work is done inside its turn (see control.ControlServer._answer), so the slice
    measures it. Requests past the slice queue in arrival order and are woken a slice's
    worth at a time (sized by what the last slice answered), one batch per pass: a crowd of
    waiting clients costs the loop nothing until its turn comes.
    """

    def __init__(self) -> None:
        self.slice_start: float | None = None
        self.answered = 0
        """Turns given in the current slice (what the next batch of waiters is sized by)."""
        self.exhausted = False
        """The current slice ran out (someone found no time left in it)."""
        self.waiting: deque[tuple[asyncio.Future[None], Callable[[], bool]]] = deque()
        self.firsts: deque[tuple[asyncio.Future[None], Callable[[], bool]]] = deque()
        """Connections' first requests: woken before the others."""
        self.woken: deque[tuple[asyncio.Future[None], Callable[[], bool]]] = deque()
        """Waiters woken for a slice that ended before they ran: first in the next."""
        self.scheduled = False

    async def turn(self, moot: Callable[[], bool] = lambda: False, first: bool = False) -> None:
        """Wait for a turn; `moot` says the turn is no longer wanted (its client left): it
        is then given at once, without counting against the slice or the batch. A `first`
        request (a connection's first) waits only behind other first ones: a client that
        asks once is never queued behind the pipelines of clients that ask thousands."""
        loop = asyncio.get_running_loop()
        woken = False
        while True:
            if woken and moot():
                return
            now = time.monotonic()
            if self.slice_start is None:
                # The slice lasts for the rest of this pass: the reset runs in the next.
                self.slice_start = now
                self.answered = 0
                self.exhausted = False
                self._schedule(loop)
            queued = bool(self.firsts or self.woken or (self.waiting and not first))
            if now - self.slice_start < SLICE_S:
                if woken or not queued:
                    self.answered += 1
                    return
            else:
                self.exhausted = True
            place = loop.create_future()
            (self.woken if woken else self.firsts if first else self.waiting).append((place, moot))
            self._schedule(loop)
            try:
                await place
            except asyncio.CancelledError:
                for queue in (self.firsts, self.waiting, self.woken):
                    with contextlib.suppress(ValueError):
                        queue.remove((place, moot))
                raise
            woken = True

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.scheduled:
            self.scheduled = True
            loop.call_soon(self._next_slice)

    def _next_slice(self) -> None:
        self.scheduled = False
        self.slice_start = None
        # As many as the last slice had time for; twice as many if it had time left.
        batch = max(1, self.answered if self.exhausted else 2 * self.answered)
        ready, self.woken = self.woken, deque()
        while batch and (ready or self.firsts or self.waiting):
            queue = ready if ready else self.firsts if self.firsts else self.waiting
            place, moot = queue.popleft()
            if not place.done():
                place.set_result(None)
                batch -= 0 if moot() else 1
        self.woken.extend(ready)
        if self.woken or self.firsts or self.waiting:
            # Wake the next batch in the next pass, whoever else asks for a turn.
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._next_slice)
