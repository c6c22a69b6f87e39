"""The trainer's life cycle: spawn and exit, a start refused or failed, ticks (backoff over,
hang, kill deadline), stack dumps, shutdown. The daemon's start is core.startup; a crash's
backoff or halt is core.crashes."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from trainwarden.supervisor.core import barrier, gpu_faults, pivot, rollback
from trainwarden.supervisor.core.actions import (
    Action,
    DumpStacks,
    Quarantine,
    Record,
    Reply,
    SignalTrainer,
)
from trainwarden.supervisor.core.crashes import crashed, hang_cause
from trainwarden.supervisor.core.events import (
    FixedFileLeftover,
    ParserNoMatch,
    ResumeRefused,
    ShutdownRequested,
    SpawnFailed,
    StacksDumped,
    StartContained,
    Tick,
    TrainerExited,
    TrainerSpawned,
)
from trainwarden.supervisor.core.phases import HALTED, Phase
from trainwarden.supervisor.core.retention import abandon_changed
from trainwarden.supervisor.core.state import (
    KILLS_TO_RESTART,
    GpuFaultInfo,
    Rules,
    State,
    StopReason,
    Waiter,
    with_start_counted,
)
from trainwarden.supervisor.core.transitions import (
    describe_exit,
    exit_text,
    fail_waiters,
    finish_stop,
    halts_on_divergence,
    last_logged,
    reply_error,
    save_late,
    shutdown_exit,
    spawn,
    stop_trainer,
    tell,
)

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import ExitFacts, Stall, TrainerFinished

TRAINER_WORKING = frozenset({Phase.STARTING, Phase.RUNNING, Phase.SAVING, Phase.PIVOTING})
"""Phases in which a live trainer must keep logging steps (stall detection applies)."""


def on_contained(state: State, ev: StartContained, rules: Rules, actions: list[Action]) -> State:
    return replace(state, containing=False)


def on_spawned(state: State, ev: TrainerSpawned, rules: Rules, actions: list[Action]) -> State:
    state = replace(
        with_start_counted(state),
        trainer_pid=ev.pid,
        trainer_started_t=ev.t,
        last_activity_t=ev.t,
        rollback_from=None,
        parser_no_match=None,
    )
    return _answer_starts(state, actions)


def on_parser_no_match(
    state: State, ev: ParserNoMatch, rules: Rules, actions: list[Action]
) -> State:
    """Remembered for the hang it may end in (the shell has journaled and shown it)."""
    if ev.seg != state.seg or not state.trainer_alive or state.last_step is not None:
        return state
    return replace(state, parser_no_match=(ev.parser, ev.sample))


def _answer_starts(state: State, actions: list[Action]) -> State:
    """The trainer started: `start` requests learn the checkpoint it resumed from."""
    starts = [w for w in state.waiters if w.kind == "start"]
    if not starts:
        return state
    result = {"state": "starting", "resume_step": state.resume_step, **barrier.unverified(state)}
    for w in starts:
        actions.append(Reply(w.request_id, ok=True, result=result))
    return replace(state, waiters=tuple(w for w in state.waiters if w.kind != "start"))


def on_spawn_failed(state: State, ev: SpawnFailed, rules: Rules, actions: list[Action]) -> State:
    state = with_start_counted(state)
    return crashed(state, ev.t, rules, actions, cause=f"could not start the trainer: {ev.error}")


def asked_to_stop(state: State) -> StopReason | None:
    """The stop someone asked for, whatever stopped the trainer since: a shutdown, or the
    operator's stop still waiting for its reply."""
    if state.shutdown:
        return "shutdown"
    if any(w.kind == "stop" for w in state.waiters):
        return "operator"
    return None


def on_exited(state: State, ev: TrainerExited, rules: Rules, actions: list[Action]) -> State:
    if ev.pid != state.trainer_pid:
        return state
    state = _on_exited(state, ev, rules, actions)
    if state.shutdown and state.phase == Phase.DIVERGED:
        # Diverged for good while shutting down: the shutdown's exit, with the halt's code.
        return finish_stop(state, actions, {})
    if state.phase == Phase.DIVERGED and any(w.kind == "stop" for w in state.waiters):
        # A stop asked while the diverging trainer was killed: it is stopped, the run halted.
        return finish_stop(state, actions, {})
    return state


