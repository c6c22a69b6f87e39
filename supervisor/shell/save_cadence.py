"""The trainer's own checkpoint cadence (every how many steps it saves, and its next save),
inferred from the commits the daemon sees, with the saves the daemon asked for left out;
status and the TUI show the next one."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

OWN_SAVES_KEPT = 16
"""The trainer's own recent saves the cadence is inferred from."""
REQUESTING_SIGNALS = frozenset({"SIGUSR1", "SIGTERM"})
"""Signals the daemon sends that make the trainer save (a save request, a stop)."""


class SaveCadence:
    """The trainer's own checkpoint cadence, told apart from saves the daemon asked for.

    A save the operator asked for (SIGUSR1) or a stop's save (SIGTERM) lands wherever the
    trainer was: with save-every 200, a manual save at 498 must not move the next one
    from 600 to 698. So the commit that follows such a signal is left out, and so is the
    trainer's save at the run's end; the cadence is the greatest common divisor of the
    spacings between the remaining commits, counted from their phase (a trainer that
    saves at 199, 399, ... is on the same 200-step cadence as one at 200, 400). With a
    single own save the cadence is taken to count from step 0.
    """

    def __init__(self, total_steps: int | None = None) -> None:
        self.total_steps = total_steps
        self.own: deque[int] = deque(maxlen=OWN_SAVES_KEPT)
        self.requested = 0
        """Saves signals asked for that have not been committed yet (a save asked while an
        earlier one is still being written is another one to come)."""

    def signalled(self, signal: str) -> None:
        if signal in REQUESTING_SIGNALS:
            self.requested += 1

    def started(self) -> None:
        """A new trainer start: a save asked of the previous one is not coming."""
        self.requested = 0

    def committed(self, step: int) -> None:
        if step <= 0 or step == self.total_steps or step in self.own:
            return
        # On the cadence, a commit after the signal is an own save that was being written
        # when the signal came, not the requested one, which is still to come.
        if self.requested and not self.on_cadence(step):
            self.requested -= 1
            return
        self.own.append(step)

    def on_cadence(self, step: int) -> bool:
        every = self.every
        if every is None:
            return False
        return (step - max(self.own) % every) % every == 0

    def replay(self, records: list[dict[str, Any]]) -> None:
        """Learn from the journal's records (oldest first) what a restarted daemon missed."""
        for record in records:
            kind = record.get("kind")
            if kind == "signal" and isinstance(record.get("signal"), str):
                self.signalled(record["signal"])
            elif kind == "spawn":
                self.started()
            elif kind == "checkpoint" and isinstance(record.get("step"), int):
                self.committed(record["step"])
        self.requested = 0  # a request in flight at the restart is answered or lost

    @property
    def every(self) -> int | None:
        """Steps between the trainer's own saves, None until known."""
        own = sorted(self.own)
        if not own:
            return None
        if len(own) == 1:
            return own[0]
        spacing = 0
        for a, b in zip(own, own[1:], strict=False):
            spacing = math.gcd(spacing, b - a)
        return spacing or None

    def next_after(self, step: int | None) -> int | None:
        """The trainer's next own save after `step`, never past the run's total steps
        (None at or past it, or while the cadence is unknown)."""
        every = self.every
        total = self.total_steps
        if every is None or step is None:
            return None
        if total is not None and step >= total:
            return None
        phase = max(self.own) % every
        following = step + every - (step - phase) % every
        return min(following, total) if total is not None else following
