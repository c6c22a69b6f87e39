"""The pivot's file work: reading what a pivot is checked against, the archive folder,
and the new policy.json. Blocking; the daemon runs these in a thread."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import orjson

from trainwarden.supervisor.contract import normalized_policy, validate_policy
from trainwarden.supervisor.core.policy import Archive, Pivot, PivotContext
from trainwarden.supervisor.store.rundir import RunFiles, fsync_dir, write_atomic


def archive_dir(run_dir: Path, relative: str) -> Path:
    """A pivot archive folder, refusing any name that would leave run_dir/archive."""
    if (run_dir / "archive").is_symlink():
        raise OSError(0, f"refusing archive path {relative!r}: {run_dir / 'archive'} is a link")
    base = run_dir.resolve() / "archive"
    target = (run_dir / relative).resolve()
    if target.parent != base or not target.name.startswith("pivot-"):
        raise OSError(0, f"refusing archive path {relative!r} outside {base}")
    return target


def new_policy_from(
    current: dict[str, Any], arms: list[str], caps: dict[str, Any], floors: dict[str, Any]
) -> tuple[dict[str, Any] | None, list[str]]:
    """The current policy with the given caps and floors applied, or the rules it breaks."""
    policy = normalized_policy(current or {}, arms)
    problems = []
    for table, key in ((caps, "cap"), (floors, "floor")):
        for arm, value in table.items():
            if arm not in policy["arms"]:
                problems.append(f"unknown arm {arm!r}: known arms are {', '.join(arms)}")
                continue
            policy["arms"][arm][key] = value
    problems += validate_policy(policy, arms)
    return (None if problems else policy), problems


def pivot_context(files: RunFiles, command: Pivot) -> PivotContext:
    """The arms the trainer has now, the policy in force, and the pivot's new policy."""
    bandit: Any = None
    current: Any = {}
    there = files.bandit_state.exists()
    with contextlib.suppress(OSError, orjson.JSONDecodeError):
        bandit = orjson.loads(files.bandit_state.read_bytes())
    read = isinstance(bandit, dict)
    with contextlib.suppress(OSError, orjson.JSONDecodeError):
        current = orjson.loads(files.policy.read_bytes())
    arms_table = bandit.get("arms") if isinstance(bandit, dict) else None
    arms = sorted(str(a) for a in arms_table) if isinstance(arms_table, dict) else []
    zombies = [str(z) for z in bandit.get("zombies") or []] if isinstance(bandit, dict) else []
    old = normalized_policy(current if isinstance(current, dict) else {}, arms)
    new, problems = new_policy_from(old, arms, command.caps, command.floors)
    return PivotContext(
        arms=tuple(arms),
        zombies=tuple(zombies),
        current_policy=old,
        new_policy=new,
        problems=tuple(problems),
        utc=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
        state_file="ok" if arms else "no_arms" if read else "unreadable" if there else "missing",
    )


def archive(files: RunFiles, run_dir: Path, action: Archive) -> str | None:
    """Move the old bandit state, samples and policy into the pivot's archive folder;
    the error, if it failed."""
    try:
        target = archive_dir(run_dir, action.directory)
        target.mkdir(parents=True, exist_ok=True)
        for source in (files.samples, files.bandit_state, files.policy):
            if source.exists():
                os.replace(source, target / source.name)
        if not (target / files.policy.name).exists():
            # The run had no policy.json: archive the defaults it ran under.
            write_atomic(
                target / files.policy.name,
                orjson.dumps(action.old_policy, option=orjson.OPT_INDENT_2),
            )
        write_atomic(
            target / "pivot.json",
            orjson.dumps(
                {
                    "step": action.step,
                    "old_policy": action.old_policy,
                    "new_policy": action.new_policy,
                },
                option=orjson.OPT_INDENT_2,
            ),
        )
        fsync_dir(run_dir)
        fsync_dir(target)
    except OSError as exc:
        return f"{exc.filename or ''}: {exc.strerror or exc}"
    return None


def write_policy(files: RunFiles, new_policy: dict[str, Any]) -> str | None:
    """Write policy.json atomically and read it back; the error, if it failed."""
    data = orjson.dumps(new_policy, option=orjson.OPT_INDENT_2) + b"\n"
    try:
        write_atomic(files.policy, data, mode=0o644)
        if files.policy.read_bytes() != data:
            return "policy.json reads back different from what was written"
    except OSError as exc:
        return f"policy.json: {exc.strerror or exc}"
    return None