def _on_exited(state: State, ev: TrainerExited, rules: Rules, actions: list[Action]) -> State:
    reason = state.stop_reason
    # The SIGKILL at stop_timeout_s said so when it was sent.
    ended = state.stop_exit or exit_text(ev.returncode, ev.signal_name)
    state = replace(
        state,
        trainer_pid=None,
        kill_at=None,
        dump_until=None,
        stop_exit=None,
        containing=not ev.contained,
    )
    exit_fields: ExitFacts = {
        "pid": ev.pid,
        "returncode": ev.returncode,
        "last_step": state.last_step,
    }
    if reason == "pivot" and state.pivot is not None:
        actions.append(Record({"kind": "trainer_stopped", **exit_fields, "cause": "pivot"}))
        if state.pivot.stop_after:
            state = replace(state, stop_exit=ended)  # what the stop's reply will say
        return pivot.on_trainer_stopped(state, ev.t, rules, actions)
    if reason == "gpu_fault" and state.gpu_fault is not None:
        actions.append(Record({"kind": "trainer_stopped", **exit_fields, "cause": "gpu_fault"}))
        if state.gpu_fault.stop_asked:
            state = replace(state, stop_exit=ended)
        return gpu_faults.after_trainer_gone(state, ev.t, rules, actions)
    if state.pivot is not None:
        why = (
            "the daemon is shutting down"
            if reason == "shutdown"
            else f"the trainer exited ({describe_exit(ev.returncode, ev.signal_name)})"
        )
        state = pivot.abort(state, actions, why)
    if reason in KILLS_TO_RESTART and not (
        reason == "divergence" and halts_on_divergence(state, rules)
    ):
        # A stop or shutdown asked for before the loss went bad (or the trainer hung), or
        # while the daemon was killing it, stands: no restart. The divergence's quarantine
        # and the spike's rollback are done; the next start resumes from what is left.
        reason = asked_to_stop(state) or reason
    if reason == "operator" and state.gpu_fault is not None:
        # A GPU fault came while the operator's stop was under way: the run halts in
        # gpu_fault, whose reason says what the GPU needs (the reply says so too).
        actions.append(Record({"kind": "trainer_stopped", **exit_fields}))
        tell(state, actions, ended)
        return gpu_faults.halt(
            replace(state, stop_reason=None, stop_exit=ended), state.gpu_fault, actions
        )
    if reason in ("operator", "shutdown"):
        actions.append(Record({"kind": "trainer_stopped", **exit_fields}))
        tell(state, actions, ended)
        # A shutdown while a GPU fault is handled keeps it (persisted): the next daemon
        # halts in gpu_fault instead of starting the trainer on that GPU, as it does after
        # a daemon killed then.
        kept = state.gpu_fault if reason == "shutdown" else None
        state = replace(
            state,
            gpu_fault=kept,
            phase=Phase.STOPPED,
            stop_reason=None,
            halt_reason=_stopped_because(state, kept),
            stop_exit=ended,
        )
        if reason == "shutdown":
            state = replace(state, shutdown=True)
        if state.pending or state.containing:
            # Its last checkpoint may be among them: the replies name it once verified.
            return replace(state, stop_due=True)
        return finish_stop(state, actions, {})
    if reason == "spike":
        return rollback.after_kill(state, ev.t, exit_fields, actions)
    if reason == "divergence":
        actions.append(Record({"kind": "trainer_killed", **exit_fields, "cause": "divergence"}))
        if not halts_on_divergence(state, rules):
            # Its spawn record names the divergence and the checkpoint really resumed from.
            return spawn(
                replace(state, rollback_from=state.poisoned_from), ev.t, actions, "divergence"
            )
        if state.fallbacks > rules.max_fallbacks:
            actions.append(
                Record(
                    {
                        "kind": "halt",
                        "state": "diverged",
                        "resume_step": state.resume_step,
                        "max_fallbacks": rules.max_fallbacks,
                    },
                )
            )
            return replace(
                state,
                phase=Phase.DIVERGED,
                stop_reason=None,
                halt_reason=(
                    f"loss diverged again right after resuming from step {state.resume_step},"
                    f" after {rules.max_fallbacks} fallbacks to older checkpoints"
                ),
            )
        actions.append(Record({"kind": "halt", "state": "diverged", "step": state.divergence_step}))
        return replace(
            state,
            phase=Phase.DIVERGED,
            stop_reason=None,
            halt_reason=f"loss diverged again at step {state.divergence_step}",
        )
    if reason is None and ev.returncode == 0:
        halt_reason = "the trainer finished"
        finished: TrainerFinished = {"kind": "trainer_finished", **exit_fields}
        total, last = rules.total_steps, last_logged(state)
        if total is not None and (last is None or last < total):
            # Exit 0 long before the planned end: a trainer's bug or a changed config.
            finished["early"] = True
            finished["total_steps"] = total
            halt_reason = (
                f"the trainer exited 0 at step {last if last is not None else 0} of {total}"
                " ([trainer] total_steps), before the end"
            )
        actions.append(Record(finished))
        state = fail_waiters(state, actions, "wrong_state", "the trainer finished")
        return replace(state, phase=Phase.FINISHED, halt_reason=halt_reason)
    cause = hang_cause(state) if reason == "stall" else describe_exit(ev.returncode, ev.signal_name)
    return crashed(
        state,
        ev.t,
        rules,
        actions,
        cause=cause,
        restart_cause="hang" if reason == "stall" else "crash",
        exit_fields=exit_fields,
        read_resume=ev.read_resume,
        last_line=ev.last_line,
        disk_full=ev.disk_full,
    )


