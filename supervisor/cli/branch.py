"""`trainwarden branch SRC DEST`: a new run that trains on from one verified checkpoint of SRC.

DEST gets the checkpoint and its companions (reflinked where the file system can, else
copied; either way the copy's digest must equal the one recorded at the commit), SRC's
config with the `--set` overrides (validated by the config loader), `policy.json` (the
policy the checkpoint trained under, with the `--cap`/`--floor` changes, validated as a
pivot's) and `branch.json` (store.branches). DEST is built in a hidden sibling folder and
renamed into place last, so a refusal or a crash leaves nothing at DEST. SRC is only read:
its daemon, if any, goes on training undisturbed.

The branch's trainer resumes from the copied checkpoint (the newest, and only, one in its
folder) with the bandit it had there: a branch without overrides continues exactly as SRC
did, so any difference between the two comes from the overrides.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import time
import tomllib
from pathlib import Path
from typing import Any

import orjson

from trainwarden.libc import rename_noreplace
from trainwarden.supervisor.cli.branch_checkpoint import Chosen, choose_checkpoint, copy_checkpoint
from trainwarden.supervisor.cli.output import print_json
from trainwarden.supervisor.cli.start_checks import load_for_start
from trainwarden.supervisor.config import CONFIG_NAME, Config, load_config
from trainwarden.supervisor.config_toml import toml_key, toml_value, too_long
from trainwarden.supervisor.config_trainer import trainer_script_problem
from trainwarden.supervisor.contract import POLICY_FILE, normalized_policy, sidecar_path
from trainwarden.supervisor.errors import ConfigError, TrainwardenError, UsageError
from trainwarden.supervisor.shell.pivot_files import new_policy_from
from trainwarden.supervisor.store.branches import BranchInfo, write_branch
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.rundir import RunFiles, fsync_dir, write_atomic
from trainwarden.supervisor.store.snapshots import copy_durably

NOT_INHERITED = (("mirror", "path"), ("metrics", "listen"), ("checkpoints", "pinned"))
"""Settings a branch does not take over: the parent's mirror and metrics port are the
parent's (two runs writing one mirror would overwrite each other's latest.json), and its
pinned steps would pin the branch's own checkpoints of those steps for ever."""
FIXED_KEYS = ("checkpoints.format",)
"""Overrides refused: the copied checkpoint is in the parent's format."""


def cmd_branch(args: argparse.Namespace) -> int:
    from trainwarden.supervisor.cli.commands import _pairs

    caps = _pairs(args.cap, "--cap")
    floors = _pairs(args.floor, "--floor")
    sets = parse_sets(args.set or [])
    src = Path(args.src_run).expanduser().resolve()
    dest = Path(args.dest_run).expanduser().resolve()
    record, how, notes = make_branch(src, dest, args.step, caps, floors, sets)
    if args.json:
        print_json({**record.to_json(), "run": str(dest), "copied_by": how, "notes": notes})
        return 0
    print(
        f"branched {src} at step {record.step} ({record.checkpoint}, {how}) into {dest}"
        + (f"; policy.json: {_policy_text(caps, floors)}" if caps or floors else "")
    )
    for note in notes:
        print(f"note: {note}")
    print(f"start it with: trainwarden daemon --detach {dest}")
    return 0


def _policy_text(caps: dict[str, float], floors: dict[str, float]) -> str:
    words = [f"cap {arm}={v:g}" for arm, v in caps.items()]
    words += [f"floor {arm}={v:g}" for arm, v in floors.items()]
    return ", ".join(words)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`SECTION.KEY=VALUE` -> {"SECTION.KEY": value}; VALUE is read as a TOML value
    (`200`, `true`, `["a", "b"]`, `"text"`), and as plain text when it is none."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not section or not name or "." in name:
            raise UsageError(
                f"--set {item!r}: expected SECTION.KEY=VALUE, for example"
                " --set restart.stall_timeout_s=300"
            )
        if key in FIXED_KEYS:
            raise UsageError(f"--set {key}: a branch keeps its parent's checkpoint format")
        try:
            parsed = tomllib.loads(f"value = {text}")
        except tomllib.TOMLDecodeError:
            out[key] = text
            continue
        except ValueError as exc:  # an integer past Python's 4,300-digit conversion limit
            raise UsageError(f"--set {key}: {too_long(exc)}") from None
        if list(parsed) != ["value"]:
            raise UsageError(
                f"--set {key}: the value must be one TOML value, not more lines or tables"
                f" (it also sets {', '.join(k for k in parsed if k != 'value')}); give one"
                " --set per key"
            )
        out[key] = parsed["value"]
    return out


