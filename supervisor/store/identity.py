"""Whose run a run directory is, and whose run a mirror serves.

A run gets a random id the first time a daemon starts on it (`.trainwarden/run_id`). A
mirror records the run it serves in `MIRROR/owner.json` ({"run_id", "run_dir", "name"}),
written by the first daemon that mirrors into it: a second run configured with the same
`[mirror] path` would evict the first's copies and move its latest.json, so its daemon is
refused at start, and `restore` refuses to install one run's checkpoint into another.
A run directory restored from a mirror takes the mirror's run id (it is the same run).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import orjson

from trainwarden.supervisor.store.rundir import RunFiles, write_atomic

RUN_ID = "run_id"
OWNER = "owner.json"


@dataclass(frozen=True)
class Owner:
    run_id: str
    run_dir: str
    name: str

    def describe(self) -> str:
        return f"run {self.name!r} ({self.run_dir})"


def read_run_id(run_dir: Path) -> str | None:
    """The run's id, None if no daemon has given it one (or it cannot be read)."""
    try:
        text = (RunFiles(run_dir).state_dir / RUN_ID).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def ensure_run_id(run_dir: Path) -> str:
    """The run's id, made now (and kept) if it has none."""
    found = read_run_id(run_dir)
    if found is not None:
        return found
    state_dir = RunFiles(run_dir).state_dir
    state_dir.mkdir(mode=0o755, exist_ok=True)
    new = secrets.token_hex(16)
    write_atomic(state_dir / RUN_ID, f"{new}\n".encode(), 0o644)
    return new


def adopt_run_id(run_dir: Path, run_id: str) -> None:
    """Give a run directory (restored from a mirror) the id of the run it continues."""
    state_dir = RunFiles(run_dir).state_dir
    state_dir.mkdir(mode=0o755, exist_ok=True)
    write_atomic(state_dir / RUN_ID, f"{run_id}\n".encode(), 0o644)


def read_owner(mirror: Path) -> Owner | None:
    """The run the mirror serves; None when it records none (a new mirror, or one from
    before owners were recorded) or the record is unreadable."""
    try:
        data = orjson.loads((mirror / OWNER).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
        return None
    return Owner(data["run_id"], str(data.get("run_dir", "?")), str(data.get("name", "?")))


def claim(mirror: Path, run_id: str, run_dir: Path, name: str) -> Owner | None:
    """Record this run as the mirror's owner unless another run owns it: then that owner
    (nothing is written). A mirror that cannot be reached now is not refused: its copies
    fail and are journaled, as for any mirror failure."""
    owner = read_owner(mirror)
    if owner is not None:
        return owner if owner.run_id != run_id else None
    try:
        mirror.mkdir(parents=True, exist_ok=True)
        record = {"run_id": run_id, "run_dir": os.path.realpath(run_dir), "name": name}
        write_atomic(mirror / OWNER, orjson.dumps(record) + b"\n", 0o644)
    except OSError:
        return None
    return None
