"""The pivot: new caps and floors for the data-mixing bandit, as one crash-safe transaction.

Pure like the rest of the policy: the new policy arrives built and checked against the
contract (a PivotContext the shell reads), so nothing here reads a file. Stages, each
recorded in the persisted state before its effects start:

    saving          SIGUSR1 sent; waiting for a checkpoint at or after the current step
    stopping        that checkpoint pinned; SIGTERM sent; later checkpoints are quarantined
    archiving       bandit state, samples and the old policy.json moved to archive/
    writing_policy  the new policy.json written atomically
    (done)          trainer started from the pinned checkpoint with TRAINWARDEN_PIVOT=1

A daemon killed before `archiving` rolls the pivot back (the run continues under the old
policy); from `archiving` on it completes it. Because the trainer is started with a fresh
bandit whenever it resumes from a checkpoint at or before the last pivot step, the old
bandit never runs under the new policy, whichever checkpoint a later restart uses.
"""

from __future__ import annotations

from dataclasses import replace

from trainwarden.supervisor.core import barrier
from trainwarden.supervisor.core.actions import (
    Action,
    Archive,
    Quarantine,
    Record,
    Reply,
    SignalTrainer,
    WritePolicy,
)
from trainwarden.supervisor.core.events import Operator, PivotProgress
from trainwarden.supervisor.core.kinds import ErrorCode
from trainwarden.supervisor.core.phases import Phase
from trainwarden.supervisor.core.requests import Pivot
from trainwarden.supervisor.core.retention import apply_retention
from trainwarden.supervisor.core.state import Ckpt, PivotPlan, Rules, State, without_checkpoints
from trainwarden.supervisor.core.transitions import (
    finish_stop,
    reply_error,
    shutdown_exit,
    spawn,
    stop_trainer,
)


