"""The package's one Slurm (tests/support/slurm.py): started once for the package, so its
tests share one pytest-xdist worker (tests/conftest.py groups them); skipped where Slurm
cannot run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.support.slurm import SlurmCluster, SlurmUnavailable, slurm_cluster


@pytest.fixture(scope="package")
def slurm() -> Iterator[SlurmCluster]:
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(slurm_cluster())
        except SlurmUnavailable as e:
            pytest.skip(str(e))
        yield cluster
