"""The operator's commands: what the policy does with each, given the run's phase."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from trainwarden.supervisor.core import gpu_faults, pivot
from trainwarden.supervisor.core.actions import Action, Progress, Record, Reply, SignalTrainer
from trainwarden.supervisor.core.events import Operator, RequestAbandoned
from trainwarden.supervisor.core.phases import HALTED, Phase
from trainwarden.supervisor.core.requests import (
    Pin,
    Pivot,
    Save,
    Shutdown,
    Start,
    Stop,
    Unpin,
    command_args,
    command_name,
)
from trainwarden.supervisor.core.retention import apply_retention, retention_deletions
from trainwarden.supervisor.core.state import KILLS_TO_RESTART, Rules, State, Waiter
from trainwarden.supervisor.core.transitions import (
    NO_CHECKPOINT_INSTRUCTION,
    finish_stop,
    reply_error,
    spawn,
    steps_lost,
    stop_trainer,
    supersede_saves,
)

STOP_GRACE_S = 60.0
"""How much longer than stop_timeout_s a stop or shutdown request waits for the exit."""

NO_SAVE_HANDLER = (
    "the trainer does not handle SIGUSR1 (a save request would kill it); add a handler:"
    " see docs/trainer-contract.md, 'Saving on request'"
)


def on_operator(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    command = ev.command
    # An unpin's dry run changes nothing: journaled, the question would bury what happened.
    if not (isinstance(command, Unpin) and command.dry_run):
        actions.append(
            Record(
                {
                    "kind": "operator",
                    "cmd": command_name(command),
                    "args": command_args(command),
                    "uid": ev.uid,
                },
            )
        )
    if isinstance(command, Pivot) and _lacks(ev, "SIGUSR1"):
        # The pivot's own checks come first; refused only where it would send SIGUSR1.
        tried: list[Action] = []
        after = pivot.cmd_pivot(state, ev, rules, tried)
        if any(isinstance(a, SignalTrainer) and a.signal == "SIGUSR1" for a in tried):
            reply_error(actions, ev.request_id, "unsupported", NO_SAVE_HANDLER)
            return state
        actions.extend(tried)
        return after
    return COMMANDS[type(command)](state, ev, rules, actions)


def on_abandoned(state: State, ev: RequestAbandoned, rules: Rules, actions: list[Action]) -> State:
    """Its client has gone: nobody waits for the answer, so nothing may wait on it."""
    gone = [w for w in state.waiters if w.request_id == ev.request_id]
    for w in gone:
        actions.append(
            Record({"kind": "request_abandoned", "request_id": w.request_id, "command": w.kind})
        )
    if not gone:
        return state
    return replace(state, waiters=tuple(w for w in state.waiters if w not in gone))


def _lacks(ev: Operator, signal: str) -> bool:
    """The trainer is known not to catch `signal` (unknown: assume it does)."""
    return ev.handles is not None and signal not in ev.handles


def _unforced_kill(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> bool:
    """Refuse a stop (or shutdown) that would kill a trainer without SIGTERM handler and
    lose steps, unless forced; True if refused."""
    command = ev.command
    assert isinstance(command, Stop | Shutdown)
    lost = steps_lost(state)
    if command.force or not state.trainer_alive or not _lacks(ev, "SIGTERM") or lost == 0:
        return False
    newest = state.newest
    name = command_name(command)
    reply_error(
        actions,
        ev.request_id,
        "unsupported",
        f"the trainer does not handle SIGTERM: {name} would have it killed without saving,"
        f" losing {lost} steps since the newest checkpoint"
        f" ({f'step {newest.step}' if newest else 'none'}); save first if it handles"
        f" SIGUSR1, or `trainwarden {name} --force` to lose them",
    )
    return True


def save(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    assert isinstance(ev.command, Save)
    timeout = ev.command.timeout_s
    if timeout is not None and timeout > rules.save_wait_timeout_s:
        reply_error(
            actions,
            ev.request_id,
            "bad_argument",
            f"'timeout_s' may be at most save_wait_timeout_s = {rules.save_wait_timeout_s:g} s"
            f" ([trainer] in the run's config), got {timeout:g}",
        )
        return state
    if state.phase not in (Phase.RUNNING, Phase.SAVING) or not state.trainer_alive:
        reply_error(
            actions,
            ev.request_id,
            "wrong_state",
            f"cannot save while the run is {state.phase}: a save needs a running trainer",
        )
        return state
    if _lacks(ev, "SIGUSR1"):
        reply_error(actions, ev.request_id, "unsupported", NO_SAVE_HANDLER)
        return state
    actions.append(SignalTrainer("SIGUSR1", "operator save"))
    target = (state.last_step or 0) if state.last_step is not None else (state.resume_step or 0)
    # The step the checkpoint must reach: its reply names the first one at or after it.
    actions.append(Record({"kind": "save_requested", "step": target, "wait": ev.command.wait}))
    if ev.command.wait:
        timeout = timeout or rules.save_wait_timeout_s
        waiter = Waiter(ev.request_id, "save", target, ev.t + timeout)
        return replace(state, phase=Phase.SAVING, waiters=(*state.waiters, waiter))
    actions.append(Reply(ev.request_id, ok=True, result={"requested": True, "step": target}))
    return replace(state, phase=Phase.SAVING)


def stop(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    if (
        state.trainer_alive
        and state.phase == Phase.STOPPING
        and state.stop_reason in KILLS_TO_RESTART
    ):
        return _stop_instead_of_restart(state, ev, rules, actions)
    if state.gpu_fault is not None and state.phase == Phase.STOPPING:
        return _stop_during_gpu_fault(state, ev, rules, actions)
    # A pivot under way (a failed one waits, stopped, for `start` to complete it).
    plan = state.pivot if state.phase == Phase.PIVOTING else None
    if plan is not None and plan.stage != "saving":
        return _stop_after_pivot(state, ev, rules, actions)
    if _unforced_kill(state, ev, rules, actions):
        return state
    if plan is not None:
        # No pivot checkpoint yet: the pivot is given up (the old policy stays), and the
        # stop goes on as any other.
        state = pivot.abort(state, actions, "stopped by operator")
    if state.phase == Phase.BACKOFF or state.spawn_due:
        actions.append(Record({"kind": "restart_cancelled"}))
        state = replace(
            state,
            phase=Phase.STOPPED,
            backoff_until=None,
            spawn_due=False,
            halt_reason="stopped by operator",
        )
        return _reply_stopped(state, ev, rules, actions)
    if not state.trainer_alive or state.phase not in (
        Phase.STARTING,
        Phase.RUNNING,
        Phase.SAVING,
    ):
        reply_error(
            actions, ev.request_id, "wrong_state", f"nothing to stop: the run is {state.phase}"
        )
        return state
    waiter = Waiter(ev.request_id, "stop", 0, ev.t + rules.stop_timeout_s + STOP_GRACE_S)
    state = supersede_saves(state, actions, "stop")
    state = stop_trainer(state, ev.t, rules, "operator", actions)
    state = replace(state, waiters=(*state.waiters, waiter))
    _tell_stopping(state, ev, rules, actions)
    return state


def _stop_instead_of_restart(
    state: State, ev: Operator, rules: Rules, actions: list[Action]
) -> State:
    """The daemon is already stopping the trainer (it hung, or its loss went bad) to restart
    it: the operator's stop stands once it is gone, in place of the restart. The stop's
    reply waits for the exit, as any stop's does; the kill goes on as it was decided."""
    assert state.stop_reason is not None
    why = KILLS_TO_RESTART[state.stop_reason]
    state = _waits_for_the_exit(state, ev, rules, actions)
    actions.append(
        Progress(
            ev.request_id,
            f"the daemon is already stopping the trainer ({why}): the run stops once it is"
            " gone, with no restart",
        )
    )
    return state


