"""Options and shared reference runs for the chaos soak.

`--run-slow` enables the long soak (20,000 steps); without it the long variant is skipped.
Run it as `python -m pytest tests/chaos --run-slow` (the option lives in this conftest, so
name the directory: pytest registers it only when it starts from here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import StraightRun


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow", default=False):
        return
    skip = pytest.mark.skip(
        reason="long chaos soak (20,000 steps, about 18 min on 2 busy cores): run `python -m pytest tests/chaos "
        "--run-slow` to include it"
    )
    here = str(Path(__file__).parent)
    for item in items:
        if item.get_closest_marker("slow") and str(item.path).startswith(here):
            item.add_marker(skip)


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
