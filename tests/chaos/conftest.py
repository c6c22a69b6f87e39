"""Shared reference runs for the chaos soaks (the slow tier's `--run-slow` and the `loaded`
marker live in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.chaos.harness import SoakPlan, StraightRun


@pytest.fixture(scope="session")
def straight_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[SoakPlan], StraightRun]]:
    """The uninterrupted run of a plan's trainer (its steps, save_every, seed), started once
    per session in the background (the trainer uses one core; the soak the other)."""
    runs: dict[tuple[str, int, int, int], StraightRun] = {}

    def get(plan: SoakPlan) -> StraightRun:
        key = (plan.trainer, plan.steps, plan.save_every, plan.train_seed)
        if key not in runs:
            runs[key] = StraightRun(
                tmp_path_factory.mktemp(f"straight-{plan.trainer}-{plan.steps}"), plan
            )
        return runs[key]

    yield get
    for run in runs.values():
        run.kill()
