"""Options, markers and tiers for the whole suite (registered here so they work from the root).

- `slow`: long soaks, skipped unless `--run-slow`.
- `loaded`: the test's point is behaviour under CPU contention: it runs beside one busy
  loop per core (tests/support/load.py), and under pytest-xdist in the group `loaded`, so
  no two of them spin at once.
- `xdist_group(name)`: tests that share an exclusive resource run one after another. A
  test that uses a module- or package-scoped fixture is grouped by its module or package
  (the fixture is set up once); the others go to any worker, the longest files first.

See docs/testing.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.load import busy_loops
from tests.support.mounts import mounts  # noqa: F401 (a fixture for every test folder)

# The suite starts hundreds of daemons, CLI commands and trainers. With bytecode written
# once, each loads the package's compiled modules instead of compiling every one from
# source again (PYTHONDONTWRITEBYTECODE, set on some machines, would make each process do
# so, and pytest rewrite every test module in every worker).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# One torch thread per process (test workers, and the trainers and frameworks they start),
# unless the caller chose: several workers share the machine's cores, and torch's threads
# spin waiting for each other when there are more of them than cores. Beside a busy loop
# tests/trainer took 92 s so against 111 s (an in-process AdamW comparison 2 s against
# 24 s). The reference trainer sets its own (its preset's cpu_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")


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
            group = xdist_group_of(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    # The longest first, so that none is left to run alone at the end (a stable sort: the
    # tests of a file keep their order).
    items.sort(key=lambda item: -LONGEST.get(relative(item), 0))


TESTS = Path(__file__).resolve().parent

LONGEST = {
    "tui/test_demo.py": 90,
    "integrations/test_inplace.py": 40,
    "integrations/test_hf.py": 75,
    "chaos/test_chaos_soak.py": 60,
    "integrations/test_lightning.py": 40,
    "supervisor/test_long_history.py": 50,
    "test_packaging.py": 45,
    "supervisor/test_containment.py": 30,
    "integrations/test_loop.py": 30,
    "supervisor/test_daemon.py": 30,
    "trainer/test_skip_data.py": 25,
    "trainer/test_async_save.py": 25,
    "integrations/test_hf_eval_lines.py": 25,
    # The Slurm package is one group (one cluster for its tests) of about 35 s, most of it
    # waiting on Slurm: started early, it overlaps the work of the others.
    "slurm/test_slurm_daemon.py": 35,
    "slurm/test_slurm_fixture.py": 35,
    "slurm/test_slurm_requeue_job.py": 35,
    "slurm/test_slurm_script_job.py": 35,
}
"""Seconds the longest test of each slow file took beside a busy loop (docs/testing.md);
files not named here run after these, in collection order."""


def relative(item: pytest.Item) -> str:
    path = Path(str(item.path))
    return str(path.relative_to(TESTS)) if path.is_relative_to(TESTS) else str(path)


SHARED_SCOPES = ("module", "package")


def xdist_group_of(item: pytest.Item) -> str | None:
    """The worker-sharing group of a test without an explicit one: `loaded` for the tests
    that spin busy loops (one at a time); for a test that uses a module- or package-scoped
    fixture (a daemon, a venv, a reference run started once), its module or package, so
    one worker sets the fixture up once; else none (the test goes to any worker)."""
    if item.get_closest_marker("loaded"):
        return "loaded"
    info = getattr(item, "_fixtureinfo", None)
    definitions = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    scopes = {d.scope for defs in definitions.values() for d in defs}
    if "package" in scopes:
        return str(Path(relative(item)).parent) + " (package)"
    if "module" in scopes:
        return relative(item)
    return None


@pytest.fixture(autouse=True)
def _load_for_loaded_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("loaded") is None:
        yield
        return
    with busy_loops():
        yield


@pytest.fixture(autouse=True)
def _journals_match_their_records(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the end of a test with a tmp_path, every journal its daemons wrote there holds to
    supervisor/core/records.py (tests/support/records_check.py). Set up before the test's
    own fixtures, so torn down after them: its daemons have ended. (tmp_path is taken
    first, so it is set up before this and torn down after it.)"""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp_path = request.getfixturevalue("tmp_path")
    yield
    from tests.support.records_check import journals, problems

    found = [p for path in journals(tmp_path) for p in problems(path)]
    if found:
        pytest.fail("journal records unlike core/records.py:\n" + "\n".join(found[:10]))


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
