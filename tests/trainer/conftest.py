from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.trainer.trainer_process import COMMON_ARGS, checkpoint, run_trainer, step_losses


@dataclass(frozen=True)
class StraightRun:
    """A run of all steps that was never interrupted: the reference for every resume."""

    run_dir: Path
    stdout: str
    stderr: str
    losses: dict[int, str]

    def copy_checkpoint(self, step: int, run_dir: Path, with_sidecar: bool = True) -> Path:
        """Copy step_N.bin (and its sidecar) into a fresh run directory; returns the copy."""
        target = run_dir / "checkpoints"
        target.mkdir(parents=True, exist_ok=True)
        source = checkpoint(self.run_dir, step)
        shutil.copy(source, target / source.name)
        if with_sidecar:
            shutil.copy(source.with_suffix(".json"), target / source.with_suffix(".json").name)
        return target / source.name


@pytest.fixture(scope="session")
def straight(tmp_path_factory: pytest.TempPathFactory) -> StraightRun:
    run_dir = tmp_path_factory.mktemp("straight")
    result = run_trainer(run_dir, *COMMON_ARGS)
    assert result.returncode == 0, result.stderr
    return StraightRun(run_dir, result.stdout, result.stderr, step_losses(result.stdout))
