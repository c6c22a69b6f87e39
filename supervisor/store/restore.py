"""`trainwarden restore [RUN_DIR] --from MIRROR`: rebuild a run directory from its mirror.

On a new machine (or after losing the run's disk): copy the checkpoint the mirror's
latest.json names into the run's checkpoint folder, checking every file's xxh3_128
against the pointer and the checkpoint against its format plugin, plus the mirror's copy
of trainwarden.toml and policy.json. Nothing lands under its final name before every
file has been copied and checked; the checkpoint's own commit file (the name the format
recognises) is moved in last. Refused: a daemon running on RUN_DIR, a missing or corrupt
pointer, a hash mismatch, a pointer older than the newest checkpoint RUN_DIR already has
(restoring it would roll the run back), and a mirror that serves another run than RUN_DIR's
(store.identity); a new RUN_DIR takes the mirror's run id.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

from trainwarden.supervisor.config import CONFIG_NAME
from trainwarden.supervisor.errors import CheckpointInvalid, TrainwardenError, UsageError
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.identity import adopt_run_id, read_owner, read_run_id
from trainwarden.supervisor.store.mirror_files import (
    CHECKPOINT_PART,
    RUN_PART,
    MirrorError,
    Pointer,
    copy_hashed,
    hash_file,
    read_pointer,
)
from trainwarden.supervisor.store.rundir import RunFiles, acquire_lock, fsync_dir, write_atomic


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def _checkpoint_settings(config_text: str, source: Path) -> tuple[str, str, dict[str, Any]]:
    """(checkpoint folder, format, options) from a trainwarden.toml's [checkpoints] table."""
    try:
        table = tomllib.loads(config_text).get("checkpoints", {})
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{source}: not valid TOML: {exc}") from None
    folder = table.get("dir", "checkpoints")
    fmt = table.get("format", "andrea-bin")
    options = table.get("options", {})
    if not isinstance(folder, str) or Path(folder).is_absolute() or ".." in Path(folder).parts:
        raise UsageError(
            f"{source}: 'checkpoints.dir' = {folder!r} is not a path inside the run directory"
        )
    if not isinstance(fmt, str) or not isinstance(options, dict):
        raise UsageError(f"{source}: [checkpoints] format/options are malformed")
    return folder, fmt, options


def _fetch(mirror: Path, pointer: Pointer, staging: Path) -> int:
    """Copy every file the pointer lists into staging, checking size and hash; total bytes."""
    total = 0
    for entry in pointer.files:
        source = mirror / pointer.dir / entry.name
        target = staging / entry.name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest, size = copy_hashed(source, target)
        except FileNotFoundError:
            raise TrainwardenError(
                f"{source}: missing from the mirror (latest.json lists it); nothing restored"
            ) from None
        except OSError as exc:
            raise TrainwardenError(
                f"{exc.filename or source}: {exc.strerror}; nothing restored"
            ) from None
        copy_digest, _ = hash_file(target)
        if digest != entry.xxh3_128 or copy_digest != digest or size != entry.bytes:
            raise TrainwardenError(
                f"{source}: hash mismatch: xxh3_128 {digest} ({size} bytes), latest.json says "
                f"{entry.xxh3_128} ({entry.bytes} bytes); the mirror copy is damaged, nothing restored"
            )
        total += size
    for folder in sorted({p for p, _, _ in os.walk(staging)}, key=len, reverse=True):
        fsync_dir(Path(folder))
    return total


def _install_run_file(name: str, staged: Path, run_dir: Path, notes: list[str]) -> None:
    """Put the mirror's copy of a run file in place unless the run already has one."""
    target = run_dir / name
    if not staged.is_file():
        return
    data = staged.read_bytes()
    if target.exists():
        if target.read_bytes() != data:
            notes.append(f"kept the existing {name} (the mirror's differs)")
        return
    write_atomic(target, data, mode=0o644)
    notes.append(f"{name} from the mirror")


