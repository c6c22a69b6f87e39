"""A run's losses read back over its lineage, with no daemon: the training loss by step
and the held-out validation points, each stitched from the oldest ancestor to the run
(the parent's steps up to the branch step, then the branch's own), the newest segment's
value per step as `losshistory` and `evaldb` keep them. Read only: nothing is written,
not even the loss cache (a valid one is used when the run's daemon left it)."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from trainwarden.supervisor.config import CONFIG_NAME
from trainwarden.supervisor.core.shapes import HistoryOfResult, RelatedRun
from trainwarden.supervisor.store import evaldb
from trainwarden.supervisor.store.branch_history import inherited
from trainwarden.supervisor.store.branches import BranchFileInvalid, lineage, read_branch
from trainwarden.supervisor.store.evaldb import read_evals
from trainwarden.supervisor.store.losshistory import LossHistory
from trainwarden.supervisor.store.lossquery import HistoryView
from trainwarden.supervisor.store.rundir import RunFiles


@dataclass(frozen=True)
class Series:
    """Steps in increasing order and the loss at each (nan/inf kept as read)."""

    steps: np.ndarray
    losses: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class RunSeries:
    run: Path
    lineage: list[tuple[Path, int | None]]
    """The run and its reachable ancestors, oldest first, each with the last step taken
    from it (None for the run itself)."""
    train: Series
    val: Series

    def history_view(self) -> HistoryView:
        """The train series for `HistoryView.query` (decimated like the daemon's history)."""
        return HistoryView([(self.train.steps, self.train.losses)])


def _empty() -> Series:
    return Series(np.empty(0, np.int64), np.empty(0, np.float64))


def _window(steps: np.ndarray, after: int | None, through: int | None) -> slice:
    """The indices of after < step <= through in increasing `steps`."""
    i0 = 0 if after is None else int(np.searchsorted(steps, after, side="right"))
    i1 = len(steps) if through is None else int(np.searchsorted(steps, through, side="right"))
    return slice(i0, max(i0, i1))


def _stitch(pieces: list[tuple[np.ndarray, np.ndarray]]) -> Series:
    if not pieces:
        return _empty()
    return Series(
        np.concatenate([np.asarray(s, np.int64) for s, _ in pieces]),
        np.concatenate([np.asarray(v, np.float64) for _, v in pieces]),
    )


def spans(chain: list[tuple[Path, int | None]]) -> list[tuple[Path, int | None, int | None]]:
    """(run, after, through) for each run of a lineage that supplies steps: its steps
    after < step <= through (None: unbounded). A branch made at a step its parent took
    from its own parent cuts that older run's span too."""
    cuts: list[int | None] = []
    limit: int | None = None
    for _, through in reversed(chain):
        if through is not None:
            limit = through if limit is None else min(limit, through)
        cuts.insert(0, limit)
    out = []
    after: int | None = None
    for (path, _), through in zip(chain, cuts, strict=True):
        if after is None or through is None or through > after:
            out.append((path, after, through))
            after = through
    return out


def read_run_series(run_dir: Path | str) -> RunSeries:
    """The run's train and validation series over its lineage (see the module)."""
    chain = lineage(run_dir)
    files = RunFiles(chain[-1][0])
    own = LossHistory.load(files.loss_history, files.state_dir / "loss-cache")
    # The ancestors' steps as the daemon's `history` stitches them (store.branch_history).
    train = [*inherited(chain[-1][0], own.first_step).parts, *own.snapshot().parts]
    val: list[tuple[np.ndarray, np.ndarray]] = []
    for path, after, through in spans(chain):
        points = [
            p
            for p in read_evals(RunFiles(path).eval_history, through)
            if after is None or p.step > after
        ]
        if points:
            val.append(
                (
                    np.array([p.step for p in points], np.int64),
                    np.array([p.loss for p in points], np.float64),
                )
            )
    return RunSeries(chain[-1][0], chain, _stitch(train), _stitch(val))


class NotARun(ValueError):
    """A path asked about is no run directory."""


class OthersBusy(Exception):
    """Too many reads of other runs' histories already wait (the daemon's bound)."""


RUN_MARKS = (CONFIG_NAME, ".loss.json", "branch.json")
"""A folder holding one of these is a run (a branch may not have logged a step yet)."""
SIBLINGS_SCANNED = 10_000
"""Entries of the run's parent folder looked at, at most, for related runs."""
RELATED_MAX = 200


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in RUN_MARKS)