def make_branch(
    src: Path,
    dest: Path,
    step: int | None,
    caps: dict[str, float],
    floors: dict[str, float],
    sets: dict[str, Any],
) -> tuple[BranchInfo, str, list[str]]:
    """Create the branch run `dest`; (its branch record, "reflink" or "copy", notes)."""
    if not (src / CONFIG_NAME).is_file():
        raise UsageError(f"{src} is not a run: it has no {CONFIG_NAME}; name a run directory")
    if dest == src or src in dest.parents:
        raise UsageError(f"{dest} is inside {src}; a branch is a run directory of its own")
    if os.path.lexists(dest):
        raise UsageError(f"{dest} already exists; name a new directory for the branch")
    if not dest.parent.is_dir():
        raise UsageError(f"{dest.parent} does not exist; create it first")
    cfg = load_config(src, check_plugins=False)
    from trainwarden.supervisor import registry

    fmt = registry.checkpoint_format(cfg.checkpoints.format, dict(cfg.checkpoints.options))
    store = CheckpointStore(cfg.checkpoint_dir, fmt)
    chosen = choose_checkpoint(cfg, store, step)
    files, shared = trainer_files(cfg, src)
    staging = dest.parent / f".{dest.name}.branching"
    if os.path.lexists(staging):
        raise UsageError(f"{staging} is left from an interrupted branch; remove it and try again")
    try:
        staging.mkdir(mode=0o755)
    except OSError as exc:
        raise TrainwardenError(f"cannot create {staging}: {exc.strerror or exc}") from None
    try:
        for source in files:
            target = staging / source.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            copy_durably(source, target)
        notes = _write_config(cfg, src, dest, staging, sets, shared)
        if files:
            named = ", ".join(str(f.relative_to(src)) for f in files)
            notes.insert(0, f"copied the files the trainer's command names: {named}")
        for folder in shared:
            notes.append(
                f"the trainer's command names the folder {folder}: the branch uses its"
                " parent's (not copied)"
            )
        branch_cfg = _validated(staging, dest)
        how = copy_checkpoint(store, chosen, branch_cfg.checkpoint_dir)
        _write_policy(cfg, chosen, staging, caps, floors)
        info = BranchInfo(
            parent=src,
            step=chosen.step,
            checkpoint=chosen.name,
            digest=chosen.digest,
            overrides={"set": sets, "caps": caps, "floors": floors},
            created=time.time(),
        )
        write_branch(staging, info)
        fsync_dir(staging)
        _rename_noreplace(staging, dest)
        fsync_dir(dest.parent)
    except OSError as exc:  # a full disk, a read-only folder: nothing is left behind
        shutil.rmtree(staging, ignore_errors=True)
        where = f"{exc.filename}: " if exc.filename else ""
        raise TrainwardenError(
            f"cannot create the branch {dest}: {where}{exc.strerror or exc}"
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return info, how, notes


# ----------------------------------------------------------------------------- the trainer's files


def trainer_files(cfg: Config, src: Path) -> tuple[list[Path], list[Path]]:
    """The files and folders inside SRC that the trainer's command names (as items, or as
    the value of `--option=value`), resolved against its working directory: the files are
    copied into the branch, the folders (data, caches) shared. Refuses in one line when the
    script an interpreter is to run, or a program named by path, is not there."""
    root = Path(os.path.realpath(src))
    owned = {Path(os.path.realpath(p)) for p in (RunFiles(src).state_dir, cfg.checkpoint_dir)}
    written = {root / CONFIG_NAME, root / POLICY_FILE, root / "branch.json"}
    command = cfg.trainer.command
    problem = trainer_script_problem(command, cfg.trainer_cwd)
    if not problem and (command[0].startswith(("./", "../")) or "/" in command[0]):
        program = Path(command[0]).expanduser()
        program = program if program.is_absolute() else cfg.trainer_cwd / program
        if not os.path.lexists(program):
            problem = f"the program {command[0]} does not exist in {cfg.trainer_cwd}"
    if problem:
        raise UsageError(
            f"cannot branch {src}: its trainer's command {json.dumps(command)} names what is"
            f" not there ({problem}); put it back or fix [trainer] command, then branch again"
        )
    files: list[Path] = []
    shared: list[Path] = []
    for item in command:
        for text in _path_like(item):
            path = _resolved(text, cfg)
            if root not in path.parents or path in written:
                continue
            if any(path == o or o in path.parents for o in owned):
                continue
            if path.is_file() and path not in files:
                files.append(path)
            elif path.is_dir() and path not in shared:
                shared.append(path)
    return files, shared


def _sharing(item: str, cfg: Config, shared: list[Path]) -> str | None:
    """`item` naming one of the `shared` folders by its absolute path (None: it names none)."""
    prefix, sep, value = item.partition("=") if item.startswith("-") else ("", "", item)
    if not value:
        return None
    path = _resolved(value, cfg)
    return f"{prefix}{sep}{path}" if path in shared else None


def _resolved(text: str, cfg: Config) -> Path:
    """A path the trainer's command names, as the trainer (in its working folder) sees it."""
    path = Path(text).expanduser()
    return Path(os.path.realpath(path if path.is_absolute() else cfg.trainer_cwd / path))


def _path_like(item: str) -> list[str]:
    """What in one command item may name a path: the item, and an option's value."""
    texts = [item] if item and not item.startswith("-") else []
    if item.startswith("-") and "=" in item:
        texts.append(item.partition("=")[2])
    return [t for t in texts if t and "\0" not in t]


# ----------------------------------------------------------------------------- config and policy


def _write_config(
    cfg: Config, src: Path, dest: Path, staging: Path, sets: dict[str, Any], shared: list[Path]
) -> list[str]:
    """The branch's trainwarden.toml: SRC's with paths into SRC moved to DEST (but the
    folders the trainer's command names, `shared`, named by SRC's absolute path), its own
    name, no inherited mirror or metrics port, and the overrides; returns notes."""
    raw = tomllib.loads(cfg.path.read_text(encoding="utf-8"))
    command = raw.get("trainer", {}).get("command")
    raw = _moved(raw, src, dest)
    if shared and isinstance(command, list):
        raw["trainer"]["command"] = [
            _sharing(item, cfg, shared) or moved
            for item, moved in zip(command, raw["trainer"]["command"], strict=True)
        ]
    notes = []
    for table, key in NOT_INHERITED:
        section = raw.get(table, {})
        if section.pop(key, None) is not None and f"{table}.{key}" not in sets:
            notes.append(
                f"[{table}] {key} is not inherited (it is the parent's); set one with"
                f" --set {table}.{key}=..."
            )
        if not section:
            raw.pop(table, None)
    raw.setdefault("run", {})["name"] = dest.name
    for dotted, value in sets.items():
        table, _, key = dotted.partition(".")
        section = raw.setdefault(table, {})
        if not isinstance(section, dict):
            raise UsageError(f"--set {dotted}: [{table}] is not a table in {cfg.path}")
        section[key] = value
    header = f"# branched from {src} by `trainwarden branch`\n\n"
    write_atomic(staging / CONFIG_NAME, (header + render_toml(raw)).encode(), 0o644)
    return notes


def _validated(staging: Path, dest: Path) -> Config:
    """The branch's config as the loader reads it, its errors naming DEST (not the staging
    folder it is checked in)."""
    try:
        return load_for_start(staging)
    except ConfigError as exc:
        message = str(exc).replace(
            str(staging / CONFIG_NAME), f"the branch's {CONFIG_NAME} (the parent's, --set applied)"
        )
        raise ConfigError(message.replace(str(staging), str(dest))) from None


def _moved(value: Any, src: Path, dest: Path) -> Any:
    """`value` with every path into SRC (as given or resolved) pointing into DEST instead."""
    if isinstance(value, dict):
        return {k: _moved(v, src, dest) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, src, dest) for v in value]
    if isinstance(value, str):
        for root in {str(src), os.path.realpath(src)}:
            value = re.sub(re.escape(root) + r"(?=/|$|[^\w.-])", str(dest), value)
    return value


