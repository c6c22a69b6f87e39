"""The daemon's start in the policy: the state a previous daemon left restored, the
checkpoints found on disk judged (verified, changed since their commit, implausible,
quarantined before), what a crash of the last daemon lost, and the first spawn."""

from __future__ import annotations

from dataclasses import replace

from trainwarden.supervisor.core import pivot, rollback
from trainwarden.supervisor.core.actions import Action, Quarantine, ReadMirrorPointer, Record
from trainwarden.supervisor.core.events import Outcome, Restored, Startup
from trainwarden.supervisor.core.persist import restore
from trainwarden.supervisor.core.phases import HALTED
from trainwarden.supervisor.core.plausible import implausible_at_startup, largest_gap
from trainwarden.supervisor.core.progress import diverged_unseen
from trainwarden.supervisor.core.retention import apply_retention
from trainwarden.supervisor.core.state import Ckpt, Rules, State
from trainwarden.supervisor.core.transitions import spawn


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
                        {
                            "kind": "checkpoint_changed",
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
                {
                    "kind": "boot_recovery",
                    "resume_step": newest.step if newest else None,
                    "last_logged_step": ev.last_logged_step,
                    "steps_lost": max(lost, 0) if lost is not None else None,
                },
            )
        )
    if state.resumes_after is not None:
        actions.append(Record({"kind": "resumed_after_signal", "signal": state.resumes_after}))
        state = replace(state, resumes_after=None)
    if ev.diverged is not None:
        state = diverged_unseen(state, *ev.diverged, rules, actions)
    if state.pivot is not None and state.phase not in HALTED:
        return pivot.resume_after_restart(
            replace(state, restart_cause="daemon"), ev.t, rules, actions
        )
    state = apply_retention(state, rules, actions)
    if state.phase in HALTED:
        actions.append(Record({"kind": "idle", "state": state.phase, "reason": state.halt_reason}))
        return state
    return spawn(state, ev.t, actions, cause="daemon")
