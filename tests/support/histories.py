"""Run directories with histories written in their documented formats (lossdb's
.loss.json, evaldb's .eval.json, branches' branch.json), for tests of what reads them."""

from __future__ import annotations

from pathlib import Path

from trainwarden.supervisor.store.branches import BranchInfo, write_branch
from trainwarden.supervisor.store.evaldb import EvalWriter
from trainwarden.supervisor.store.lossdb import LossWriter


def make_run(
    path: Path,
    losses: dict[int, float],
    *,
    parent: Path | None = None,
    step: int = 0,
    evals: dict[int, float] | None = None,
    seg: int = 1,
) -> Path:
    """A run directory holding `losses` by step (and `evals`); with `parent`, a branch of
    it made at `step`."""
    path.mkdir(parents=True, exist_ok=True)
    with LossWriter(path / ".loss.json") as writer:
        writer.append_many([(s, v, 0.1, 1000.0 + s, seg) for s, v in sorted(losses.items())])
    if evals:
        evals_out = EvalWriter(path / ".eval.json")
        evals_out.append_many([(s, v, 1000.0 + s, seg, {}) for s, v in sorted(evals.items())])
        evals_out.close()
    if parent is not None:
        write_branch(path, BranchInfo(parent, step, f"step_{step:06d}.bin", "xxh3:00", {}))
    return path
