"""The moves several handlers share: start a trainer, stop it, answer waiting requests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainwarden.supervisor.core.actions import Action, Exit, Record, Reply, SignalTrainer, Spawn
from trainwarden.supervisor.core.phases import Phase
from trainwarden.supervisor.core.state import Rules, State, StopReason, ckpt_json


def spawn(state: State, t: float, actions: list[Action]) -> State:
    """Start a trainer from the newest verified checkpoint (none: from scratch), once no
    checkpoint committed before now is still being verified (see core.barrier)."""
    if state.pending:
        if not state.spawn_due:
            actions.append(
                Record(
                    "awaiting_verification",
                    {"for": "trainer start", "names": [p.name for p in state.pending]},
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
            backoff_until=None,
            halt_reason=None,
        )
    resume = state.newest
    seg = state.seg + 1
    # A checkpoint from before the last pivot carries the old policy's bandit: the trainer
    # must start its bandit fresh under the new policy.json (weights and moments stay).
    pivot = (
        resume is not None
        and state.last_pivot_step is not None
        and resume.step <= state.last_pivot_step
    )
    actions.append(Spawn(seg=seg, resume=resume, pivot=pivot))
    return replace(
        state,
        phase=Phase.STARTING,
        seg=seg,
        resume_step=resume.step if resume else None,
        last_step=None,
        last_activity_t=t,
        stop_reason=None,
        kill_at=None,
        backoff_until=None,
        progress_since_start=False,
        poisoned_from=None,
        halt_reason=None,
    )


def stop_trainer(
    state: State, t: float, rules: Rules, reason: StopReason, actions: list[Action]
) -> State:
    """SIGTERM now, SIGKILL if it has not exited within stop_timeout_s."""
    actions.append(SignalTrainer("SIGTERM", reason))
    return replace(
        state, phase=Phase.STOPPING, stop_reason=reason, kill_at=t + rules.stop_timeout_s
    )


def finish_stop(state: State, actions: list[Action], extra: dict[str, Any]) -> State:
    """The trainer is stopped: answer stop and shutdown requests with the newest verified
    checkpoint (and `extra`), fail the other waiters, and exit after a shutdown."""
    result = {"state": "stopped", "checkpoint": ckpt_json(state.newest), **extra}
    state = settle_waiters(state, actions, kind="stop", result=result)
    state = fail_waiters(state, actions, "wrong_state", "the trainer stopped")
    if state.shutdown:
        actions.append(Exit(0))
    return replace(state, stop_due=False)


def reply_error(actions: list[Action], request_id: int, code: str, message: str) -> None:
    actions.append(Reply(request_id, ok=False, code=code, message=message))


def settle_waiters(
    state: State, actions: list[Action], *, kind: str, result: dict[str, Any]
) -> State:
    """Answer every waiter of `kind` with `result`."""
    done = [w for w in state.waiters if w.kind == kind]
    for w in done:
        actions.append(Reply(w.request_id, ok=True, result=result))
    return replace(state, waiters=tuple(w for w in state.waiters if w.kind != kind))


def fail_waiters(state: State, actions: list[Action], code: str, message: str) -> State:
    for w in state.waiters:
        reply_error(actions, w.request_id, code, message)
    return replace(state, waiters=())


def describe_exit(returncode: int, signal_name: str | None = None) -> str:
    """How a trainer ended, for the journal and the operator ("killed by SIGKILL")."""
    if returncode < 0:
        return f"killed by {signal_name or f'signal {-returncode}'}"
    return f"exit status {returncode}"
