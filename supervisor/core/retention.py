"""Which checkpoints go: the local checkpoint directory's retention, the mirror's, and
quarantine for a checkpoint whose content changed after its commit."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from trainwarden.supervisor.core.actions import Action, Delete, PruneMirror, Quarantine, Record
from trainwarden.supervisor.core.events import MirrorCopied
from trainwarden.supervisor.core.phases import Phase
from trainwarden.supervisor.core.state import Ckpt, Rules, State, without_checkpoints

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import Mirrored, MirrorFailed, MirrorSuperseded


def retention_deletions(state: State, rules: Rules) -> list[Ckpt]:
    """Verified checkpoints that retention removes now, oldest first.

    Keeps the newest keep_last unpinned ones at or below the running trainer's logged step,
    every one above it, every pinned one, the rollback rungs (see rollback_rungs), and the
    one the running trainer resumed from while it has not yet logged a step past it.
    """
    unpinned = _counted(state)
    if len(unpinned) <= rules.keep_last:
        return []
    loading = state.last_step is None or (
        state.resume_step is not None and state.last_step <= state.resume_step
    )
    busy = state.trainer_alive or state.phase == Phase.BACKOFF
    in_use = state.resume_step if busy and loading else None
    rungs = rollback_rungs(state, unpinned, rules)
    return [c for c in unpinned[: -rules.keep_last] if c.step != in_use and c.step not in rungs]


def _counted(state: State) -> list[Ckpt]:
    """The unpinned checkpoints keep_last counts, oldest first."""
    unpinned = [c for c in state.checkpoints if c.step not in state.pinned]
    if state.trainer_alive and state.last_step is not None:
        # A commit ahead of the steps the trainer has logged (planted, or from elsewhere)
        # evicts nothing until the trainer's own steps reach it: keep_last counts the rest.
        unpinned = [c for c in unpinned if c.step <= state.last_step]
    return unpinned


def rollback_rungs(state: State, unpinned: list[Ckpt], rules: Rules) -> set[int]:
    """While spike rollback is on, a spike must find a checkpoint at least rollback_steps
    before it. When none of the newest keep_last (nor a pinned one) is that far before the
    newest, retention also keeps the newest one that is (the anchor) and the oldest after
    it, which becomes the next anchor once the newest is rollback_steps past it; with none
    that far back yet, the oldest, which will be the first. The rollback target so stays
    between rollback_steps and about twice that behind the newest."""
    if not rules.spikes.enabled or not unpinned:
        return set()
    reach = unpinned[-1].step - rules.spikes.rollback_steps
    kept = [c.step for c in unpinned[-rules.keep_last :]]
    # A pinned step counts only while its checkpoint is there (a config may pin any step).
    pinned = [c.step for c in state.checkpoints if c.step in state.pinned]
    if any(step <= reach for step in [*kept, *pinned]):
        return set()
    far = [c.step for c in unpinned if c.step <= reach]
    if not far:
        return {unpinned[0].step}
    after = [c.step for c in unpinned if c.step > far[-1]]
    return {far[-1], *after[:1]}


def next_to_delete(state: State, rules: Rules) -> int | None:
    """The step retention would delete after the next committed checkpoint."""
    unpinned = [c for c in state.checkpoints if c.step not in state.pinned]
    if len(unpinned) < rules.keep_last:
        return None
    rungs = rollback_rungs(state, unpinned, rules)
    return next((c.step for c in unpinned if c.step not in rungs), None)


def apply_retention(state: State, rules: Rules, actions: list[Action]) -> State:
    doomed = retention_deletions(state, rules)
    for c in doomed:
        actions.append(Delete(c.step, c.name, f"retention: keep_last={rules.keep_last}"))
    return without_checkpoints(state, {c.step for c in doomed}) if doomed else state


def mirror_deletions(mirrored: Iterable[int], pointed: int, keep_last: int) -> list[int]:
    """Mirrored steps to remove, oldest first: all but the newest keep_last and `pointed`,
    the one latest.json names (after a rollback it may be older than the rest)."""
    steps = sorted(set(mirrored))
    keep = set(steps[-keep_last:]) | {pointed}
    return [s for s in steps if s not in keep]


def abandon_changed(
    state: State, step: int, name: str, reason: str, actions: list[Action]
) -> State:
    known = next((c for c in state.checkpoints if c.name == name), None)
    actions.append(
        Record(
            {
                "kind": "checkpoint_changed",
                "step": step,
                "name": name,
                "reason": reason,
                "was_verified": known is not None,
            },
        )
    )
    actions.append(
        Quarantine(step, name, f"content changed since commit: {reason}", retract_mirror=False)
    )
    if known is None:
        return state
    return replace(state, checkpoints=tuple(c for c in state.checkpoints if c.name != name))


def on_mirror_copied(state: State, ev: MirrorCopied, rules: Rules, actions: list[Action]) -> State:
    if ev.superseded_by is not None:
        superseded: MirrorSuperseded = {
            "kind": "mirror_superseded",
            "step": ev.step,
            "seconds": ev.seconds,
            "superseded_by": ev.superseded_by,
        }
        actions.append(Record(superseded))
        return state
    if ev.changed or not ev.ok:
        failed: MirrorFailed = {
            "kind": "mirror_failed",
            "step": ev.step,
            "seconds": ev.seconds,
            "error": ev.error,
        }
        actions.append(Record(failed))
        if not ev.changed:
            return state
        name = ev.name or next((c.name for c in state.checkpoints if c.step == ev.step), "")
        return abandon_changed(state, ev.step, name, ev.error, actions)
    # A successful copy moved latest.json to its own step.
    doomed = mirror_deletions(ev.mirrored, ev.step, rules.mirror_keep_last)
    mirrored: Mirrored = {
        "kind": "mirrored",
        "step": ev.step,
        "seconds": ev.seconds,
        "files": ev.files,
        "bytes": ev.bytes,
        "removed": doomed,
    }
    actions.append(Record(mirrored))
    if doomed:
        actions.append(PruneMirror(tuple(doomed)))
    return state
