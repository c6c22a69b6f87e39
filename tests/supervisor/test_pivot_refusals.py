"""Why a pivot is refused when the trainer has no data arms to pivot: asking again helps only
while its bandit state may still come (the pure policy)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.policy import of
from trainwarden.supervisor.core import policy as p
from trainwarden.supervisor.core.phases import Phase
from trainwarden.supervisor.core.requests import PivotContext


def context(state_file: str) -> PivotContext:
    return PivotContext((), (), {}, None, (), "20261205T000000Z", state_file=state_file)


def refusal(state_file: str, saved_since_start: bool) -> tuple[str, str]:
    state = replace(
        p.State(), phase=Phase.RUNNING, trainer_pid=42, progress_since_start=saved_since_start
    )
    ask = p.Operator(1.0, 7, p.Pivot(caps={"docs": 0.5}), pivot=context(state_file))
    _, actions = p.decide(state, ask, p.Rules())
    (reply,) = of(actions, p.Reply)
    assert not reply.ok
    return reply.code, reply.message


@pytest.mark.parametrize(
    ("state_file", "saved", "code"),
    [
        ("missing", False, "wrong_state"),  # a new start: its bandit state may yet come
        ("unreadable", True, "wrong_state"),  # being rewritten, or torn: it may read next time
        ("missing", True, "unsupported"),  # saved since it started, and wrote none
        ("no_arms", False, "unsupported"),  # it wrote one that names no arm
    ],
)
def test_a_pivot_without_arms_says_whether_asking_again_can_help(state_file, saved, code):
    got, message = refusal(state_file, saved)
    assert got == code, message
    if code == "unsupported":
        assert message.startswith("the trainer reports no data arms (")
        assert message.endswith(
            "pivot needs a trainer that mixes its data with a bandit (see docs/pivot.md)"
        )
    else:
        assert "try again shortly" in message
