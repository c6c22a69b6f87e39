"""Checkpoints a trainer fails on right after resuming from them.

A divergence within suspect_window_steps of resuming from checkpoint C, or a death before
any new step, says C may be bad (NaN weights, or the update before it poisoned them). The
first time C is only suspect and is tried again; the second time (fallback_after_failures)
it is quarantined and the next older verified checkpoint is used, up to max_fallbacks in a
row. Once a trainer gets past the window, its checkpoint is cleared and the count restarts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from trainwarden.supervisor.core import barrier
from trainwarden.supervisor.core.actions import Action, Quarantine, Record
from trainwarden.supervisor.core.state import (
    Ckpt,
    Rules,
    State,
    suspicion_of,
    with_suspicion,
    without_checkpoints,
)

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import HaltsInstead, ResumeForecast


def resumed_from(state: State) -> Ckpt | None:
    """The verified checkpoint the current trainer resumed from, while it is still kept."""
    if state.resume_step is None:
        return None
    return next((c for c in state.checkpoints if c.step == state.resume_step), None)


def suspect_of_divergence(state: State, step: int, rules: Rules) -> Ckpt | None:
    """The checkpoint a divergence at `step` throws suspicion on, if any."""
    resumed = resumed_from(state)
    if resumed is None or not resumed.step < step <= resumed.step + rules.suspect_window_steps:
        return None
    return resumed


def suspect(state: State, ckpt: Ckpt) -> tuple[State, int]:
    """Mark `ckpt` suspect once more: (the state, how many times it now is)."""
    count = suspicion_of(state, ckpt.step) + 1
    return with_suspicion(state, ckpt.step, count), count


def fall_back(
    state: State,
    ckpt: Ckpt,
    reason: str,
    rules: Rules,
    actions: list[Action],
    *,
    counted: bool = True,
    before: int | None = None,
    halts: bool = False,
) -> State:
    """Abandon `ckpt` for the next older verified checkpoint, and say so in the journal.

    Fallbacks for deaths alone are not `counted` toward max_fallbacks: crash_loop bounds them.
    The record names the step the restart resumes from only when nothing can change it (see
    barrier.resume_forecast; `before`: the divergence's step, whatever is pending from it on
    is poisoned), and says when the run `halts` instead of restarting.
    """
    actions.append(Quarantine(ckpt.step, ckpt.name, reason))
    state = with_suspicion(without_checkpoints(state, {ckpt.step}), ckpt.step, 0)
    if counted:
        state = replace(state, fallbacks=state.fallbacks + 1)
    restart: HaltsInstead | ResumeForecast = (
        {"halts": True} if halts else barrier.resume_forecast(state, before)
    )
    actions.append(
        Record(
            {
                "kind": "fallback",
                "abandoned": ckpt.step,
                "name": ckpt.name,
                "reason": reason,
                **restart,
                "fallbacks": state.fallbacks,
                "max_fallbacks": rules.max_fallbacks,
            },
        )
    )
    return state


def can_fall_back(state: State, rules: Rules) -> bool:
    return state.fallbacks < rules.max_fallbacks


def past_the_window(state: State, step: int, rules: Rules) -> State:
    """A step line at `step`: once it is beyond the window, the trainer's checkpoint is no
    longer suspect and the run's fallbacks are over."""
    if not (state.suspects or state.fallbacks):
        return state
    if step <= (state.resume_step or 0) + rules.suspect_window_steps:
        return state
    if state.resume_step is not None:
        state = with_suspicion(state, state.resume_step, 0)
    return replace(state, fallbacks=0)
