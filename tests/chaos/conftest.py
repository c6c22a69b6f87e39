"""Shared reference runs for the chaos soaks (the slow tier's `--run-slow` and the `loaded`
marker live in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.chaos.harness import StraightRun


@pytest.fixture(scope="session")
def straight_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[int, int, int], StraightRun]]:
    """The uninterrupted reference run for (steps, save_every, seed), started once per
    session in the background (the tiny trainer uses one core; the soak the other)."""
    runs: dict[tuple[int, int, int], StraightRun] = {}

    def get(steps: int, save_every: int, seed: int) -> StraightRun:
        key = (steps, save_every, seed)
        if key not in runs:
            runs[key] = StraightRun(
                tmp_path_factory.mktemp(f"straight-{steps}"), steps, save_every, seed
            )
        return runs[key]

    yield get
    for run in runs.values():
        run.kill()