def cmd_pivot(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    if state.pivot is not None or state.phase == Phase.PIVOTING:
        reply_error(actions, ev.request_id, "busy", "a pivot is already in progress")
        return state
    if state.phase != Phase.RUNNING or not state.trainer_alive:
        reply_error(
            actions,
            ev.request_id,
            "wrong_state",
            f"cannot pivot while the run is {state.phase}: a pivot needs a running trainer",
        )
        return state
    context = ev.pivot
    if context is None or not context.arms:
        no_arms = context is not None and context.state_file == "no_arms"
        never = context is not None and context.state_file == "missing"
        if no_arms or (never and state.progress_since_start):
            # Its bandit state names no arm, or it has saved since it started without
            # writing one: asking again will not help.
            said = (
                "its bandit state (.state.json) names no data arms"
                if no_arms
                else "it has saved a checkpoint since it started and written no bandit state"
                " (.state.json)"
            )
            reply_error(
                actions,
                ev.request_id,
                "unsupported",
                f"the trainer reports no data arms ({said}): pivot needs a trainer that mixes"
                " its data with a bandit (see docs/pivot.md)",
            )
            return state
        reply_error(
            actions,
            ev.request_id,
            "wrong_state",
            "the trainer has not written its bandit state (.state.json) yet; try again shortly",
        )
        return state
    command = ev.command
    named = {*command.caps, *command.floors} if isinstance(command, Pivot) else set()
    named_zombies = sorted(z for z in context.zombies if z in named)
    if named_zombies:
        reply_error(
            actions,
            ev.request_id,
            "bad_argument",
            f"arm(s) {', '.join(named_zombies)} have no data source any more (zombie arms); "
            f"a policy may name only {', '.join(context.arms)}",
        )
        return state
    if context.new_policy is None:
        reply_error(actions, ev.request_id, "bad_argument", "; ".join(context.problems))
        return state
    target = state.last_step if state.last_step is not None else (state.resume_step or 0)
    zombies = list(context.zombies)
    plan = PivotPlan(
        stage="saving",
        old_policy=context.current_policy,
        new_policy=context.new_policy,
        utc=context.utc or "unknown",
        save_after_step=target,
        zombies=tuple(zombies),
        request_id=ev.request_id,
        deadline=ev.t + rules.save_wait_timeout_s,
    )
    actions.append(
        Record(
            {
                "kind": "pivot_stage",
                "stage": "saving",
                "after_step": target,
                "new_policy": context.new_policy,
                "zombies": zombies,
            },
        )
    )
    actions.append(SignalTrainer("SIGUSR1", "pivot: checkpoint before the policy change"))
    return replace(state, phase=Phase.PIVOTING, pivot=plan)


def on_commit(
    state: State, ckpt: Ckpt, t: float, rules: Rules, actions: list[Action]
) -> tuple[State, bool]:
    """A checkpoint committed during a pivot. True when the pivot consumed it."""
    plan = state.pivot
    if plan is None:
        return state, False
    if plan.stage == "saving" and ckpt.step >= plan.save_after_step:
        plan = replace(plan, stage="stopping", step=ckpt.step, was_pinned=ckpt.step in state.pinned)
        actions.append(Record({"kind": "pivot_stage", "stage": "pin", "step": ckpt.step}))
        actions.append(Record({"kind": "pivot_stage", "stage": "stopping", "step": ckpt.step}))
        state = replace(state, pivot=plan, pinned=state.pinned | {ckpt.step})
        state = stop_trainer(state, t, rules, "pivot", actions)
        return replace(state, phase=Phase.PIVOTING), False
    if plan.step is not None and ckpt.step > plan.step:
        actions.append(set_aside(ckpt.step, ckpt.name, plan.step))
        return state, True
    return state, False


def set_aside(step: int, name: str, pivot_step: int) -> Quarantine:
    """A checkpoint written under the old policy after the pivot's own: kept, never resumed
    from."""
    return Quarantine(
        step,
        name,
        f"written under the old policy after pivot step {pivot_step}",
        cause="pivot",
        cause_step=pivot_step,
    )


def _set_aside_after(state: State, pivot_step: int, actions: list[Action]) -> State:
    """Quarantine the checkpoints written under the old policy after the pivot's own: they
    are kept, never resumed from."""
    later = [c for c in state.checkpoints if c.step > pivot_step]
    for c in later:
        actions.append(set_aside(c.step, c.name, pivot_step))
    return without_checkpoints(state, {c.step for c in later})


def on_trainer_stopped(state: State, t: float, rules: Rules, actions: list[Action]) -> State:
    """The trainer is down after the pivot checkpoint: archive, then the new policy."""
    plan = state.pivot
    assert plan is not None and plan.step is not None
    state = _set_aside_after(state, plan.step, actions)
    # Its last saves may still be verifying: set aside as they end (progress.on_committed).
    state = barrier.fence_after(state, plan.step)
    return _start_archiving(
        replace(state, phase=Phase.PIVOTING, stop_reason=None, kill_at=None), actions
    )


def _start_archiving(state: State, actions: list[Action]) -> State:
    assert state.pivot is not None and state.pivot.step is not None
    step = state.pivot.step
    plan = replace(state.pivot, stage="archiving")
    actions.append(Record({"kind": "pivot_stage", "stage": "archiving", "archive": plan.archive}))
    actions.append(Archive(plan.archive, step, plan.old_policy, plan.new_policy))
    return replace(state, pivot=plan)


def on_progress(state: State, ev: PivotProgress, rules: Rules, actions: list[Action]) -> State:
    plan = state.pivot
    if plan is None:
        return state
    if ev.error is not None:
        actions.append(Record({"kind": "pivot_failed", "stage": plan.stage, "error": ev.error}))
        if plan.request_id is not None:
            reply_error(
                actions, plan.request_id, "internal", f"pivot failed at {plan.stage}: {ev.error}"
            )
        state = replace(
            state,
            phase=Phase.STOPPED,
            pivot=replace(plan, request_id=None, stop_after=False),
            halt_reason=f"pivot failed at {plan.stage}: {ev.error}; fix it, then `trainwarden start` "
            "completes the pivot",
        )
        # A stop asked during the pivot: the run is stopped.
        return finish_stop(state, actions, {}) if plan.stop_after else state
    if ev.done == "archived" and plan.stage == "archiving":
        plan = replace(plan, stage="writing_policy")
        actions.append(Record({"kind": "pivot_stage", "stage": "writing_policy"}))
        actions.append(WritePolicy(plan.new_policy))
        return replace(state, pivot=plan)
    if ev.done == "policy_written" and plan.stage == "writing_policy":
        return _finish(state, ev.t, rules, actions)
    return state


def _finish(state: State, t: float, rules: Rules, actions: list[Action]) -> State:
    plan = state.pivot
    assert plan is not None and plan.step is not None
    actions.append(
        Record(
            {
                "kind": "pivot",
                "step": plan.step,
                "old_policy": plan.old_policy,
                "new_policy": plan.new_policy,
                "archive": plan.archive,
                "zombies": list(plan.zombies),
            },
        )
    )
    if plan.request_id is not None:
        actions.append(
            Reply(
                plan.request_id,
                ok=True,
                result={"step": plan.step, "archive": plan.archive, "zombies": list(plan.zombies)},
            )
        )
    state = replace(state, pivot=None, last_pivot_step=plan.step)
    if state.shutdown:
        shutdown_exit(state, actions, Phase.STOPPED)
        return replace(state, phase=Phase.STOPPED, halt_reason="stopped by operator")
    if plan.stop_after:
        # The operator's stop, asked during the pivot, stands: no start under the new policy
        # until `trainwarden start` (which resumes from the pivot's checkpoint).
        state = replace(state, phase=Phase.STOPPED, halt_reason="stopped by operator")
        if state.pending or state.containing:
            return replace(state, stop_due=True)
        return finish_stop(state, actions, {})
    return spawn(state, t, actions, "pivot")


def abort(state: State, actions: list[Action], why: str, code: ErrorCode = "wrong_state") -> State:
    """Give up a pivot that has not reached `archiving`: the old policy stays."""
    plan = state.pivot
    if plan is None or plan.stage in ("archiving", "writing_policy"):
        return state
    actions.append(Record({"kind": "pivot_rolled_back", "stage": plan.stage, "reason": why}))
    if plan.request_id is not None:
        reply_error(actions, plan.request_id, code, f"pivot abandoned: {why}")
    pinned = state.pinned
    if plan.step is not None and not plan.was_pinned:
        pinned = pinned - {plan.step}
    state = replace(state, pivot=None, pinned=pinned)
    if state.phase == Phase.PIVOTING:
        state = replace(state, phase=Phase.RUNNING if state.trainer_alive else state.phase)
    return state


def resume_after_restart(state: State, t: float, rules: Rules, actions: list[Action]) -> State:
    """A daemon started with a pivot in its journal: finish it or roll it back."""
    plan = state.pivot
    assert plan is not None
    if plan.stage in ("saving", "stopping"):
        state = abort(state, actions, "the daemon restarted before the pivot's point of no return")
        state = apply_retention(state, rules, actions)
        return spawn(state, t, actions)
    actions.append(Record({"kind": "pivot_resumed", "stage": plan.stage, "step": plan.step}))
    if plan.step is not None:
        state = _set_aside_after(state, plan.step, actions)
    state = replace(state, phase=Phase.PIVOTING, pivot=replace(plan, request_id=None))
    if plan.stage == "archiving":
        assert plan.step is not None
        actions.append(Archive(plan.archive, plan.step, plan.old_policy, plan.new_policy))
        return state
    actions.append(WritePolicy(plan.new_policy))
    return state