def on_resume_refused(
    state: State, ev: ResumeRefused, rules: Rules, actions: list[Action]
) -> State:
    """The checkpoint a start was to resume from failed its digest check: abandon it and
    start from the next older one (checked the same way)."""
    state = abandon_changed(state, ev.step, ev.name, ev.reason, actions)
    if state.trainer_alive or state.phase in HALTED:
        return state
    # No trainer started for that segment: the next start takes its number.
    return spawn(replace(state, seg=state.seg - 1), ev.t, actions)


LEFTOVER_REASON = (
    "a fresh start, from no snapshot: the fixed file left there is neither resumed from nor"
    " overwritten"
)
"""Why a file left at an in-place trainer's fixed name goes to quarantine/."""


def on_fixed_file_leftover(
    state: State, ev: FixedFileLeftover, rules: Rules, actions: list[Action]
) -> State:
    """A start from no checkpoint found a file at the fixed name: it never verified (or it
    would have a snapshot), so it is not resumed from, and the fresh trainer must not
    overwrite it either. The start is made again, with that file moved to quarantine/
    first."""
    if state.trainer_alive or state.phase in HALTED:
        return state
    leftover = Quarantine(step=None, name=ev.name, reason=LEFTOVER_REASON, retract_mirror=False)
    # No trainer started for that segment: the next start takes its number.
    return spawn(replace(state, seg=state.seg - 1), ev.t, actions, leftover=leftover)


def _stopped_because(state: State, kept: GpuFaultInfo | None) -> str:
    """A run stopped by the operator or a shutdown: why, and what the next daemon does."""
    by = state.resumes_after
    if kept is not None:
        return (
            f"the daemon was stopped by {by or 'the operator'} while handling a GPU fault:"
            f" {kept.reason}"
        )
    if by:
        return f"the daemon was stopped by {by}; the run resumes when the daemon starts again"
    return "stopped by operator"


def waited_too_long(state: State, w: Waiter) -> str:
    """What a request whose wait ran out was still waiting for; the stop it asked for still
    stands."""
    if w.kind == "save":
        return "no checkpoint was committed for save in time"
    if w.kind == "start":
        return "the trainer had not started in time; `trainwarden status` shows the run's state"
    if state.trainer_alive:
        return (
            f"the trainer (pid {state.trainer_pid}) had not exited when the stop's wait ran"
            " out; the run still stops, with no restart, once it is gone"
        )
    if state.pivot is not None and state.pivot.stop_after:
        return (
            f"the pivot was still at {state.pivot.stage} when the stop's wait ran out; the run"
            " stops once it is done, with no restart"
        )
    return (
        "the run is stopped, but the verification of its last checkpoints had not ended when"
        " the stop's wait ran out; `trainwarden checkpoints` shows them"
    )


