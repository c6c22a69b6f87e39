"""[slurm] signal (USR1 by default) as the daemon takes it.

In a Slurm job it is the job's pre-timeout signal: shell.slurm.JobWatch asks the policy to
leave before the limit. One that comes while the daemon is still starting (asking Slurm,
scanning checkpoints) is held, and acted on once the start is queued, so that the trainer
it stops is the one that start makes. Outside a job it asks nothing: it is journaled as
ignored, the first at once and those that follow within IGNORED_SIGNAL_S counted and said
together, so that a flood of them cannot flood the journal.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from trainwarden.supervisor.shell.slurm import JobWatch
from trainwarden.supervisor.store.journal import Journal

log = logging.getLogger("trainwarden.daemon")

IGNORED_SIGNAL_S = 60.0
"""A signal ignored outside a Slurm job is said at once, then those that follow within this
long are counted and said together."""


class JobSignal:
    def __init__(self, in_job: bool) -> None:
        self.in_job = in_job
        self.watch: JobWatch | None = None
        """The job's segment, once the journal is read (None outside a job)."""
        self.journal: Journal | None = None
        self.held: list[str] | None = []
        """Signals that came before the start was queued; None from then on (each is acted
        on as it comes)."""
        self._ignored = 0
        """Signals ignored and not said yet."""
        self._said: asyncio.TimerHandle | None = None

    def caught(self, sig: int) -> None:
        """The signal handler."""
        name = signal.Signals(sig).name
        if not self.in_job:
            self._ignored += 1
            if self._said is None:
                self._say_ignored(name)
            return
        if self.held is not None:
            log.info("%s during the start: acted on once the run is up", name)
            self.held.append(name)
        elif self.watch is not None:
            self.watch.signalled(name)

    def started(self) -> None:
        """The start is queued: a signal held until now is acted on (after the start, so
        the trainer it asks to stop is that start's)."""
        held, self.held = self.held, None
        if held and self.watch is not None:
            self.watch.signalled(held[0])

    def close(self) -> None:
        if self._said is not None:
            self._said.cancel()  # the journal is closed
            self._said = None

    def _say_ignored(self, name: str) -> None:
        """Journal the signals ignored since the last time this said them, if any; the
        next ones wait IGNORED_SIGNAL_S to be said."""
        count, self._ignored = self._ignored, 0
        self._said = None
        if not count:
            return
        log.warning("%s ignored (%d): this daemon is not in a Slurm job", name, count)
        if self.journal is not None:
            self.journal.append(
                {
                    "kind": "signal_ignored",
                    "signal": name,
                    "count": count,
                    "reason": "not in a Slurm job ([slurm] signal)",
                },
            )
        self._said = asyncio.get_running_loop().call_later(
            IGNORED_SIGNAL_S, self._say_ignored, name
        )
