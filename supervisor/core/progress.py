"""What the trainer makes: committed (or rejected) checkpoints, step lines, divergence,
and the mirror's copies of those checkpoints."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from trainwarden.supervisor.core import barrier, pivot, rollback, suspects
from trainwarden.supervisor.core.actions import (
    Action,
    MirrorCopy,
    Quarantine,
    Record,
    SignalTrainer,
)
from trainwarden.supervisor.core.events import (
    CheckpointChanged,
    CheckpointCommitted,
    CheckpointRejected,
    CheckpointSeen,
    CheckpointUnchanged,
    CheckpointVanished,
    CheckpointWriting,
    MirrorPointer,
    StepLogged,
)
from trainwarden.supervisor.core.phases import HALTED, Phase
from trainwarden.supervisor.core.plausible import implausible_step, with_gap
from trainwarden.supervisor.core.retention import abandon_changed, apply_retention
from trainwarden.supervisor.core.state import (
    Ckpt,
    Rules,
    State,
    failures_of,
    with_failures,
    without_checkpoints,
)
from trainwarden.supervisor.core.transitions import fail_waiters, halts_on_divergence, tell

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import (
        Checkpoint,
        Divergence,
        HaltsInstead,
        RollbackForecast,
    )

SILENT_COMMITS = 3
"""Commits in a row without a step line that make a `no_step_lines` hint (once a start)."""


def _silent_commits(state: State, step: int, actions: list[Action]) -> State:
    """Count commits with no step line since the previous one: a trainer whose output no
    longer reaches the log (stdout closed, a parser that matches nothing) keeps saving while
    the daemon sees no loss, so no NaN or spike can be caught; say so once a start."""
    if state.last_step is not None and state.last_step != state.step_at_commit:
        return replace(state, commits_without_steps=0, step_at_commit=state.last_step)
    count = state.commits_without_steps + 1
    if count == SILENT_COMMITS:
        since = f"since step {state.last_step}" if state.last_step is not None else "this start"
        actions.append(
            Record(
                {
                    "kind": "no_step_lines",
                    "commits": count,
                    "checkpoint_step": step,
                    "last_step": state.last_step,
                    "hint": (
                        f"{count} checkpoints committed (the newest at step {step}) with no"
                        f" step line {since}: the daemon sees no loss, so NaN and spike"
                        " detection are off; check that the trainer's output reaches run.log"
                        " in a form [telemetry] parser reads"
                    ),
                },
            )
        )
    return replace(state, commits_without_steps=count, step_at_commit=state.last_step)


def is_divergent(loss: float, max_loss: float) -> bool:
    return not math.isfinite(loss) or loss > max_loss


def on_seen(state: State, ev: CheckpointSeen, rules: Rules, actions: list[Action]) -> State:
    return barrier.seen(state, ev)


def on_committed(
    state: State, ev: CheckpointCommitted, rules: Rules, actions: list[Action]
) -> State:
    stray = barrier.is_stray(state, ev.name)
    pivot_step = barrier.after_pivot(state, ev.name)
    state = barrier.resolved(state, ev.name)
    if pivot_step is not None:
        actions.append(pivot.set_aside(ev.step, ev.name, pivot_step))
        return state
    if stray:
        reason = "written by a process of the ended start after its main process exited"
        actions.append(Record({"kind": "stray_checkpoint", "step": ev.step, "name": ev.name}))
        actions.append(Quarantine(ev.step, ev.name, reason, retract_mirror=False))
        return state
    set_aside = rollback.set_aside(state, ev.step, ev.name)
    if set_aside is not None:
        actions.append(set_aside)
        return state
    if state.poisoned_from is not None and ev.step >= state.poisoned_from:
        actions.append(
            Quarantine(
                ev.step,
                ev.name,
                f"written at or after divergence at step {state.poisoned_from}",
                cause="divergence",
                cause_step=state.poisoned_from,
            )
        )
        return state
    implausible = implausible_step(state, ev.step, rules)
    if implausible is not None:
        actions.append(Quarantine(ev.step, ev.name, implausible, retract_mirror=False))
        return without_checkpoints(state, {ev.step})
    state = replace(state, max_commit_gap=with_gap(state, ev.step))
    ckpt = Ckpt(ev.step, ev.name, ev.bytes, ev.mtime, ev.digest)
    state, consumed = pivot.on_commit(state, ckpt, ev.t, rules, actions)
    if consumed:
        return state
    known_before = state.checkpoints
    others = tuple(c for c in state.checkpoints if c.step != ev.step)
    state = replace(
        state,
        checkpoints=tuple(sorted((*others, ckpt), key=lambda c: c.step)),
        verified_high=max(ev.step, state.verified_high or 0),
    )
    tell(state, actions, f"checkpoint step {ev.step} committed")
    state = replace(state, last_activity_t=max(state.last_activity_t, ev.t))
    if state.trainer_alive:
        state = _silent_commits(state, ev.step, actions)
    if state.trainer_alive and (state.resume_step is None or ev.step > state.resume_step):
        state = replace(state, progress_since_start=True)
        if state.restarts_without_progress:
            actions.append(Record({"kind": "progress", "step": ev.step}))
        state = replace(state, restarts_without_progress=0, next_backoff_s=rules.backoff_initial_s)
    if state.divergence_step is not None and ev.step > state.divergence_step:
        state = replace(state, divergences=0, divergence_step=None)
    checkpoint: Checkpoint = {
        "kind": "checkpoint",
        "step": ev.step,
        "name": ev.name,
        "bytes": ev.bytes,
        "digest": ev.digest,
    }
    actions.append(Record(checkpoint))
    if state.phase == Phase.SAVING:
        state = replace(state, phase=Phase.RUNNING)
    state = barrier.offer(state, ckpt)
    state = apply_retention(state, rules, actions)
    state = rollback.at_commit(state, ckpt.step)
    if rules.mirror and ckpt in state.checkpoints and ckpt not in known_before:
        actions.append(MirrorCopy(ckpt))
    return state


def on_rejected(state: State, ev: CheckpointRejected, rules: Rules, actions: list[Action]) -> State:
    state = barrier.resolved(state, ev.name)
    actions.append(Quarantine(ev.step, ev.name, ev.reason, cause="verification"))
    if ev.step is not None:
        state = without_checkpoints(state, {ev.step})
    return state


def on_vanished(state: State, ev: CheckpointVanished, rules: Rules, actions: list[Action]) -> State:
    # Removed before it could be verified (by its writer, or by our own retention): there
    # is nothing left to judge or to quarantine.
    return barrier.resolved(state, ev.name)


def on_changed(state: State, ev: CheckpointChanged, rules: Rules, actions: list[Action]) -> State:
    """A committed checkpoint no longer reads as it did at its commit: never good again.
    The mirror's copy, made (and checked) from the content that was committed, stays."""
    state = barrier.resolved(state, ev.name)
    return abandon_changed(state, ev.step, ev.name, ev.reason, actions)