def on_tick(state: State, ev: Tick, rules: Rules, actions: list[Action]) -> State:
    t = ev.t
    expired = [w for w in state.waiters if w.deadline <= t]
    for w in expired:
        reply_error(actions, w.request_id, "timeout", waited_too_long(state, w))
    if expired:
        state = replace(state, waiters=tuple(w for w in state.waiters if w not in expired))
        if state.stop_reason in KILLS_TO_RESTART and any(w.kind == "stop" for w in expired):
            # A stop asked during the daemon's kill outlived its wait, not its word: the run
            # still stops once the trainer is gone (one stuck in the driver can take long).
            state = replace(state, stop_reason="operator")
    plan = state.pivot
    if (
        plan is not None
        and plan.stage == "saving"
        and plan.deadline is not None
        and t >= plan.deadline
    ):
        return pivot.abort(
            state, actions, "no checkpoint was committed in time; the old policy stays", "timeout"
        )
    if (
        state.phase == Phase.BACKOFF
        and state.backoff_until is not None
        and t >= state.backoff_until
    ):
        return spawn(state, t, actions)
    if state.dump_until is not None and t >= state.dump_until and state.trainer_alive:
        # The dump ran out of time: the stop it delayed comes now, as promised.
        return stop_trainer(state, t, rules, state.stop_reason or "stall", actions)
    if state.kill_at is not None and t >= state.kill_at and state.trainer_alive:
        if state.requeue is not None and state.requeue.cut_short:
            # Leaving a Slurm job whose end comes before stop_timeout_s would.
            save_late(state, t, "the trainer's save", actions)
            actions.append(SignalTrainer("SIGKILL", "did not exit before the job's deadline"))
            tell(state, actions, "no exit before the Slurm job's deadline: sent SIGKILL")
            return replace(state, kill_at=None, stop_exit="killed at the job's deadline")
        actions.append(SignalTrainer("SIGKILL", f"did not exit within {rules.stop_timeout_s:g} s"))
        tell(
            state,
            actions,
            f"no exit within stop_timeout_s = {rules.stop_timeout_s:g} s: sent SIGKILL",
        )
        return replace(state, kill_at=None, stop_exit=f"killed after {rules.stop_timeout_s:g} s")
    if (
        state.phase in TRAINER_WORKING
        and state.stop_reason is None
        and state.trainer_alive
        and t - state.last_activity_t >= rules.stall_timeout_s
    ):
        state = pivot.abort(state, actions, "the trainer stopped logging steps")
        stall: Stall = {
            "kind": "stall",
            "last_step": state.last_step,
            "silent_s": round(t - state.last_activity_t, 3),
        }
        if state.parser_no_match is not None:
            parser, sample = state.parser_no_match
            stall["parser_no_match"] = {"parser": parser, "sample": sample}
        actions.append(Record(stall))
        if rules.dump_timeout_s > 0 and state.trainer_pid is not None:
            # Its stacks say where it hangs; the SIGTERM waits for them, dump_timeout_s at most.
            actions.append(DumpStacks(state.trainer_pid, state.last_step, rules.dump_timeout_s))
            return replace(
                state,
                phase=Phase.STOPPING,
                stop_reason="stall",
                dump_until=t + rules.dump_timeout_s,
            )
        return stop_trainer(state, t, rules, "stall", actions)
    return state


def on_dumped(state: State, ev: StacksDumped, rules: Rules, actions: list[Action]) -> State:
    """The hung trainer's stacks are on disk (or could not be had): stop it now."""
    if state.dump_until is None or ev.pid != state.trainer_pid:
        return state
    return stop_trainer(state, ev.t, rules, state.stop_reason or "stall", actions)


def on_shutdown(state: State, ev: ShutdownRequested, rules: Rules, actions: list[Action]) -> State:
    actions.append(Record({"kind": "shutdown", "signal": ev.signal}))
    state = replace(state, shutdown=True)
    if state.phase not in HALTED and state.stop_reason not in ("operator", "pivot"):
        # Not the operator's stop: the next daemon goes on with the run.
        state = replace(state, resumes_after=ev.signal)
    if state.trainer_alive:
        if state.stop_reason in ("operator", "shutdown", "pivot"):
            return state
        if state.dump_until is not None:
            # Its stacks are still being dumped: the stop need not wait for them.
            return stop_trainer(state, ev.t, rules, "shutdown", actions)
        if state.stop_reason in ("divergence", "spike", "stall", "gpu_fault"):
            # Already on its way down; exit once it is gone rather than restarting it.
            return replace(state, stop_reason="shutdown")
        return stop_trainer(state, ev.t, rules, "shutdown", actions)
    shutdown_exit(state, actions)
    return state