def restore(run_dir: Path, mirror: Path, *, config_from: Path | None = None) -> str:
    """Recreate run_dir's newest checkpoint (and config) from a mirror; a one-line summary."""
    from trainwarden.supervisor import registry as plugins

    run_dir = run_dir.expanduser().resolve()
    mirror = mirror.expanduser().resolve()
    try:
        pointer = read_pointer(mirror)
    except MirrorError as exc:
        raise TrainwardenError(f"cannot restore: {exc}") from None
    if not (mirror / pointer.dir).is_dir():
        raise TrainwardenError(
            f"cannot restore: {mirror / pointer.dir} (named by latest.json) is missing"
        )
    owner = read_owner(mirror)
    own_id = read_run_id(run_dir)
    # A folder with a run of its own (its id, or at least its config) is that run's.
    if (
        owner is not None
        and own_id != owner.run_id
        and (own_id is not None or (run_dir / CONFIG_NAME).exists())
    ):
        raise UsageError(
            f"cannot restore: {mirror} is the mirror of {owner.describe()}, not of the run in"
            f" {run_dir}; restore from this run's own mirror, or into a new folder"
        )

    config_path = run_dir / CONFIG_NAME
    mirrored_config = mirror / pointer.dir / RUN_PART / CONFIG_NAME
    if config_from is not None:
        config_from = config_from.expanduser().resolve()
        if config_path.exists() and config_path.resolve() != config_from:
            raise UsageError(f"{config_path} exists; remove it or drop --config to keep it")
        config_source = config_from
    elif config_path.exists():
        config_source = config_path
    elif mirrored_config.is_file():
        config_source = mirrored_config
    else:
        raise UsageError(
            f"the mirror holds no {CONFIG_NAME} and {run_dir} has none; give one with --config FILE"
        )
    try:
        config_text = config_source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{config_source}: cannot read: {exc}") from None
    folder, format_name, options = _checkpoint_settings(config_text, config_source)
    if pointer.format and pointer.format != format_name:
        raise UsageError(
            f"the mirror holds {pointer.format} checkpoints but {config_source} says "
            f"format = {format_name!r}"
        )
    fmt = plugins.checkpoint_format(format_name, options)

    run_dir.mkdir(parents=True, exist_ok=True)
    files = RunFiles(run_dir)
    lock_fd = acquire_lock(files)
    staging = files.state_dir / f"restore-{pointer.step}"
    try:
        checkpoints = run_dir / folder
        committed, _ = CheckpointStore(checkpoints, fmt).scan()
        newest_name = committed[-1] if committed else None
        newest = fmt.step_of(checkpoints / newest_name) if newest_name else None
        if newest is not None and newest > pointer.step:
            raise TrainwardenError(
                f"{checkpoints} already holds step {newest} ({newest_name}), newer than the mirror's "
                f"step {pointer.step}; restoring would roll the run back, nothing restored"
            )
        if newest == pointer.step:
            raise TrainwardenError(
                f"{checkpoints} already holds step {newest} ({newest_name}); nothing restored"
            )
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        total = _fetch(mirror, pointer, staging)
        staged = staging / CHECKPOINT_PART
        members = sorted(p.name for p in staged.iterdir()) if staged.is_dir() else []
        main = pointer.name or next((m for m in members if fmt.step_of(staged / m) is not None), "")
        if main not in members:
            raise TrainwardenError(
                f"cannot restore: the mirror's step {pointer.step} lacks {main or 'its checkpoint'}"
            )
        try:
            info = fmt.verify(staged / main)
        except CheckpointInvalid as exc:
            raise TrainwardenError(
                f"the mirrored checkpoint fails verification: {exc}; nothing restored"
            ) from None
        if info.step != pointer.step:
            raise TrainwardenError(
                f"the mirrored checkpoint is step {info.step}, latest.json says {pointer.step}; nothing restored"
            )
        checkpoints.mkdir(parents=True, exist_ok=True)
        clashes = [m for m in members if (checkpoints / m).exists()]
        if clashes:
            raise TrainwardenError(
                f"{checkpoints / clashes[0]} is in the way (an unfinished write?); move it away and retry"
            )
        # Companions first, the name that commits the checkpoint last.
        for member in [m for m in members if m != main] + [main]:
            os.replace(staged / member, checkpoints / member)
        fsync_dir(checkpoints)
        notes: list[str] = []
        if config_source != config_path:
            write_atomic(config_path, config_text.encode(), mode=0o644)
            notes.append(
                f"{CONFIG_NAME} from {'the mirror' if config_source == mirrored_config else config_source}"
            )
        _install_run_file("policy.json", staging / RUN_PART / "policy.json", run_dir, notes)
        if owner is not None and own_id is None:
            adopt_run_id(run_dir, owner.run_id)  # the same run, on a new disk
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(lock_fd)
    extra = f"; {', '.join(notes)}" if notes else ""
    return (
        f"restored step {pointer.step} ({len(pointer.files)} files, {_size(total)}) from {mirror} "
        f"into {checkpoints}{extra}; start it with `trainwarden daemon {run_dir}`"
    )
