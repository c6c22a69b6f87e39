"""The moves several handlers share: start a trainer, stop it, answer waiting requests."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainwarden.supervisor.core.actions import (
    Action,
    Exit,
    Progress,
    Quarantine,
    Record,
    Reply,
    Requeue,
    SignalTrainer,
    Spawn,
)
from trainwarden.supervisor.core.exit_codes import ExitCode, exit_code_for
from trainwarden.supervisor.core.kinds import ErrorCode
from trainwarden.supervisor.core.phases import Phase
from trainwarden.supervisor.core.spikes import Detector
from trainwarden.supervisor.core.state import RestartCause, Rules, State, StopReason, ckpt_json

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import StopFacts

NO_CHECKPOINT_INSTRUCTION = (
    "`trainwarden start --from-scratch RUN` starts over at step 0"
    " (or put a verified checkpoint back in the checkpoint folder and `trainwarden start RUN`)"
)


def no_checkpoint_left(state: State, actions: list[Action]) -> State:
    """A restart with no verified checkpoint left in a run that had some (quarantined,
    deleted, set aside): halt and say so, rather than throw the run's progress away."""
    reason = (
        f"no verified checkpoint is left to resume from (the run had reached a checkpoint at"
        f" step {state.verified_high}); starting over is the operator's choice"
    )
    actions.append(
        Record(
            {
                "kind": "halt",
                "state": str(Phase.NO_CHECKPOINT),
                "verified_high": state.verified_high,
                "reason": reason,
                "instruction": NO_CHECKPOINT_INSTRUCTION,
            },
        )
    )
    state = fail_waiters(state, actions, "no_checkpoint", f"{reason}: {NO_CHECKPOINT_INSTRUCTION}")
    return replace(
        state,
        phase=Phase.NO_CHECKPOINT,
        spawn_due=False,
        backoff_until=None,
        stop_reason=None,
        halt_reason=reason,
    )


def spawn(
    state: State,
    t: float,
    actions: list[Action],
    cause: RestartCause | None = None,
    leftover: Quarantine | None = None,
) -> State:
    """Start a trainer from the newest verified checkpoint, once no checkpoint committed
    before now is still being verified (see core.barrier). From scratch only for a run that
    never had a verified checkpoint, or when the operator asked for it; otherwise halt in
    no_checkpoint.

    `cause`: what the start is counted under once made (see state.with_start_counted);
    None keeps the cause already decided (a start that waited, or replaces a refused one).
    `leftover`: the Spawn's, for a file left at an in-place trainer's fixed name (a start
    that waits drops it: the file is reported again when the start is made)."""
    if cause is not None:
        state = replace(state, restart_cause=cause)
    if state.pending or state.containing:
        if not state.spawn_due and state.pending:
            actions.append(
                Record(
                    {
                        "kind": "awaiting_verification",
                        "for": "trainer start",
                        "names": [p.name for p in state.pending],
                    },
                )
            )
        return replace(
            state,
            phase=Phase.STARTING,
            spawn_due=True,
            last_step=None,
            last_activity_t=t,
            stop_reason=None,
            kill_at=None,
            dump_until=None,
            stop_exit=None,
            backoff_until=None,
            halt_reason=None,
        )
    resume = state.newest
    if resume is None and state.verified_high is not None and not state.from_scratch:
        return no_checkpoint_left(state, actions)
    if resume is None and state.from_scratch:
        actions.append(Record({"kind": "start_from_scratch", "verified_high": state.verified_high}))
        state = replace(state, verified_high=None)
    state = replace(state, from_scratch=False)
    seg = state.seg + 1
    # A checkpoint from before the last pivot carries the old policy's bandit: the trainer
    # must start its bandit fresh under the new policy.json (weights and moments stay).
    pivot = (
        resume is not None
        and state.last_pivot_step is not None
        and resume.step <= state.last_pivot_step
    )
    spikes = state.spikes
    new_windows = spikes.windows[spikes.passed :]
    timeline = (seg, min(a for a, _ in new_windows)) if new_windows else spikes.timeline
    rollback_from = state.rollback_from
    if rollback_from is None and spikes.rolling_back is not None:
        # A spike's rollback whose own restart never came (a shutdown, a stop, a daemon
        # that died came between): this start is it, and its record says so.
        rollback_from = spikes.rolling_back[0]
    actions.append(
        Spawn(
            seg=seg,
            resume=resume,
            pivot=pivot,
            rollback_from=rollback_from,
            skip_data=spikes.windows,
            lr_scale=spikes.lr_scale,
            timeline=timeline,
            leftover=leftover,
        )
    )
    # The new start's spike detector begins from the EMAs as of the step it resumes from.
    detector = Detector.starting_from(spikes.baseline(resume.step if resume else None))
    return replace(
        state,
        spikes=replace(
            spikes,
            detector=detector,
            rolling_back=None,
            passed=len(spikes.windows),
            timeline=timeline,
        ),
        phase=Phase.STARTING,
        seg=seg,
        resume_step=resume.step if resume else None,
        last_step=None,
        last_activity_t=t,
        stop_reason=None,
        kill_at=None,
        dump_until=None,
        stop_exit=None,
        stop_from=None,
        backoff_until=None,
        progress_since_start=False,
        poisoned_from=None,
        halt_reason=None,
        commits_without_steps=0,
        step_at_commit=None,
    )