def on_unchanged(
    state: State, ev: CheckpointUnchanged, rules: Rules, actions: list[Action]
) -> State:
    """Written to again and still the same bytes (a trainer saving the same step twice):
    not a new commit, but it does answer a save that asked for that step."""
    state = barrier.resolved(state, ev.name)
    ckpt = next((c for c in state.checkpoints if c.name == ev.name), None)
    return barrier.offer(state, ckpt) if ckpt is not None else state


def on_writing(state: State, ev: CheckpointWriting, rules: Rules, actions: list[Action]) -> State:
    return replace(state, last_activity_t=max(state.last_activity_t, ev.t))


def _stepped(state: State, step: int, t: float) -> State:
    """replace(state, last_step=step, last_activity_t=t), for every step line: a copy of
    the instance dict instead of dataclasses.replace's walk through all ~40 fields."""
    new = object.__new__(State)
    new.__dict__.update(state.__dict__)
    new.__dict__["last_step"] = step
    new.__dict__["last_activity_t"] = t
    new.__dict__["parser_no_match"] = None  # a line matched
    return new


def on_step(state: State, ev: StepLogged, rules: Rules, actions: list[Action]) -> State:
    if not state.trainer_alive or state.stop_reason in ("divergence", "spike"):
        if state.booting and not state.trainer_alive and rules.spikes.enabled:
            return rollback.caught_up(state, ev, rules)
        return state
    if is_divergent(ev.loss, rules.max_loss):
        return _diverge(state, ev, rules, actions)
    was_loading = state.last_step is None or (
        state.resume_step is not None and state.last_step <= state.resume_step
    )
    # A commit that was ahead of the logged steps is reached: it now counts for retention.
    reached = bool(state.checkpoints) and (
        (state.last_step or 0) < state.checkpoints[-1].step <= ev.step
    )
    state = _stepped(state, ev.step, ev.t)
    if state.phase == Phase.STARTING:
        state = replace(state, phase=Phase.RUNNING)
    state = suspects.past_the_window(state, ev.step, rules)
    suspect = state.resume_step
    if suspect is not None and ev.step > suspect:
        if failures_of(state, suspect):
            state = with_failures(state, suspect, 0)
        if was_loading:
            # The checkpoint it resumed from is no longer in use: retention may take it now.
            state = apply_retention(state, rules, actions)
            reached = False
    if reached:
        state = apply_retention(state, rules, actions)
    if rules.spikes.enabled and state.stop_reason is None:
        state = rollback.on_step(state, ev, rules, actions)
    return state


def _quarantine_poisoned(
    state: State, step: int, actions: list[Action], said: str = ""
) -> list[Ckpt]:
    """Quarantine every checkpoint written at or after a divergence at `step`; those."""
    poisoned = [c for c in state.checkpoints if c.step >= step]
    for c in poisoned:
        actions.append(
            Quarantine(
                c.step,
                c.name,
                f"written at or after divergence at step {step}{said}",
                cause="divergence",
                cause_step=step,
            )
        )
    return poisoned


