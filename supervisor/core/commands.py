"""The operator's commands: what the policy does with each, given the run's phase."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from trainwarden.supervisor.core import pivot
from trainwarden.supervisor.core.actions import Action, Record, Reply, SignalTrainer
from trainwarden.supervisor.core.events import Operator
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
from trainwarden.supervisor.core.retention import apply_retention
from trainwarden.supervisor.core.state import Rules, State, Waiter
from trainwarden.supervisor.core.transitions import finish_stop, reply_error, spawn, stop_trainer

STOP_GRACE_S = 60.0
"""How much longer than stop_timeout_s a stop or shutdown request waits for the exit."""


def on_operator(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    command = ev.command
    actions.append(
        Record(
            "operator",
            {"cmd": command_name(command), "args": command_args(command), "uid": ev.uid},
        )
    )
    return COMMANDS[type(command)](state, ev, rules, actions)


def save(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    assert isinstance(ev.command, Save)
    if state.phase not in (Phase.RUNNING, Phase.SAVING) or not state.trainer_alive:
        reply_error(
            actions,
            ev.request_id,
            "wrong_state",
            f"cannot save while the run is {state.phase}: a save needs a running trainer",
        )
        return state
    actions.append(SignalTrainer("SIGUSR1", "operator save"))
    target = (state.last_step or 0) if state.last_step is not None else (state.resume_step or 0)
    # The step the checkpoint must reach: its reply names the first one at or after it.
    actions.append(Record("save_requested", {"step": target, "wait": ev.command.wait}))
    if ev.command.wait:
        timeout = ev.command.timeout_s or rules.save_wait_timeout_s
        waiter = Waiter(ev.request_id, "save", target, ev.t + timeout)
        return replace(state, phase=Phase.SAVING, waiters=(*state.waiters, waiter))
    actions.append(Reply(ev.request_id, ok=True, result={"requested": True, "step": target}))
    return replace(state, phase=Phase.SAVING)


def stop(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    if state.phase == Phase.BACKOFF or state.spawn_due:
        actions.append(Record("restart_cancelled", {}))
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
    state = stop_trainer(state, ev.t, rules, "operator", actions)
    return replace(state, waiters=(*state.waiters, waiter))


def start(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    if state.phase not in HALTED:
        reply_error(
            actions,
            ev.request_id,
            "wrong_state",
            f"the run is {state.phase}; start works from stopped, finished, crash_loop or diverged",
        )
        return state
    state = replace(
        state,
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
    state = spawn(state, ev.t, actions)
    if state.spawn_due:
        # Answered once the trainer starts, naming the checkpoint it really resumes from.
        waiter = Waiter(ev.request_id, "start", 0, ev.t + rules.verify_timeout_s)
        return replace(state, waiters=(*state.waiters, waiter))
    actions.append(
        Reply(
            ev.request_id, ok=True, result={"state": "starting", "resume_step": state.resume_step}
        )
    )
    return state


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
    actions.append(Reply(ev.request_id, ok=True, result={"step": step, "pinned": False}))
    state = replace(state, pinned=state.pinned - {step})
    return apply_retention(state, rules, actions)


def shutdown(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    state = replace(state, shutdown=True)
    if state.trainer_alive:
        waiter = Waiter(ev.request_id, "stop", 0, ev.t + rules.stop_timeout_s + STOP_GRACE_S)
        if state.stop_reason is None:
            state = stop_trainer(state, ev.t, rules, "shutdown", actions)
        else:
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
    if state.pending:
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
