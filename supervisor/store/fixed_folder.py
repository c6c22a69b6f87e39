"""Snapshots of a checkpoint FOLDER the trainer overwrites in place (`[checkpoints] fixed`
with `fixed_commit_file`): a script calling `model.save_pretrained("checkpoints/latest")`
or accelerate's `save_state` every K steps rewrites the same folder's files with plain
writes, so a kill mid-save leaves a mix: some files new, some old, one truncated.

What commits a version is the file the trainer writes last (`fixed_commit_file`,
`trainer_state.json` for hf-trainer): its close is the watcher's cue. `take` then refuses a
folder in which any file is newer than the commit file (a new version under way, or a torn
one left by a kill), copies every file (reflinked or streamed, each fsynced; the commit file
last) into the staging folder, refuses the copy if the folder changed while it was copied,
reads the step from the copied commit file, names the copy as the format names a committed
checkpoint of that step (hf-trainer: `checkpoint-600`), verifies it there and only then
renames the whole folder into the checkpoint directory.

`restore` copies a snapshot into the staging folder, fsyncs it, and swaps it in: one
renameat2(RENAME_EXCHANGE) where the file system has it (the fixed name always holds a whole
folder), else the old folder is renamed aside into staging and the new one onto the fixed
name. A daemon killed between those two renames finds the fixed name empty and the old
folder aside: `recover` (run before any other work on the staging folder) puts it back. So
a kill at any moment leaves the old folder or the new one at the fixed name, never a mix.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from trainwarden.libc import rename_exchange as exchange
from trainwarden.plugins.api import CheckpointFormat
from trainwarden.supervisor.errors import CheckpointInvalid
from trainwarden.supervisor.store.rundir import fsync_dir
from trainwarden.supervisor.store.snapshots import (
    INCOMING,
    FixedFile,
    Taken,
    copy_durably,
    empty_folder,
    snapshot_name,
    step_by_regex,
)

RESTORING = "restoring"
"""In the staging folder: the snapshot being copied back (after an exchange: the old folder)."""
ASIDE = "aside"
"""In the staging folder: the old fixed folder between the two renames of a swap."""
MAX_STEP_FILE_BYTES = 64 << 20

Layout = tuple[tuple[str, int, int, int], ...]
"""(relative name, inode, size, mtime_ns) of every file in a folder, sorted by name."""


def folder_name(fmt: CheckpointFormat, fixed: str, step: int) -> str:
    """The committed name of a snapshot of the fixed folder: the format's own name for a
    checkpoint of `step` (`name_for`, hf-trainer: checkpoint-600), else latest_000600."""
    name_for = getattr(fmt, "name_for", None)
    return str(name_for(step)) if name_for is not None else snapshot_name(fixed, step)


def step_by_key(path: Path, key: str) -> int:
    """The integer at the top-level `key` of the JSON file `path`."""
    try:
        if path.stat().st_size > MAX_STEP_FILE_BYTES:
            raise CheckpointInvalid(f"{path.name}: larger than 64 MiB")
        value = json.loads(path.read_bytes()).get(key)
    except (ValueError, UnicodeDecodeError, AttributeError):
        raise CheckpointInvalid(f"{path.name}: not a JSON object") from None
    except FileNotFoundError:
        raise CheckpointInvalid(f"{path.name}: missing") from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointInvalid(f"{path.name}: {key!r} is {value!r}, not a step")
    return value


def step_reader(commit_file: str, key: str | None, regex: str | None) -> Callable[[Path], int]:
    """The step of a copied folder: `key` of its JSON commit file, or `regex` in it."""
    if key is not None:
        return lambda folder: step_by_key(folder / commit_file, key)
    assert regex is not None  # the config's check: one of the two
    return lambda folder: step_by_regex(folder / commit_file, regex)


def layout(folder: Path) -> Layout:
    """Every file under `folder`; raises CheckpointInvalid for anything but files and
    folders (a link could make the copy read from outside the folder)."""
    entries = []
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                continue
            relative = str(path.relative_to(folder))
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointInvalid(f"{relative}: not a regular file")
            entries.append((relative, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(sorted(entries))


def copy_folder(src: Path, dst: Path, files: Layout, last: str) -> str:
    """Copy the files `files` of `src` into the new folder `dst`, each fsynced, `last` at
    the end (so it is the newest there too), every folder fsynced; "reflink" or "copy"."""
    dst.mkdir()
    hows = set()
    for relative, *_ in sorted(files, key=lambda entry: entry[0] == last):
        target = dst / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        hows.add(copy_durably(src / relative, target))
    for root, _dirs, _files in os.walk(dst, topdown=False):
        fsync_dir(Path(root))
    return "copy" if "copy" in hows else "reflink"


class FixedFolder(FixedFile):
    """The fixed folder of one checkpoint directory and its snapshots; every method blocks
    (call them in a worker thread) and only one may run at a time."""

    def __init__(
        self,
        directory: Path,
        fixed: str,
        fmt: CheckpointFormat,
        commit_file: str,
        read_step: Callable[[Path], int],
    ) -> None:
        super().__init__(directory, fixed, fmt, read_step)
        self.commit_file = commit_file
        self._restored_layout: Layout | None = None
        """The folder as the last restore left it: no new version while it stays so."""

    def recover(self) -> None:
        """Finish what a daemon killed in a swap left: the old folder renamed aside and
        nothing at the fixed name yet goes back."""
        aside = self.staging / ASIDE
        if os.path.lexists(aside) and not os.path.lexists(self.path):
            os.rename(aside, self.path)
            fsync_dir(self.dir)

    def take(self) -> Taken:
        """Snapshot the fixed folder as it is now, if it is one whole, verified version."""
        staging = self._staging()
        incoming = staging / INCOMING
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return Taken("absent")
        try:
            if not stat.S_ISDIR(st.st_mode):
                raise CheckpointInvalid("not a folder")
            before = layout(self.path)
            if before == self._restored_layout:
                return Taken("known")  # the snapshot put back, not a write of the trainer's
            newest_after_commit(before, self.commit_file)
            how = copy_folder(self.path, incoming, before, self.commit_file)
            if layout(self.path) != before:
                raise CheckpointInvalid("changed while it was copied (the trainer is saving again)")
            step = self.read_step(incoming)
            name = folder_name(self.fmt, self.fixed, step)
            if os.path.lexists(self.dir / name):
                return Taken("known", step, name)
            staged = staging / name
            os.rename(incoming, staged)
            if self.fmt.step_of(staged) != step:
                raise CheckpointInvalid(f"{self.fmt.name} does not take {name} for step {step}")
            info = self.fmt.verify(staged)
            os.rename(staged, self.dir / name)
        except CheckpointInvalid as exc:
            return Taken("rejected", reason=f"{self.fixed}/: {exc}")
        finally:
            empty_folder(staging)
        fsync_dir(self.dir)
        return Taken("taken", step, name, how, info.bytes)

    def stage_restore(self, name: str) -> tuple[Path, str]:
        """The first step of a restore: the snapshot `name` copied whole into staging
        (where it is, and "reflink" or "copy")."""
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"refusing snapshot name {name!r}")
        staging = self._staging()
        source = self.dir / name
        files = layout(source)
        restoring = staging / RESTORING
        how = copy_folder(source, restoring, files, self.commit_file)
        fsync_dir(staging)
        return restoring, how

    def swap_in(self, restoring: Path, *, exchange_names: bool = True) -> None:
        """The second step: `restoring` at the fixed name, the old folder (if any) in
        staging; the directories fsynced, since a rename is not durable until they are."""
        if exchange_names and os.path.lexists(self.path) and exchange(restoring, self.path):
            fsync_dir(self.dir)
            fsync_dir(self.staging)
            return
        if os.path.lexists(self.path):
            os.rename(self.path, self.staging / ASIDE)
            fsync_dir(self.staging)
            fsync_dir(self.dir)
        os.rename(restoring, self.path)
        fsync_dir(self.dir)
        fsync_dir(self.staging)

    def finish_restore(self) -> None:
        """The last step: the old folder removed from staging."""
        empty_folder(self.staging)

    def restore(self, name: str) -> str:
        """Put the snapshot `name` at the fixed name atomically; "reflink" or "copy"."""
        restoring, how = self.stage_restore(name)
        self.swap_in(restoring)
        self._restored_layout = layout(self.path)
        self.finish_restore()
        return how


def newest_after_commit(files: Layout, commit_file: str) -> None:
    """Raise CheckpointInvalid unless the commit file is there and no file is newer: a file
    written after it is a new version under way, or what a kill mid-save left."""
    commit = [entry for entry in files if entry[0] == commit_file]
    if not commit:
        raise CheckpointInvalid(f"no {commit_file} (not written yet, or a save torn before it)")
    committed_at = commit[0][3]
    later = [entry[0] for entry in files if entry[3] > committed_at]
    if later:
        raise CheckpointInvalid(
            f"{later[0]} was written after {commit_file}: a save under way or torn by a kill "
            f"(or {commit_file} is not the file the trainer writes last)"
        )