def _write_policy(
    cfg: Config, chosen: Chosen, staging: Path, caps: dict[str, float], floors: dict[str, float]
) -> None:
    """policy.json: the policy the checkpoint trained under (its sidecar's bandit, else
    SRC's policy.json) with the new caps and floors, checked as a pivot checks them."""
    bandit = _sidecar_bandit(chosen)
    current: Any = bandit.get("policy")
    if not isinstance(current, dict):
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            current = orjson.loads((cfg.run_dir / POLICY_FILE).read_bytes())
    arms_table = bandit.get("arms")
    if not isinstance(arms_table, dict):
        with contextlib.suppress(OSError, orjson.JSONDecodeError, AttributeError):
            arms_table = orjson.loads(RunFiles(cfg.run_dir).bandit_state.read_bytes())["arms"]
    arms = [str(a) for a in arms_table] if isinstance(arms_table, dict) else []
    if caps or floors:
        if not arms:
            raise UsageError(
                f"{cfg.run_dir} has no data arms to cap (no bandit state in the checkpoint's"
                " sidecar or .state.json); branch without --cap/--floor"
            )
        policy, problems = new_policy_from(
            current if isinstance(current, dict) else {}, arms, caps, floors
        )
        if policy is None:
            raise UsageError(f"--cap/--floor: {problems[0]}")
    elif isinstance(current, dict):
        policy = normalized_policy(current, arms) if arms else current
    else:
        return
    write_atomic(
        staging / POLICY_FILE, orjson.dumps(policy, option=orjson.OPT_INDENT_2) + b"\n", 0o644
    )


def _sidecar_bandit(chosen: Chosen) -> dict[str, Any]:
    side = sidecar_path(chosen.files[0])
    if side not in chosen.files:
        return {}
    try:
        bandit = json.loads(side.read_text(encoding="utf-8")).get("bandit")
    except (OSError, ValueError, AttributeError):
        return {}
    return bandit if isinstance(bandit, dict) else {}


def render_toml(raw: dict[str, Any]) -> str:
    """A config's tables as TOML: one [table] each, nested tables inline."""
    lines = []
    for table, values in raw.items():
        lines.append(f"[{toml_key(table)}]")
        lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def _rename_noreplace(source: Path, target: Path) -> None:
    """Rename `source` to `target` unless `target` exists (a branch made meanwhile)."""
    try:
        if rename_noreplace(source, target):
            return
    except FileExistsError:
        raise UsageError(f"{target} already exists; name a new directory for the branch") from None
    if os.path.lexists(target):
        raise UsageError(f"{target} already exists; name a new directory for the branch")
    os.rename(source, target)
