"""The daemon's exit status, a contract with whatever started it (docs/exit-codes.md).

Each status tells a scheduler what to do next: nothing (finished, stopped), not to retry
(a bad config, a halt that needs a person), to retry (an unexpected error), or to queue
the run again (requeue). The systemd unit's RestartPreventExitStatus= is generated from
RESTART_PREVENTED, and a test checks docs/exit-codes.md's table against ExitCode, so the
three cannot drift apart.

Codes avoid the conventions a scheduler reads on its own: 1 is Python's uncaught
exception, 2 bad usage or config (argparse's too), 126/127 the shell's, 128+N death by
signal N, 200-243 systemd's own start failures.
"""

from __future__ import annotations

from enum import IntEnum

from trainwarden.supervisor.core.phases import HALTED, Phase


class ExitCode(IntEnum):
    """What the daemon's exit status means; STOPPED is FINISHED's alias (both 0)."""

    FINISHED = 0
    """The trainer exited 0 on its own, the run's end; the daemon exited when told to."""
    STOPPED = 0
    """Stopped by the operator (`shutdown`) or by SIGTERM/SIGINT before the run finished;
    the run resumes from its newest verified checkpoint when a daemon starts again. 0, not
    a code of its own: systemd's stop must not count as a failure, and Restart=on-failure
    must not undo the operator's `shutdown`; the trainer contract's "0 when done or
    stopped on request" says the same."""
    ERROR = 1
    """An unexpected error (a traceback), or a failed operation such as a held lock."""
    CONFIG = 2
    """Bad usage or configuration: the same command fails again until someone edits it."""
    HALTED = 3
    """Stopped while halted for the operator: crash loop, divergence, a GPU fault that
    needs a reset or a reboot, no checkpoint to resume from. A restart repeats the halt."""
    REQUEUE = 75
    """Stopped to be queued again (sysexits' EX_TEMPFAIL): a daemon in a Slurm job left
    before its time limit, after the trainer's save and `scontrol requeue` (core.requeue)."""


RESTART_PREVENTED: tuple[ExitCode, ...] = (ExitCode.CONFIG, ExitCode.HALTED)
"""Statuses systemd's Restart=on-failure must not restart (RestartPreventExitStatus=):
a restart cannot fix a config; a halted daemon comes back halted (its phase is in the
journal), and restarting it would undo the operator's `shutdown`."""


def exit_code_for(phase: Phase) -> ExitCode:
    """The status the daemon exits with when it exits in `phase`: told to (the operator's
    `shutdown`, SIGTERM or SIGINT), or in a Slurm job when the run ends (core.requeue).
    Leaving a job to be requeued exits REQUEUE instead (transitions.shutdown_exit)."""
    if phase == Phase.FINISHED:
        return ExitCode.FINISHED
    if phase in HALTED - {Phase.STOPPED}:
        return ExitCode.HALTED
    return ExitCode.STOPPED
