"""Options for the whole suite (registered here so `pytest --run-slow` works from the root)."""

from __future__ import annotations

import pytest

from tests.support.mounts import mounts  # noqa: F401 (a fixture for every test folder)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run the long chaos soak (20,000 steps; about 18 minutes on 2 busy CPU cores)",
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the empty start cgroups that daemons killed by the tests left behind (a
    daemon removes its own when it ends a start; a SIGKILLed one cannot). A cgroup still
    holding a process is busy and stays."""
    import contextlib
    import os

    from trainwarden.supervisor.shell.cgroups import PREFIX, own_cgroup

    base, _ = own_cgroup()
    if base is None:
        return
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)