def halts_on_divergence(state: State, rules: Rules) -> bool:
    """A trainer killed for a divergence is not restarted: the run halts in `diverged`
    (too many fallbacks in a row, or the same divergence again)."""
    return state.fallbacks > rules.max_fallbacks or state.divergences > rules.divergence_retries


def stop_trainer(
    state: State, t: float, rules: Rules, reason: StopReason, actions: list[Action]
) -> State:
    """SIGTERM now, SIGKILL if it has not exited within stop_timeout_s."""
    actions.append(SignalTrainer("SIGTERM", reason))
    return replace(
        state,
        phase=Phase.STOPPING,
        stop_reason=reason,
        kill_at=t + rules.stop_timeout_s,
        dump_until=None,
        stop_from=state.newest.step if state.newest else -1,
    )


def last_logged(state: State) -> int | None:
    """The trainer's last logged step (none logged since it started: its resume step)."""
    return state.last_step if state.last_step is not None else state.resume_step


def steps_lost(state: State) -> int:
    """Steps logged beyond the newest verified checkpoint: what a stop now would lose."""
    last = last_logged(state)
    if last is None:
        return 0
    return max(0, last - (state.newest.step if state.newest else 0))


def stop_result(state: State) -> tuple[StopFacts, str]:
    """What a stop came to: saved and exited, exited without saving, killed after
    stop_timeout_s (each with the steps lost), or no trainer was running; and its message."""
    newest = state.newest
    lost = steps_lost(state)
    ended = state.stop_exit
    where = f"checkpoint step {newest.step}" if newest else "no checkpoint"
    newest_where = f"newest {where}" if newest else "no checkpoint yet"
    if ended is None:
        outcome, message = "not_running", f"no trainer was running; {newest_where}"
    elif ended.startswith(("killed after", "killed at")):
        outcome, message = "killed", f"{ended} (steps lost: {lost}); {newest_where}"
    elif lost == 0 and ended.startswith("killed by") and not saved_on_stop(state):
        # The signal ended it (no handler): whatever it had saved before, it saved nothing.
        outcome = "exited_without_saving"
        kept = f"its last step is the {where}" if newest else "it had logged no step"
        message = f"{ended} without saving; nothing lost: {kept}"
    elif lost == 0:
        outcome, message = "saved", f"saved and exited ({ended}); {where}"
    else:
        outcome = "exited_without_saving"
        message = f"exited without saving (steps lost: {lost}): {ended}; {newest_where}"
    facts: StopFacts = {
        "outcome": outcome,
        "steps_lost": lost,
        "last_step": last_logged(state),
        "exit": ended,
    }
    return facts, message


def saved_on_stop(state: State) -> bool:
    """A checkpoint newer than the one there when the stop's SIGTERM went out."""
    newest = state.newest.step if state.newest else -1
    return state.stop_from is None or newest > state.stop_from


