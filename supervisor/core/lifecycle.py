"""The trainer's life cycle: start-up, spawn and exit, crash and backoff, ticks, shutdown."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainwarden.supervisor.core import barrier, gpu_faults, pivot, rollback, suspects
from trainwarden.supervisor.core.actions import (
    Action,
    DumpStacks,
    Quarantine,
    ReadMirrorPointer,
    Record,
    Reply,
    SignalTrainer,
)
from trainwarden.supervisor.core.events import (
    FixedFileLeftover,
    Outcome,
    ParserNoMatch,
    Restored,
    ResumeRefused,
    ShutdownRequested,
    SpawnFailed,
    StacksDumped,
    StartContained,
    Startup,
    Tick,
    TrainerExited,
    TrainerSpawned,
)
from trainwarden.supervisor.core.phases import HALTED, Phase
from trainwarden.supervisor.core.plausible import implausible_at_startup, largest_gap
from trainwarden.supervisor.core.progress import diverged_unseen
from trainwarden.supervisor.core.retention import abandon_changed, apply_retention
from trainwarden.supervisor.core.state import (
    Ckpt,
    RestartCause,
    Rules,
    State,
    StopReason,
    failures_of,
    restore,
    with_failures,
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

TRAINER_WORKING = frozenset({Phase.STARTING, Phase.RUNNING, Phase.SAVING, Phase.PIVOTING})
"""Phases in which a live trainer must keep logging steps (stall detection applies)."""


def on_restored(state: State, ev: Restored, rules: Rules, actions: list[Action]) -> State:
    restored = restore(ev.persisted or {}, rules)
    return replace(restored, pinned=restored.pinned | ev.pins, booting=True)


def on_startup(state: State, ev: Startup, rules: Rules, actions: list[Action]) -> State:
    state = replace(state, booting=False)
    verified = []
    committed = dict(state.digests)
    refused = {name: (reason, cause, at) for name, reason, cause, at in ev.refused}
    for found in ev.scanned:
        verdict = refused.get(found.name)
        if verdict is not None and found.step is not None:
            reason, cause, cause_step = verdict
            actions.append(
                Quarantine(
                    found.step,
                    found.name,
                    f"{reason} (quarantined before; the move out of the folder had failed)",
                    retract_mirror=False,
                    cause=cause,
                    cause_step=cause_step,
                )
            )
            continue
        if found.outcome is Outcome.VERIFIED and found.step is not None:
            before = committed.get(found.name)
            if before and found.digest and before != found.digest:
                # Changed while no daemon watched: the mirror keeps the copy it made.
                reason = "content changed since commit (while no daemon was running)"
                actions.append(
                    Record(
                        "checkpoint_changed",
                        {
                            "step": found.step,
                            "name": found.name,
                            "reason": reason,
                            "was_verified": True,
                        },
                    )
                )
                actions.append(Quarantine(found.step, found.name, reason, retract_mirror=False))
                continue
            verified.append(Ckpt(found.step, found.name, found.bytes, found.mtime, found.digest))
        else:
            # Found broken at start-up: the mirror's copy, verified when it was made, stays.
            actions.append(
                Quarantine(
                    found.step,
                    found.name,
                    found.reason,
                    retract_mirror=False,
                    cause="verification",
                )
            )
    implausible = implausible_at_startup(
        [c.step for c in verified], ev.last_logged_step, state.max_commit_gap, rules
    )
    for c in verified:
        if c.step in implausible:
            actions.append(Quarantine(c.step, c.name, implausible[c.step], retract_mirror=False))
    verified = [c for c in verified if c.step not in implausible]
    state = replace(state, digests=())
    if verified:
        known = {c.step: c for c in state.checkpoints} | {c.step: c for c in verified}
        high = max(max(known), state.verified_high or 0)
        state = replace(
            state, checkpoints=tuple(known[s] for s in sorted(known)), verified_high=high
        )
        state = rollback.at_startup(state, actions)
        for c in verified:
            state = rollback.at_commit(state, c.step)  # EMAs of the lines caught up
    if state.caught_up_spike is not None and ev.diverged is None:
        state = rollback.spiked_unseen(state, state.caught_up_spike, rules, actions)
    gaps = [
        g for g in (state.max_commit_gap, largest_gap([c.step for c in state.checkpoints])) if g
    ]
    state = replace(state, history_step=ev.last_logged_step, max_commit_gap=max(gaps, default=None))
    newest = state.newest
    if rules.mirror and newest is not None:
        # Committed while no daemon ran (or a copy failed): the mirror may be behind.
        actions.append(ReadMirrorPointer())
    if ev.unclean:
        lost = None
        if ev.last_logged_step is not None:
            lost = ev.last_logged_step - (newest.step if newest else 0)
        actions.append(
            Record(
                "boot_recovery",
                {
                    "resume_step": newest.step if newest else None,
                    "last_logged_step": ev.last_logged_step,
                    "steps_lost": max(lost, 0) if lost is not None else None,
                },
            )
        )
    if state.resumes_after is not None:
        actions.append(Record("resumed_after_signal", {"signal": state.resumes_after}))
        state = replace(state, resumes_after=None)
    if ev.diverged is not None:
        state = diverged_unseen(state, *ev.diverged, rules, actions)
    if state.pivot is not None and state.phase not in HALTED:
        return pivot.resume_after_restart(
            replace(state, restart_cause="daemon"), ev.t, rules, actions
        )
    state = apply_retention(state, rules, actions)
    if state.phase in HALTED:
        actions.append(Record("idle", {"state": state.phase, "reason": state.halt_reason}))
        return state
    return spawn(state, ev.t, actions, cause="daemon")


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
    exit_fields = {"pid": ev.pid, "returncode": ev.returncode, "last_step": state.last_step}
    if reason == "pivot" and state.pivot is not None:
        actions.append(Record("trainer_stopped", {**exit_fields, "cause": "pivot"}))
        return pivot.on_trainer_stopped(state, ev.t, rules, actions)
    if reason == "gpu_fault" and state.gpu_fault is not None:
        actions.append(Record("trainer_stopped", {**exit_fields, "cause": "gpu_fault"}))
        return gpu_faults.after_trainer_gone(state, ev.t, rules, actions)
    if state.pivot is not None:
        state = pivot.abort(
            state, actions, f"the trainer exited ({describe_exit(ev.returncode, ev.signal_name)})"
        )
    if reason in ("divergence", "spike") and not (
        reason == "divergence" and halts_on_divergence(state, rules)
    ):
        # A stop or shutdown asked for before the loss went bad stands: no restart. The
        # divergence's quarantine is done; the next start resumes from what is left.
        reason = asked_to_stop(state) or reason
    if reason in ("operator", "shutdown"):
        actions.append(Record("trainer_stopped", exit_fields))
        tell(state, actions, ended)
        state = replace(
            state,
            gpu_fault=None,
            phase=Phase.STOPPED,
            stop_reason=None,
            halt_reason=(
                f"the daemon was stopped by {state.resumes_after}; the run resumes when the"
                " daemon starts again"
                if state.resumes_after
                else "stopped by operator"
            ),
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
        actions.append(Record("trainer_killed", {**exit_fields, "cause": "divergence"}))
        if not halts_on_divergence(state, rules):
            # Its spawn record names the divergence and the checkpoint really resumed from.
            return spawn(
                replace(state, rollback_from=state.poisoned_from), ev.t, actions, "divergence"
            )
        if state.fallbacks > rules.max_fallbacks:
            actions.append(
                Record(
                    "halt",
                    {
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
        actions.append(Record("halt", {"state": "diverged", "step": state.divergence_step}))
        return replace(
            state,
            phase=Phase.DIVERGED,
            stop_reason=None,
            halt_reason=f"loss diverged again at step {state.divergence_step}",
        )
    if reason is None and ev.returncode == 0:
        halt_reason = "the trainer finished"
        total, last = rules.total_steps, last_logged(state)
        if total is not None and (last is None or last < total):
            # Exit 0 long before the planned end: a trainer's bug or a changed config.
            exit_fields = {**exit_fields, "early": True, "total_steps": total}
            halt_reason = (
                f"the trainer exited 0 at step {last if last is not None else 0} of {total}"
                " ([trainer] total_steps), before the end"
            )
        actions.append(Record("trainer_finished", exit_fields))
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


def hang_cause(state: State) -> str:
    if state.parser_no_match is None:
        return "hang (no step line)"
    parser, _ = state.parser_no_match
    return f"hang (no step line: no line matched parser {parser}; set [telemetry] parser)"


def crashed(
    state: State,
    t: float,
    rules: Rules,
    actions: list[Action],
    *,
    cause: str,
    restart_cause: RestartCause = "crash",
    exit_fields: dict[str, Any] | None = None,
    read_resume: bool = False,
    last_line: str | None = None,
    disk_full: bool = False,
) -> State:
    """The trainer died unasked: blame its checkpoint if it read it (`read_resume`) and
    never got past it, then back off (doubling, up to backoff_max_s) or halt after too many
    restarts without progress. The next start is counted under `restart_cause`.

    A start that died before touching its checkpoint (a broken script, a missing program,
    a start that could not even be made) is the trainer's failure: no checkpoint is
    suspected for it, and the crash loop it ends in says the trainer's last line.

    A death on a full disk is not the trainer's nor its checkpoint's: it is not counted
    towards the crash loop, and the restarts go on every backoff_max_s until space returns."""
    crash = {**(exit_fields or {}), "cause": cause}
    if disk_full:
        crash["disk_full"] = True
    if state.gpu_xid is not None:
        crash["xid"] = state.gpu_xid  # reported by NVML before the trainer died
    if last_line:
        crash["last_line"] = last_line
    actions.append(Record("crash", crash))
    state = replace(state, gpu_xid=None)
    state = fail_waiters(state, actions, "wrong_state", f"the trainer crashed: {cause}")
    state = replace(state, trainer_pid=None, stop_reason=None, kill_at=None)
    if state.progress_since_start:
        state = replace(state, restarts_without_progress=0, next_backoff_s=rules.backoff_initial_s)
    if disk_full:
        return _wait_for_space(state, t, rules, actions)
    halts = state.restarts_without_progress >= rules.max_restarts_without_progress
    suspect = state.resume_step
    died_on_it = state.last_step is None or (suspect is not None and state.last_step <= suspect)
    if suspect is not None and died_on_it and not read_resume:
        # No sign it ever read the checkpoint: the trainer's own failure, not the file's.
        actions.append(
            Record(
                "trainer_failed_before_resume",
                {
                    "step": suspect,
                    "cause": cause,
                    **({"last_line": last_line} if last_line else {}),
                },
            )
        )
    elif suspect is not None and died_on_it:
        count = failures_of(state, suspect) + 1
        state = with_failures(state, suspect, count)
        resumed = suspects.resumed_from(state)
        marks = 0
        if resumed is not None:
            state, marks = suspects.suspect(state, resumed)
        if resumed is not None and count >= rules.fallback_after_failures:
            reason = f"the trainer died {count} times resuming from it before logging a step"
            state = suspects.fall_back(
                state, resumed, reason, rules, actions, counted=False, halts=halts
            )
        elif (
            resumed is not None
            and marks >= rules.fallback_after_failures
            and suspects.can_fall_back(state, rules)
        ):
            # Diverged right after resuming from it before, and now died before a step.
            reason = (
                f"the trainer diverged or died {marks} times within"
                f" {rules.suspect_window_steps} steps of resuming from it"
            )
            state = suspects.fall_back(state, resumed, reason, rules, actions, halts=halts)
            count = rules.fallback_after_failures
        if count >= rules.fallback_after_failures:
            state = with_failures(state, suspect, 0)
    if halts:
        actions.append(
            Record(
                "halt",
                {
                    "state": "crash_loop",
                    "restarts_without_progress": state.restarts_without_progress,
                },
            )
        )
        said = f"; the trainer's last line: {last_line}" if last_line else ""
        return replace(
            state,
            phase=Phase.CRASH_LOOP,
            halt_reason=(
                f"{state.restarts_without_progress} restarts without progress; last: {cause}{said}"
            ),
        )
    delay = rules.backoff_initial_s if state.next_backoff_s is None else state.next_backoff_s
    actions.append(
        Record(
            "restart_scheduled",
            {
                "backoff_s": delay,
                "attempt": state.restarts_without_progress + 1,
                # The restart waits for what is still being verified (see core.barrier).
                **barrier.resume_forecast(state, "resume_step"),
            },
        )
    )
    state = replace(
        state,
        phase=Phase.BACKOFF,
        backoff_until=t + delay,
        next_backoff_s=min(max(delay * 2, 0.0), rules.backoff_max_s),
        restart_cause=restart_cause,
        restarts_without_progress=state.restarts_without_progress + 1,
        resume_step=state.newest.step if state.newest else None,
    )
    if delay <= 0:
        return spawn(state, t, actions)
    return state


def _wait_for_space(state: State, t: float, rules: Rules, actions: list[Action]) -> State:
    """A crash on a full disk: no checkpoint suspected, no restart counted; the next start
    in backoff_max_s (it fails the same way until space returns, then goes on)."""
    delay = rules.backoff_max_s
    actions.append(
        Record(
            "restart_scheduled",
            {
                "backoff_s": delay,
                "attempt": state.restarts_without_progress,
                "disk_full": True,
                **barrier.resume_forecast(state, "resume_step"),
            },
        )
    )
    state = replace(
        state,
        phase=Phase.BACKOFF,
        backoff_until=t + delay,
        restart_cause="disk_full",
        resume_step=state.newest.step if state.newest else None,
    )
    if delay <= 0:
        return spawn(state, t, actions)
    return state


def on_tick(state: State, ev: Tick, rules: Rules, actions: list[Action]) -> State:
    t = ev.t
    expired = [w for w in state.waiters if w.deadline <= t]
    for w in expired:
        reply_error(
            actions, w.request_id, "timeout", f"no checkpoint was committed for {w.kind} in time"
        )
    if expired:
        state = replace(state, waiters=tuple(w for w in state.waiters if w not in expired))
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
        stall: dict[str, Any] = {
            "last_step": state.last_step,
            "silent_s": round(t - state.last_activity_t, 3),
        }
        if state.parser_no_match is not None:
            parser, sample = state.parser_no_match
            stall["parser_no_match"] = {"parser": parser, "sample": sample}
        actions.append(Record("stall", stall))
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
    actions.append(Record("shutdown", {"signal": ev.signal}))
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