def resolve_run(run_dir: Path, name: str) -> Path:
    """The run `name` names: an absolute path, or one relative to the folder that holds
    `run_dir` (a sibling by its name). Raises NotARun."""
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = run_dir.resolve().parent / path
    try:
        path = path.resolve()
        found = is_run_dir(path)
    except OSError as exc:
        raise NotARun(f"{name}: {exc.strerror or exc}") from None
    if not found:
        raise NotARun(f"{name}: not a run directory (no {', '.join(RUN_MARKS)} in it)")
    return path


def resolve_for_peer(run_dir: Path, name: str, uid: int) -> Path:
    """resolve_run for a client of another user: only a run related to `run_dir` (see
    related_runs) whose loss history `uid` could read itself; NotARun otherwise, the same
    for a path that is no run at all, so the daemon tells nobody what is where."""
    refusal = NotARun(
        f"{name}: no run related to this one that uid {uid} may read (another user may ask"
        " only for this run's parent, branches and siblings, as their files allow)"
    )
    try:
        path = resolve_run(run_dir, name)
    except NotARun:
        raise refusal from None
    related = {Path(r["path"]) for r in related_runs(run_dir)}
    if path not in related or not readable_by(path / ".loss.json", uid):
        raise refusal
    return path


def readable_by(path: Path, uid: int) -> bool:
    """Whether `uid` (with its groups) may read `path`, each folder on the way searchable:
    the file modes as the kernel would judge them for that user (no ACLs)."""
    try:
        user = pwd.getpwuid(uid)
        groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    except KeyError:
        groups = set()

    def may(st: os.stat_result, bits: int) -> bool:
        if st.st_uid == uid:
            return bool(st.st_mode & (bits << 6))
        if st.st_gid in groups:
            return bool(st.st_mode & (bits << 3))
        return bool(st.st_mode & bits)

    try:
        folders = [*reversed(path.parents)]
        return all(may(os.stat(f), 1) for f in folders) and may(os.stat(path), 4)
    except OSError:
        return False


def decimated(
    series: RunSeries, start: int | None, end: int | None, points: int
) -> HistoryOfResult:
    """The run's train series decimated like the daemon's `history` (min/mean/max per
    bucket), its validation points in the range (at most `points`, spread evenly; a
    non-finite loss as None) and its lineage."""
    return {
        **series.history_view().query(start, end, points),
        "val": evaldb.series(
            series.val.steps.tolist(), series.val.losses.tolist(), start, end, points
        ),
        "run": str(series.run),
        "lineage": [[str(path), step] for path, step in series.lineage],
    }


def related_runs(run_dir: Path) -> list[RelatedRun]:
    """Runs worth overlaying on `run_dir`'s: its ancestors, then the run directories
    beside it (its branches among them), by name; at most RELATED_MAX."""
    me = run_dir.resolve()
    chain = lineage(me)
    found: list[RelatedRun] = []
    for i, (path, _) in enumerate(reversed(chain[:-1])):
        relation: Literal["parent", "ancestor"] = "parent" if i == 0 else "ancestor"
        found.append({"path": str(path), "relation": relation, "name": path.name})
    known = {Path(f["path"]) for f in found} | {me}
    try:
        with os.scandir(me.parent) as entries:
            names = sorted(e.name for _, e in zip(range(SIBLINGS_SCANNED), entries, strict=False))
    except OSError:
        names = []
    for name in names:
        if len(found) >= RELATED_MAX:
            break
        path = me.parent / name
        if path in known or not is_run_dir(path):
            continue
        try:
            info = read_branch(path)
        except BranchFileInvalid:
            info = None
        is_branch = info is not None and info.parent.resolve() == me
        found.append(
            {
                "path": str(path),
                "relation": "branch" if is_branch else "sibling",
                "name": path.name,
            }
        )
    return found
