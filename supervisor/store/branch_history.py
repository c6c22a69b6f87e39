"""The loss history a branch run inherits: each ancestor's steps up to the step the next run
of its lineage was branched at (store.branches), read only, for readers that show a branch
whole. A branch's own `.loss.json` starts after its branch step; nothing of a parent is
ever copied into it or written back.

Blocking (a parent's history is loaded from its file and cache): call it in the history
thread, never on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainwarden.supervisor.core.shapes import BranchAncestor
from trainwarden.supervisor.store.branches import BranchFileInvalid, lineage, read_branch
from trainwarden.supervisor.store.evaldb import EvalPoint, read_evals
from trainwarden.supervisor.store.losshistory import LossHistory
from trainwarden.supervisor.store.rundir import RunFiles

Part = tuple[np.ndarray, np.ndarray]
"""Steps (increasing) and their losses."""


@dataclass(frozen=True)
class Inherited:
    branch_step: int | None
    """The run's own branch step (None: the run is no branch)."""
    parts: list[Part] = field(default_factory=list)
    """The ancestors' steps and losses, oldest first, all below the run's own first step."""
    ancestors: list[BranchAncestor] = field(default_factory=list)
    """{"run", "through_step"} of each ancestor taken from, oldest first; a parent that is
    not reachable (and every one before it) is missing."""
    evals: list[EvalPoint] = field(default_factory=list)
    """The ancestors' held-out evaluations up to the same steps, in step order."""


AncestryKey = tuple[tuple[tuple[str, int | None], ...], int | None]


def ancestry_key(run_dir: Path, own_first_step: int | None) -> AncestryKey:
    """What `inherited` depends on: the lineage, and the run's own first step only where
    it lies at or below the branch step (above it, it cuts nothing from the parent)."""
    chain = tuple((str(path), step) for path, step in lineage(run_dir))
    branch_step = chain[-2][1] if len(chain) > 1 else None
    if own_first_step is None or branch_step is None or own_first_step > branch_step:
        return chain, None
    return chain, own_first_step


def inherited(run_dir: Path, own_first_step: int | None) -> Inherited:
    """The steps the run's ancestors contribute: from the nearest parent back, each one's
    steps up to its child's branch step and below the child's own first step, so the
    parts never overlap (a child that replayed steps before its branch step wins)."""
    try:
        info = read_branch(run_dir)
    except BranchFileInvalid:
        return Inherited(None)
    if info is None:
        return Inherited(None)
    parts: list[Part] = []
    ancestors: list[BranchAncestor] = []
    evals: list[EvalPoint] = []
    limit = None if own_first_step is None else own_first_step - 1
    for parent, through in reversed(lineage(run_dir)[:-1]):
        assert through is not None  # only the run itself has no branch step
        cut = through if limit is None else min(through, limit)
        files = RunFiles(parent)
        try:
            history = LossHistory.load(files.loss_history, files.state_dir / "loss-cache")
        except OSError:
            break  # unreadable: the parent and whatever came before it are out of reach
        taken = [
            (steps[:end], losses[:end])
            for steps, losses in history.snapshot().parts
            if (end := int(np.searchsorted(steps, cut, side="right")))
        ]
        parts = taken + parts
        evals = read_evals(files.eval_history, cut) + evals
        ancestors.insert(0, {"run": str(parent), "through_step": cut})
        first = history.first_step
        limit = cut if first is None else min(cut, first - 1)
    return Inherited(info.step, parts, ancestors, evals)
