"""The run's phases: the states of the daemon's state machine, as the wire names them.

    starting --first step line--> running --save--> saving --checkpoint--> running
    running --stop/shutdown--> stopping --trainer exited--> stopped
    running --trainer exited 0 on its own--> finished
    running --crash--> backoff --backoff elapsed--> starting
    running --hang (no step line for stall_timeout_s)--> stopping --exit--> backoff
    backoff --N restarts without progress--> crash_loop
    any restart --no verified checkpoint left, though the run had some--> no_checkpoint
    backoff --stop--> stopped
    running --non-finite or too-high loss--> stopping --exit--> starting (rollback)
                                                            \\-> diverged (same divergence again)
    running --loss spike--> stopping --exit--> starting (rollback, data skipped)
                                           \\-> diverged (max_rollbacks within the horizon)
    running --pivot--> pivoting --checkpoint, stop, archive, policy--> starting
    pivoting --archive or policy write failed--> stopped (start completes the pivot)
    any --reset-class Xid--> stopping --exit, GPU free--> gpu_fault ([gpu] reset: --reset--> starting)
    any --Xid 79, GPU lost to NVML, second memory Xid--> stopping --exit--> gpu_fault
    stopped | finished | crash_loop | diverged | gpu_fault --start--> starting
    no_checkpoint --start --from-scratch--> starting (at step 0)

Each transition is made by the pure policy (trainwarden.supervisor.core) for the cause
named on its arrow; nothing else assigns a phase.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    SAVING = "saving"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    BACKOFF = "backoff"
    CRASH_LOOP = "crash_loop"
    DIVERGED = "diverged"
    PIVOTING = "pivoting"
    GPU_FAULT = "gpu_fault"
    NO_CHECKPOINT = "no_checkpoint"


HALTED: frozenset[Phase] = frozenset(
    {
        Phase.STOPPED,
        Phase.FINISHED,
        Phase.CRASH_LOOP,
        Phase.DIVERGED,
        Phase.GPU_FAULT,
        Phase.NO_CHECKPOINT,
    }
)
"""Phases in which no trainer runs and none will start until the operator says so."""
TRAINER_UP: frozenset[Phase] = frozenset(
    {Phase.STARTING, Phase.RUNNING, Phase.SAVING, Phase.STOPPING, Phase.PIVOTING}
)
"""Phases in which a trainer process is (or is about to be) running."""
STEPPING: frozenset[Phase] = frozenset({Phase.RUNNING, Phase.SAVING})
"""Phases in which the trainer steps: only then are its speed, MFU now and ETA true."""
