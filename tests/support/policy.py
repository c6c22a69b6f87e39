"""Driving the pure policy in tests: events in, the final state and every action out."""

from __future__ import annotations

from trainwarden.supervisor.core import policy as p


def decide_all(
    events: list[object], state: p.State | None, rules: p.Rules
) -> tuple[p.State, list[object]]:
    """Each event decided in turn from `state` (a fresh one when None)."""
    state = state or p.State()
    log: list[object] = []
    for event in events:
        state, actions = p.decide(state, event, rules)  # type: ignore[arg-type]
        log.extend(actions)
    return state, log


def of(actions: list[object], cls: type) -> list:
    """The actions of one type, in order."""
    return [a for a in actions if isinstance(a, cls)]
