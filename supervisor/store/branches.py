"""`RUN/branch.json`: what a branch run was made from (`trainwarden branch`).

    {"parent": "/abs/path/of/SRC_RUN", "step": 1200, "checkpoint": "step_001200.bin",
     "digest": "9f2c…", "overrides": {"set": {"trainer.lr": "3e-4"},
     "caps": {"code": 0.2}, "floors": {}}, "created": 1717171717.5}

`digest` is the xxh3-128 hex the journal recorded at the checkpoint's commit.

Written once, atomically, when the branch is made; never changed after. A branch's own
`.loss.json` starts after `step`; readers that show a branch take the steps up to `step`
from the parent's history while the parent is reachable (`lineage`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from trainwarden.supervisor.store.rundir import write_atomic

MAX_DEPTH = 32
"""Parents followed at most (a branch of a branch of ...), so a loop of links ends."""


@dataclass(frozen=True)
class BranchInfo:
    parent: Path
    step: int
    checkpoint: str
    digest: str | None
    overrides: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "parent": str(self.parent),
            "step": self.step,
            "checkpoint": self.checkpoint,
            "digest": self.digest,
            "overrides": self.overrides,
            "created": self.created,
        }


class BranchFileInvalid(ValueError):
    """branch.json exists but does not say what a branch was made from."""


def read_branch(run_dir: Path | str) -> BranchInfo | None:
    """The run's branch record, or None when the run is no branch (no branch.json).
    Raises BranchFileInvalid with the reason for a file that is there but unreadable."""
    path = Path(run_dir) / "branch.json"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BranchFileInvalid(f"{path}: {exc.strerror or exc}") from exc
    try:
        record = orjson.loads(raw)
        parent = record["parent"]
        step = record["step"]
        checkpoint = record["checkpoint"]
        digest = record.get("digest")
        overrides = record.get("overrides") or {}
        created = float(record.get("created") or 0.0)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BranchFileInvalid(f"{path}: not a branch record ({exc})") from exc
    if not isinstance(parent, str) or not parent:
        raise BranchFileInvalid(f"{path}: 'parent' must be the parent run's path")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise BranchFileInvalid(f"{path}: 'step' must be a whole number >= 0")
    if not isinstance(checkpoint, str) or not isinstance(overrides, dict):
        raise BranchFileInvalid(f"{path}: 'checkpoint' or 'overrides' has the wrong type")
    if digest is not None and not isinstance(digest, str):
        raise BranchFileInvalid(f"{path}: 'digest' must be a string")
    return BranchInfo(
        Path(parent),
        step,
        checkpoint,
        digest,
        overrides,
        created if math.isfinite(created) else 0.0,
    )


def write_branch(run_dir: Path | str, info: BranchInfo) -> None:
    write_atomic(
        Path(run_dir) / "branch.json",
        orjson.dumps(info.to_json(), option=orjson.OPT_INDENT_2) + b"\n",
        0o644,
    )


def lineage(run_dir: Path | str) -> list[tuple[Path, int | None]]:
    """The run and its ancestors, oldest first, each with the last step taken from it
    (None for the run itself: all of its own steps). Stops at a parent that is not
    reachable or whose branch.json is unreadable; a loop of links ends at MAX_DEPTH."""
    chain: list[tuple[Path, int | None]] = [(Path(run_dir).resolve(), None)]
    seen = {chain[0][0]}
    current = chain[0][0]
    for _ in range(MAX_DEPTH):
        try:
            info = read_branch(current)
        except BranchFileInvalid:
            break
        if info is None:
            break
        parent = info.parent.resolve()
        if parent in seen or not parent.is_dir():
            break
        seen.add(parent)
        chain.insert(0, (parent, info.step))
        current = parent
    return chain
