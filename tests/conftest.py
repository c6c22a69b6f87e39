"""Options, markers and tiers for the whole suite (registered here so they work from the root).

- `slow`: long soaks, skipped unless `--run-slow`.
- `loaded`: the test's point is behaviour under CPU contention: it runs beside one busy
  loop per core (tests/support/load.py), and under pytest-xdist in the group `loaded`, so
  no two of them spin at once.
- `xdist_group(name)`: tests that share an exclusive resource run one after another. A
  test without one is grouped by its file (module fixtures are then set up once).

See docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.load import busy_loops
from tests.support.mounts import mounts  # noqa: F401 (a fixture for every test folder)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run the slow tier (the long chaos soaks; see docs/testing.md)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: long-running tests (skipped unless --run-slow; see docs/testing.md)"
    )
    config.addinivalue_line(
        "markers", "loaded: runs beside one busy loop per core (its point is behaviour under load)"
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = config.getoption("--run-slow")
    skip = pytest.mark.skip(reason="slow tier: run with --run-slow (see docs/testing.md)")
    for item in items:
        if item.get_closest_marker("slow") and not run_slow:
            item.add_marker(skip)
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))


TESTS = Path(__file__).resolve().parent


def xdist_group_of(item: pytest.Item) -> str:
    """The worker-sharing group of a test without an explicit one: `loaded` for the tests
    that spin busy loops (one at a time), the TUI's shared live run, else its file (so a
    module-scoped daemon is started once, by the one worker that runs the file)."""
    if item.get_closest_marker("loaded"):
        return "loaded"
    path = Path(str(item.path))
    if path.parent == TESTS / "tui" and "live" in getattr(item, "fixturenames", ()):
        return "tests/tui live"
    return str(path.relative_to(TESTS)) if path.is_relative_to(TESTS) else str(path)


@pytest.fixture(autouse=True)
def _load_for_loaded_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("loaded") is None:
        yield
        return
    with busy_loops():
        yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the empty start cgroups that daemons killed by the tests left behind (a
    daemon removes its own when it ends a start; a SIGKILLed one cannot). A cgroup still
    holding a process is busy and stays. Only once all tests are done: under pytest-xdist
    in the controller, never in a worker while others still start trainers."""
    import contextlib
    import os

    if hasattr(session.config, "workerinput"):
        return
    from trainwarden.supervisor.shell.cgroups import PREFIX, own_cgroup

    base, _ = own_cgroup()
    if base is None:
        return
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)
