"""decide(state, event, rules) -> (state, actions): which handler takes an event, and
deadline(state, rules): when the daemon must wake the policy if nothing else happens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainwarden.supervisor.core import (
    barrier,
    commands,
    gpu_faults,
    lifecycle,
    pivot,
    progress,
    requeue,
    retention,
    startup,
)
from trainwarden.supervisor.core.actions import Action
from trainwarden.supervisor.core.events import (
    CheckpointChanged,
    CheckpointCommitted,
    CheckpointRejected,
    CheckpointSeen,
    CheckpointUnchanged,
    CheckpointVanished,
    CheckpointWriting,
    Event,
    FixedFileLeftover,
    GpuFault,
    GpuIdle,
    GpuLost,
    GpuResetDone,
    MirrorCopied,
    MirrorPointer,
    Operator,
    ParserNoMatch,
    PivotProgress,
    RequestAbandoned,
    RequeueRequested,
    Restored,
    ResumeRefused,
    ShutdownRequested,
    SpawnFailed,
    StacksDumped,
    StartContained,
    Startup,
    StepLogged,
    Tick,
    TrainerExited,
    TrainerSpawned,
)
from trainwarden.supervisor.core.state import Rules, State

HANDLERS: dict[type, Callable[[State, Any, Rules, list[Action]], State]] = {
    Restored: startup.on_restored,
    Startup: startup.on_startup,
    CheckpointSeen: progress.on_seen,
    CheckpointCommitted: progress.on_committed,
    CheckpointChanged: progress.on_changed,
    CheckpointUnchanged: progress.on_unchanged,
    ResumeRefused: lifecycle.on_resume_refused,
    FixedFileLeftover: lifecycle.on_fixed_file_leftover,
    CheckpointRejected: progress.on_rejected,
    CheckpointVanished: progress.on_vanished,
    CheckpointWriting: progress.on_writing,
    StepLogged: progress.on_step,
    ParserNoMatch: lifecycle.on_parser_no_match,
    TrainerSpawned: lifecycle.on_spawned,
    SpawnFailed: lifecycle.on_spawn_failed,
    TrainerExited: lifecycle.on_exited,
    StacksDumped: lifecycle.on_dumped,
    StartContained: lifecycle.on_contained,
    Tick: lifecycle.on_tick,
    Operator: commands.on_operator,
    RequestAbandoned: commands.on_abandoned,
    ShutdownRequested: lifecycle.on_shutdown,
    RequeueRequested: requeue.on_requeue,
    PivotProgress: pivot.on_progress,
    MirrorPointer: progress.on_mirror_pointer,
    MirrorCopied: retention.on_mirror_copied,
    GpuFault: gpu_faults.on_fault,
    GpuLost: gpu_faults.on_lost,
    GpuIdle: gpu_faults.on_idle,
    GpuResetDone: gpu_faults.on_reset_done,
}


def decide(state: State, event: Event, rules: Rules) -> tuple[State, list[Action]]:
    """The policy: the next state and what to do, for one event."""
    actions: list[Action] = []
    before = state
    if isinstance(event, Tick) and state.pending:
        state = barrier.give_up_overdue(state, event.t, rules, actions)
    state = HANDLERS[type(event)](state, event, rules, actions)
    if not isinstance(event, Restored):
        state = barrier.release(state, event.t, rules, actions)
    if rules.exit_when_ended:
        state = requeue.ended_in_job(before, state, event, rules, actions)
    return state, actions


def deadline(state: State, rules: Rules) -> float | None:
    """When the daemon must send the next Tick, if no other event arrives first."""
    times = [state.kill_at, state.dump_until, state.backoff_until]
    if state.phase in lifecycle.TRAINER_WORKING and state.trainer_alive:
        times.append(state.last_activity_t + rules.stall_timeout_s)
    times.extend(w.deadline for w in state.waiters if w.kind != "start")
    times.append(barrier.deadline(state, rules))
    if state.pivot is not None and state.pivot.stage == "saving":
        times.append(state.pivot.deadline)
    pending = [t for t in times if t is not None]
    return min(pending) if pending else None
