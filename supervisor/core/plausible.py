"""Which committed steps are believable: a checkpoint far beyond anything the trainer has
logged (a stray `step_99999999.bin`) must never become the newest one, or retention would
delete every real checkpoint after it and the next restart would resume from it."""

from __future__ import annotations

from dataclasses import replace

from trainwarden.supervisor.core.state import Rules, State

GAP_FACTOR = 10
"""Without a configured max_step_jump, a commit may lie this many of the largest gaps
between consecutive commits beyond the newest logged step."""


def newest_logged_step(state: State) -> int:
    """The furthest step the run is known to have reached: the live trainer's last step
    line, the checkpoint it resumed from, the newest verified checkpoint, or the loss
    history's end at start-up."""
    newest = state.newest.step if state.newest is not None else None
    candidates = (state.last_step, state.resume_step, state.history_step, newest)
    known = [s for s in candidates if s is not None]
    return max(known, default=0)


def step_jump_limit(state: State, rules: Rules) -> tuple[int, str] | None:
    """(the largest plausible jump, where it comes from), or None while nothing bounds it.

    Before a gap between two commits is known and without a planned total, a first commit
    can lie anywhere (the save interval is the trainer's choice): it is not judged.
    """
    if rules.max_step_jump is not None:
        return rules.max_step_jump, "configured"
    total = rules.total_steps
    if state.max_commit_gap:
        limit = GAP_FACTOR * state.max_commit_gap
        if total is not None and total < limit:
            return total, "the planned total_steps"
        return limit, f"{GAP_FACTOR} x the largest gap between commits, {state.max_commit_gap}"
    if total is not None:
        return total, "the planned total_steps"
    return None


def implausible_step(state: State, step: int, rules: Rules) -> str | None:
    """Why a commit at `step` is not believable (None: it is)."""
    bound = step_jump_limit(state, rules)
    if bound is None:
        return None
    limit, source = bound
    reference = newest_logged_step(state)
    if step - reference <= limit:
        return None
    return (
        f"step {step} is {step - reference} steps beyond the newest logged step {reference}:"
        f" more than max_step_jump = {limit} ({source})"
    )


def with_gap(state: State, step: int) -> int | None:
    """max_commit_gap once a verified commit at `step` follows the newest one."""
    newest = state.newest
    if newest is None or step <= newest.step:
        return state.max_commit_gap
    return max(state.max_commit_gap or 0, step - newest.step)


def largest_gap(steps: list[int]) -> int | None:
    """The largest gap between consecutive steps (None for fewer than two)."""
    ordered = sorted(set(steps))
    gaps = [b - a for a, b in zip(ordered, ordered[1:], strict=False)]
    return max(gaps, default=None)


def implausible_at_startup(
    steps: list[int], history_step: int | None, max_commit_gap: int | None, rules: Rules
) -> dict[int, str]:
    """Checkpoints found at start-up that are not believable, with the reason: each is
    judged, oldest first, against the loss history's last step (or the newest believable
    checkpoint below it) and the gaps between the believable ones, as a commit would be.
    A file planted while no daemon ran gets no pass for being there already."""
    state = State(history_step=history_step, max_commit_gap=max_commit_gap)
    believable: list[int] = []
    implausible: dict[int, str] = {}
    for step in sorted(set(steps)):
        reference = max([s for s in (history_step, *believable[-1:]) if s is not None], default=0)
        state = replace(state, resume_step=reference)
        reason = implausible_step(state, step, rules)
        if reason is not None:
            implausible[step] = reason
            continue
        if believable:
            gap = step - believable[-1]
            state = replace(state, max_commit_gap=max(state.max_commit_gap or 0, gap))
        believable.append(step)
    return implausible