def _waits_for_the_exit(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    """A stop asked while the daemon already stops the trainer (or handles what follows):
    it pre-empts a waiting save and waits, past the kill already due, for the end."""
    state = supersede_saves(state, actions, "stop")
    due = max(ev.t, state.dump_until or ev.t, state.kill_at or ev.t)
    waiter = Waiter(ev.request_id, "stop", 0, due + rules.stop_timeout_s + STOP_GRACE_S)
    return replace(state, waiters=(*state.waiters, waiter))


def _stop_during_gpu_fault(
    state: State, ev: Operator, rules: Rules, actions: list[Action]
) -> State:
    """The daemon is stopping the trainer for a GPU fault, or waits for the GPU to be free
    (or reset) to start it again: the stop stands, and the run halts in gpu_fault, whose
    reason says what the GPU still needs, as soon as the trainer is gone."""
    fault = state.gpu_fault
    assert fault is not None
    state = _waits_for_the_exit(state, ev, rules, actions)
    state = replace(state, gpu_fault=replace(fault, stop_asked=True))
    if not state.trainer_alive:
        return gpu_faults.halt(state, fault, actions)
    actions.append(
        Progress(
            ev.request_id,
            f"the daemon is already stopping the trainer (GPU {fault.gpu} faulted): the run"
            " halts once it is gone, with no restart",
        )
    )
    return state


def _stop_after_pivot(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    """Past its checkpoint a pivot finishes (the trainer stopped, the old policy archived,
    the new one written); then the run stops instead of starting again. The stop's reply
    comes then."""
    plan = state.pivot
    assert plan is not None
    state = _waits_for_the_exit(state, ev, rules, actions)
    actions.append(
        Progress(
            ev.request_id,
            f"the pivot is past its checkpoint (step {plan.step}): it finishes, then the run"
            " stops, with no restart",
        )
    )
    return replace(state, pivot=replace(plan, stop_after=True))


def _tell_stopping(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> None:
    rid = ev.request_id
    actions.append(Progress(rid, f"sent SIGTERM to pid {state.trainer_pid}"))
    if _lacks(ev, "SIGTERM"):
        actions.append(Progress(rid, "the trainer does not handle SIGTERM: it dies without saving"))
    actions.append(
        Progress(
            rid,
            "waiting for the trainer to save and exit"
            f" (stop_timeout_s = {rules.stop_timeout_s:g} s)",
        )
    )


def start(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    assert isinstance(ev.command, Start)
    if state.phase not in HALTED:
        reply_error(
            actions,
            ev.request_id,
            "wrong_state",
            f"the run is {state.phase}; start works from stopped, finished, crash_loop,"
            " diverged, gpu_fault or no_checkpoint",
        )
        return state
    if ev.command.from_scratch and (state.checkpoints or state.pending):
        newest = state.newest.step if state.newest else "being verified"
        reply_error(
            actions,
            ev.request_id,
            "bad_argument",
            f"the run has a verified checkpoint (step {newest}): `start` resumes from it;"
            " starting over from step 0 is only for a run with none left",
        )
        return state
    nothing_left = not state.checkpoints and not state.pending and state.verified_high is not None
    if not ev.command.from_scratch and nothing_left and state.pivot is None:
        reply_error(
            actions,
            ev.request_id,
            "no_checkpoint",
            f"no verified checkpoint is left to resume from (the run had reached step"
            f" {state.verified_high}): {NO_CHECKPOINT_INSTRUCTION}",
        )
        return state
    state = replace(
        state,
        from_scratch=ev.command.from_scratch,
        restart_cause="operator",
        restarts_without_progress=0,
        next_backoff_s=rules.backoff_initial_s,
        divergences=0,
        divergence_step=None,
        suspects=(),
        fallbacks=0,
    )
    if state.pivot is not None:
        state = pivot.resume_after_restart(state, ev.t, rules, actions)
        actions.append(Reply(ev.request_id, ok=True, result={"state": state.phase}))
        return state
    state = spawn(state, ev.t, actions, "operator")
    # Answered once the trainer has started, naming the checkpoint it really resumes from:
    # the start may wait for verifications, and the shell refuses a checkpoint whose files
    # changed since its commit (then the next older one is tried).
    waiter = Waiter(ev.request_id, "start", 0, ev.t + rules.verify_timeout_s)
    return replace(state, waiters=(*state.waiters, waiter))


def pin(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    assert isinstance(ev.command, Pin)
    step = ev.command.step
    if all(c.step != step for c in state.checkpoints):
        known = ", ".join(str(c.step) for c in state.checkpoints) or "none"
        reply_error(
            actions,
            ev.request_id,
            "bad_argument",
            f"no verified checkpoint at step {step} (have: {known})",
        )
        return state
    actions.append(Reply(ev.request_id, ok=True, result={"step": step, "pinned": True}))
    return replace(state, pinned=state.pinned | {step})


def unpin(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    assert isinstance(ev.command, Unpin)
    step = ev.command.step
    if step not in state.pinned:
        reply_error(actions, ev.request_id, "bad_argument", f"step {step} is not pinned")
        return state
    unpinned = replace(state, pinned=state.pinned - {step})
    if ev.command.dry_run:
        doomed = [c.step for c in retention_deletions(unpinned, rules)]
        result = {"step": step, "pinned": True, "dry_run": True, "would_delete": doomed}
        actions.append(Reply(ev.request_id, ok=True, result=result))
        return state
    actions.append(Reply(ev.request_id, ok=True, result={"step": step, "pinned": False}))
    return apply_retention(unpinned, rules, actions)


def shutdown(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    if state.stop_reason is None and _unforced_kill(state, ev, rules, actions):
        return state
    state = replace(state, shutdown=True)
    state = supersede_saves(state, actions, "shutdown")
    if state.trainer_alive:
        waiter = Waiter(ev.request_id, "stop", 0, ev.t + rules.stop_timeout_s + STOP_GRACE_S)
        # A hang's stacks still being dumped: the shutdown does not wait for them.
        if state.stop_reason is None or state.dump_until is not None:
            state = stop_trainer(state, ev.t, rules, "shutdown", actions)
            state = replace(state, waiters=(*state.waiters, waiter))
            _tell_stopping(state, ev, rules, actions)
            return state
        actions.append(
            Progress(ev.request_id, f"the trainer is already stopping ({state.stop_reason})")
        )
        state = replace(state, stop_reason="shutdown")
        return replace(state, waiters=(*state.waiters, waiter))
    state = replace(
        state,
        phase=Phase.STOPPED if state.phase == Phase.BACKOFF or state.spawn_due else state.phase,
        spawn_due=False,
    )
    return _reply_stopped(state, ev, rules, actions)


def _reply_stopped(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    """No trainer is running: answer with the newest verified checkpoint (and exit, after a
    shutdown) once no checkpoint is still being verified."""
    waiter = Waiter(ev.request_id, "stop", 0, ev.t + rules.verify_timeout_s + STOP_GRACE_S)
    state = replace(state, waiters=(*state.waiters, waiter))
    if state.pending or state.containing:
        return replace(state, stop_due=True)
    return finish_stop(state, actions, {})


Handler = Callable[[State, Operator, Rules, list[Action]], State]

COMMANDS: dict[type, Handler] = {
    Save: save,
    Stop: stop,
    Start: start,
    Pin: pin,
    Unpin: unpin,
    Shutdown: shutdown,
    Pivot: pivot.cmd_pivot,
}