def finish_stop(state: State, actions: list[Action], extra: dict[str, Any]) -> State:
    """The trainer is stopped: answer stop and shutdown requests with what happened (see
    stop_result), the newest verified checkpoint and `extra`; journal the same as
    `stop_outcome`; fail the other waiters, and exit after a shutdown."""
    outcome, message = stop_result(state)
    # The trainer is stopped either way; a run that halted meanwhile (its loss diverged for
    # good, a GPU fault) says which halt.
    ended = state.phase if state.phase in (Phase.DIVERGED, Phase.GPU_FAULT) else "stopped"
    result = {
        "state": str(ended),
        "checkpoint": ckpt_json(state.newest),
        **outcome,
        "message": message,
        **extra,
    }
    newest = state.newest
    actions.append(
        Record(
            {
                "kind": "stop_outcome",
                **outcome,
                "checkpoint_step": newest.step if newest else None,
            },
        )
    )
    state = settle_waiters(state, actions, kind="stop", result=result)
    state = fail_waiters(state, actions, "wrong_state", "the trainer stopped")
    if state.shutdown:
        shutdown_exit(state, actions)
    return replace(state, stop_due=False, stop_exit=None, stop_from=None)


def save_late(state: State, t: float, what: str, actions: list[Action]) -> None:
    """Journal that the job's deadline cut the save short (`what`: what was given up)."""
    if state.requeue is not None:
        actions.append(
            Record(
                {
                    "kind": "slurm_save_late",
                    "gave_up": what,
                    "last_step": state.last_step,
                    "late_s": round(t - state.requeue.by, 3),
                },
            )
        )


def shutdown_exit(state: State, actions: list[Action], phase: Phase | None = None) -> None:
    """The daemon's exit once a shutdown has stopped the trainer, in `phase` (default: the
    state's). Leaving a Slurm job (state.requeue), a run that is neither finished nor halted
    has the job requeued first and exits REQUEUE; a run that finished or halted meanwhile
    exits as it would have, not requeued."""
    phase = state.phase if phase is None else phase
    code = exit_code_for(phase)
    if state.requeue is not None and phase != Phase.FINISHED and code == ExitCode.STOPPED:
        actions.append(Requeue(state.requeue.scontrol))
        code = ExitCode.REQUEUE
    elif state.requeue is not None:
        actions.append(
            Record({"kind": "slurm_not_requeued", "phase": str(phase), "reason": state.halt_reason})
        )
    actions.append(Exit(code))


def tell(state: State, actions: list[Action], message: str, kind: str = "stop") -> None:
    """A progress line for every request of `kind` still waiting."""
    for w in state.waiters:
        if w.kind == kind:
            actions.append(Progress(w.request_id, message))


def supersede_saves(state: State, actions: list[Action], by: str) -> State:
    """A stop or shutdown pre-empts a waiting save: answer it, never leave it blocking."""
    saves = [w for w in state.waiters if w.kind == "save"]
    for w in saves:
        reply_error(actions, w.request_id, "superseded", f"superseded by {by}")
    if not saves:
        return state
    return replace(state, waiters=tuple(w for w in state.waiters if w.kind != "save"))


def exit_text(returncode: int, signal_name: str | None = None) -> str:
    """A stopped trainer's end for the operator: "exited 0", "killed by SIGTERM"."""
    if returncode < 0:
        return describe_exit(returncode, signal_name)
    return f"exited {returncode}"


def reply_error(actions: list[Action], request_id: int, code: ErrorCode, message: str) -> None:
    actions.append(Reply(request_id, ok=False, code=code, message=message))


def settle_waiters(
    state: State, actions: list[Action], *, kind: str, result: dict[str, Any]
) -> State:
    """Answer every waiter of `kind` with `result`."""
    done = [w for w in state.waiters if w.kind == kind]
    for w in done:
        actions.append(Reply(w.request_id, ok=True, result=result))
    return replace(state, waiters=tuple(w for w in state.waiters if w.kind != kind))


def fail_waiters(state: State, actions: list[Action], code: ErrorCode, message: str) -> State:
    for w in state.waiters:
        reply_error(actions, w.request_id, code, message)
    return replace(state, waiters=())


def describe_exit(returncode: int, signal_name: str | None = None) -> str:
    """How a trainer ended, for the journal and the operator ("killed by SIGKILL")."""
    if returncode < 0:
        return f"killed by {signal_name or f'signal {-returncode}'}"
    return f"exit status {returncode}"