def _diverge(state: State, ev: StepLogged, rules: Rules, actions: list[Action]) -> State:
    loss = ev.loss if math.isfinite(ev.loss) else str(ev.loss)
    actions.append(SignalTrainer("SIGKILL", f"divergence: loss {ev.loss} at step {ev.step}"))
    recurring = state.divergence_step is not None
    divergences = state.divergences + 1 if recurring else 1
    first_bad: int | None = (
        min(ev.step, state.divergence_step) if state.divergence_step is not None else ev.step
    )
    poisoned = _quarantine_poisoned(state, ev.step, actions)
    resumed = suspects.suspect_of_divergence(state, ev.step, rules)
    state = without_checkpoints(state, {c.step for c in poisoned})
    fallbacks = state.fallbacks
    if resumed is not None:
        state, count = suspects.suspect(state, resumed)
        if count >= rules.fallback_after_failures:
            if suspects.can_fall_back(state, rules):
                reason = (
                    f"the loss diverged (loss {loss} at step {ev.step}) within"
                    f" {ev.step - resumed.step} steps of resuming from it, {count} times"
                )
                state = suspects.fall_back(state, resumed, reason, rules, actions, before=ev.step)
                # The checkpoint took the blame: the older one starts with a clean slate.
                divergences, first_bad = 0, None
                fallbacks = state.fallbacks
            else:
                fallbacks = rules.max_fallbacks + 1
    divergence: Divergence = {
        "kind": "divergence",
        "step": ev.step,
        "loss": loss,
        "max_loss": rules.max_loss,
        "count": divergences,
        "quarantined": [c.step for c in poisoned],
        "suspect": resumed.step if resumed is not None else None,
        **_rollback(replace(state, divergences=divergences, fallbacks=fallbacks), ev.step, rules),
    }
    actions.append(Record(divergence))
    # The operator's stop, if one is under way, is answered when the trainer is gone.
    stops = tuple(w for w in state.waiters if w.kind == "stop" and state.stop_reason == "operator")
    others = tuple(w for w in state.waiters if w not in stops)
    state = fail_waiters(
        replace(state, waiters=others),
        actions,
        "wrong_state",
        "the trainer diverged and was killed",
    )
    state = replace(state, waiters=stops)
    state = pivot.abort(state, actions, f"the loss diverged at step {ev.step}")
    return replace(
        state,
        phase=Phase.STOPPING,
        stop_reason="divergence",
        kill_at=None,
        divergences=divergences,
        divergence_step=first_bad,
        poisoned_from=ev.step,
        fallbacks=fallbacks,
    )


def _rollback(state: State, step: int, rules: Rules) -> HaltsInstead | RollbackForecast:
    """What the divergence record says of the restart: the checkpoint it will resume from
    only when nothing can change that any more. A checkpoint before `step` still being
    verified may become the newest (the start waits for it, see core.barrier); the spawn
    record names the checkpoint then resumed from, and the divergence (`rollback_from`)."""
    if halts_on_divergence(state, rules):
        return {"halts": True}
    return barrier.rollback_forecast(state, before=step)


def diverged_unseen(
    state: State, step: int, loss: float, rules: Rules, actions: list[Action]
) -> State:
    """At start-up: the previous daemon's trainer logged a divergent loss at `step` after
    that daemon died, and went on (saving) until this daemon stopped it. As for a
    divergence seen live, less the kill: what it wrote at or after `step` is quarantined
    and the next start rolls back to before it (or the run halts in `diverged` if this is
    the same divergence again)."""
    shown = loss if math.isfinite(loss) else str(loss)
    poisoned = _quarantine_poisoned(state, step, actions, " (logged while no daemon ran)")
    state = without_checkpoints(state, {c.step for c in poisoned})
    recurring = state.divergence_step is not None
    divergences = state.divergences + 1 if recurring else 1
    first_bad = min(step, state.divergence_step) if state.divergence_step is not None else step
    state = replace(state, divergences=divergences, divergence_step=first_bad)
    actions.append(
        Record(
            {
                "kind": "divergence",
                "step": step,
                "loss": shown,
                "max_loss": rules.max_loss,
                "count": divergences,
                "quarantined": [c.step for c in poisoned],
                "caught_up": True,
                **_rollback(state, step, rules),
            },
        )
    )
    state = pivot.abort(state, actions, f"the loss diverged at step {step}")
    if halts_on_divergence(state, rules):
        actions.append(Record({"kind": "halt", "state": "diverged", "step": first_bad}))
        return replace(
            state,
            phase=Phase.DIVERGED,
            stop_reason=None,
            halt_reason=f"loss diverged again at step {first_bad}",
        )
    if state.phase in HALTED:
        return state
    return replace(state, rollback_from=step)


def on_mirror_pointer(
    state: State, ev: MirrorPointer, rules: Rules, actions: list[Action]
) -> State:
    newest = state.newest
    if newest is not None and (ev.step is None or ev.step < newest.step):
        actions.append(MirrorCopy(newest))
    return state
