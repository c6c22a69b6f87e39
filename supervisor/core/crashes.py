"""A trainer that died unasked: the crash record, the checkpoint it may have died on
(suspected, fallen back from), then a backoff or the crash-loop halt; a death on a full
disk waits for space instead of counting."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from trainwarden.supervisor.core import barrier, suspects
from trainwarden.supervisor.core.actions import Action, Record
from trainwarden.supervisor.core.phases import Phase
from trainwarden.supervisor.core.state import (
    RestartCause,
    Rules,
    State,
    failures_of,
    with_failures,
)
from trainwarden.supervisor.core.transitions import fail_waiters, spawn

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import Crash, ExitFacts, TrainerFailedBeforeResume


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
    exit_fields: ExitFacts | None = None,
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
    crash: Crash = (
        {"kind": "crash", **exit_fields, "cause": cause}
        if exit_fields
        else {"kind": "crash", "cause": cause}
    )
    if disk_full:
        crash["disk_full"] = True
    if state.gpu_xid is not None:
        crash["xid"] = state.gpu_xid  # reported by NVML before the trainer died
    if last_line:
        crash["last_line"] = last_line
    actions.append(Record(crash))
    state = replace(state, gpu_xid=None)
    state = fail_waiters(state, actions, "wrong_state", f"the trainer crashed: {cause}")
    state = replace(state, trainer_pid=None, stop_reason=None, kill_at=None)
    if state.progress_since_start:
        state = replace(state, restarts_without_progress=0, next_backoff_s=rules.backoff_initial_s)
    if disk_full:
        return wait_for_space(state, t, rules, actions)
    halts = state.restarts_without_progress >= rules.max_restarts_without_progress
    suspect = state.resume_step
    died_on_it = state.last_step is None or (suspect is not None and state.last_step <= suspect)
    if suspect is not None and died_on_it and not read_resume:
        # No sign it ever read the checkpoint: the trainer's own failure, not the file's.
        failed: TrainerFailedBeforeResume = {
            "kind": "trainer_failed_before_resume",
            "step": suspect,
            "cause": cause,
        }
        if last_line:
            failed["last_line"] = last_line
        actions.append(Record(failed))
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
                {
                    "kind": "halt",
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
            {
                "kind": "restart_scheduled",
                "backoff_s": delay,
                "attempt": state.restarts_without_progress + 1,
                # The restart waits for what is still being verified (see core.barrier).
                **barrier.resume_forecast(state),
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


def wait_for_space(state: State, t: float, rules: Rules, actions: list[Action]) -> State:
    """A crash on a full disk: no checkpoint suspected, no restart counted; the next start
    in backoff_max_s (it fails the same way until space returns, then goes on)."""
    delay = rules.backoff_max_s
    actions.append(
        Record(
            {
                "kind": "restart_scheduled",
                "backoff_s": delay,
                "attempt": state.restarts_without_progress,
                "disk_full": True,
                **barrier.resume_forecast(state),
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
