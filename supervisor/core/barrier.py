"""The verification barrier: no decision that names a checkpoint is taken while one
committed before it is still being verified.

The shell reports each commit it sees (CheckpointSeen) before verifying it, and every
verification ends in exactly one event: committed, rejected, vanished, changed or
unchanged. Until then the checkpoint is pending, and what would name a checkpoint waits:

- a trainer start (`spawn_due`): it resumes from the newest good checkpoint, not the
  newest one verified so far;
- the replies of stop and shutdown, and the daemon's exit after a shutdown (`stop_due`);
- a waiting save's reply: it names the first checkpoint at or after the save's step
  committed since the request, never one beyond a checkpoint still pending.
- the resume step a record foretells (`resume_forecast`, `rollback_forecast`): the
  divergence record's rollback target, the `restart_scheduled` and `fallback` records'
  `resume_step`. While a checkpoint that may become the newest is pending, the record
  names none (it lists them); the start, once they are verified, resumes from the newest
  good one, and its spawn record says which (after a divergence, beside the divergence it
  rolls back from).

The first two also wait while the last start's other processes are being stopped
(`containing`). What those commit meanwhile (a worker saving on the SIGTERM) is stray, like
their log lines: quarantined, never counted, never the next start's.

Retention and the mirror need no wait: they only ever count verified checkpoints, and a
pending one is not among them. A verification still running verify_timeout_s after it
started is given up on (journaled `verification_overdue`), so nothing waits forever; the
replies name such a checkpoint under `unverified` instead of skipping it in silence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainwarden.supervisor.core.actions import Action, Record, Reply
from trainwarden.supervisor.core.events import CheckpointSeen
from trainwarden.supervisor.core.state import Ckpt, Pending, Rules, State, Waiter
from trainwarden.supervisor.core.transitions import finish_stop, save_late, spawn

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import ResumeForecast, RollbackForecast


def seen(state: State, ev: CheckpointSeen) -> State:
    if any(p.name == ev.name for p in state.pending):
        return state
    pending = Pending(ev.name, ev.step, ev.t, stray=state.containing)
    return replace(state, pending=(*state.pending, pending))


def is_stray(state: State, name: str) -> bool:
    """`name` was committed by a process of an ended start (see Pending.stray)."""
    return any(p.name == name and p.stray for p in state.pending)


def after_pivot(state: State, name: str) -> int | None:
    """The pivot step `name` was written after by the old policy's trainer (see
    Pending.after_pivot), if it was."""
    return next((p.after_pivot for p in state.pending if p.name == name), None)


def fence_after(state: State, step: int) -> State:
    """Mark the checkpoints still being verified past a pivot's `step` as the old policy's."""
    return replace(
        state,
        pending=tuple(
            replace(p, after_pivot=step) if p.step > step and not p.stray else p
            for p in state.pending
        ),
    )


def resolved(state: State, name: str) -> State:
    """The verification of `name` ended (whatever its outcome)."""
    if any(p.name == name for p in state.pending):
        state = replace(state, pending=tuple(p for p in state.pending if p.name != name))
    if name in state.unverified:
        state = replace(state, unverified=tuple(n for n in state.unverified if n != name))
    return state


def in_flight_before(state: State, step: int | None) -> list[str]:
    """Checkpoints before `step` (None: any) still being verified: each may yet become the
    newest."""
    return [p.name for p in state.pending if (step is None or p.step < step) and not p.stray]


def resume_forecast(state: State, before: int | None = None) -> ResumeForecast:
    """What a record may say now of the checkpoint the next start resumes from: its step,
    under `resume_step`, only when no checkpoint still being verified can change it (one
    before `before`, the first poisoned step, if any); otherwise the ones it awaits. The
    start's spawn record names what it really resumed from."""
    awaiting = in_flight_before(state, before)
    if awaiting:
        return {"awaiting_verification": awaiting}
    return {"resume_step": state.newest.step if state.newest else None}


def rollback_forecast(state: State, before: int) -> RollbackForecast:
    """resume_forecast as the divergence record says it: the step under `rollback_to`."""
    awaiting = in_flight_before(state, before)
    if awaiting:
        return {"awaiting_verification": awaiting}
    return {"rollback_to": state.newest.step if state.newest else None}


def deadline(state: State, rules: Rules) -> float | None:
    """When the oldest pending verification is given up on."""
    if not state.pending:
        return None
    due = min(p.since for p in state.pending) + rules.verify_timeout_s
    # Leaving a Slurm job: the job is requeued by its deadline, verified or not.
    return min(due, state.requeue.by) if state.requeue is not None else due


def give_up_overdue(state: State, t: float, rules: Rules, actions: list[Action]) -> State:
    cut = state.requeue is not None and t >= state.requeue.by
    overdue = [p for p in state.pending if cut or t - p.since >= rules.verify_timeout_s]
    if not overdue:
        return state
    if cut:
        save_late(state, t, f"verification of {overdue[0].name}", actions)
    for p in overdue:
        actions.append(
            Record(
                {
                    "kind": "verification_overdue",
                    "name": p.name,
                    "step": p.step,
                    "waited_s": round(t - p.since, 3),
                },
            )
        )
    return replace(
        state,
        pending=tuple(p for p in state.pending if p not in overdue),
        unverified=(*state.unverified, *(p.name for p in overdue)),
    )


def offer(state: State, ckpt: Ckpt) -> State:
    """`ckpt` was just committed (or committed again, unchanged): the answer of every
    waiting save whose step it reaches, unless an older one already is."""
    changed = False
    waiters = []
    for w in state.waiters:
        reaches = w.kind == "save" and ckpt.step >= w.step
        if reaches and (w.answer is None or ckpt.step < w.answer.step):
            w = replace(w, answer=ckpt)
            changed = True
        waiters.append(w)
    return replace(state, waiters=tuple(waiters)) if changed else state


def release(state: State, t: float, rules: Rules, actions: list[Action]) -> State:
    """After every event: what waited for verifications that have now ended."""
    if not (state.waiters or state.stop_due or state.spawn_due):
        return state  # the common case, every step line
    state = _answer_saves(state, actions)
    if state.pending or state.containing:
        return state
    if state.stop_due:
        state = finish_stop(state, actions, unverified(state))
    if state.spawn_due and not state.trainer_alive:
        state = spawn(replace(state, spawn_due=False), t, actions)
    return state


def unverified(state: State) -> dict[str, Any]:
    """What a reply that names a checkpoint adds when some verification was given up on."""
    return {"unverified": list(state.unverified)} if state.unverified else {}


def _answer_saves(state: State, actions: list[Action]) -> State:
    done: list[Waiter] = []
    kept = {c.name for c in state.checkpoints}
    for w in state.waiters:
        answer = w.answer
        if w.kind != "save" or answer is None or answer.name not in kept:
            continue
        if any(w.step <= p.step < answer.step for p in state.pending):
            continue  # an older checkpoint that may be the save's own is still being verified
        actions.append(
            Reply(
                w.request_id,
                ok=True,
                result={"step": answer.step, "name": answer.name, **unverified(state)},
            )
        )
        done.append(w)
    if not done:
        return state
    return replace(state, waiters=tuple(w for w in state.waiters if w not in done))
