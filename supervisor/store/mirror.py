"""The mirror: a second, verified copy of every committed checkpoint on another disk.

After a checkpoint is committed and verified, the daemon hands its files to `Mirror.copy`.
Each file is copied under a temporary folder name, fsynced, dropped from the page cache
and read back; the copy counts only if the xxh3_128 of what was read from the source,
of the copy on disk and of the source read again afterwards all agree (a checkpoint that
changed while it was copied is refused). Then the folder is renamed into place, and only
then does `latest.json` move to it (written atomically, then read back). Which copies the
mirror keeps is the policy's decision (core.retention.mirror_deletions, after each copy);
`Mirror.prune` removes the ones it names, never the one latest.json names. A failure
leaves latest.json where it was; the local checkpoints are only ever read.

Layout of the mirror (one mirror serves one run):

    MIRROR/latest.json                  {"step", "dir", "name", "format", "files": [...], "t"}
    MIRROR/step-000001200/manifest.json what latest.json says while it points here
    MIRROR/step-000001200/checkpoint/   the checkpoint's files (folders for hf-trainer)
    MIRROR/step-000001200/run/          trainwarden.toml and policy.json as they were then

Copies run one at a time in a worker thread; a newer checkpoint arriving while one is
copied supersedes any older one still waiting. When the daemon quarantines a checkpoint
(a divergence rollback), `Mirror.retract` drops its copy and moves latest.json back to
the newest older copy, so the mirror never offers poisoned weights to `restore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trainwarden.supervisor.store.digest import Digest
from trainwarden.supervisor.store.mirror_files import (
    CHECKPOINT_PART,
    CHUNK_BYTES,
    LATEST,
    MANIFEST,
    RUN_PART,
    STEP_DIR,
    MirroredFile,
    MirrorError,
    Pointer,
    check_stop,
    copy_hashed,
    hash_file,
    read_pointer,
    step_dir_name,
    write_pointer,
)
from trainwarden.supervisor.store.rundir import fsync_dir

RUN_FILES = ("trainwarden.toml", "policy.json")
INCOMING_PREFIX = ".incoming-"


class ContentChanged(MirrorError):
    """The checkpoint's files no longer match the digest taken at its commit."""


@dataclass(frozen=True)
class MirrorResult:
    """The outcome of one `Mirror.copy` call (journaled by the daemon)."""

    step: int
    ok: bool
    error: str | None = None
    superseded_by: int | None = None
    files: tuple[MirroredFile, ...] = ()
    bytes: int = 0
    seconds: float = 0.0
    mirrored: tuple[int, ...] = field(default=())
    """Steps with a complete copy in the mirror once this one is in place, oldest first."""
    changed: bool = False
    """Refused: what was read does not match the checkpoint's digest at commit."""


# ----------------------------------------------------------------------------- checks


def _check_digest(copied: list[MirroredFile], digest: str) -> None:
    prefix = f"{CHECKPOINT_PART}/"
    files = [
        (f.name[len(prefix) :], f.bytes, f.xxh3_128) for f in copied if f.name.startswith(prefix)
    ]
    read = Digest.of_files(files).hex
    if read != digest:
        raise ContentChanged(
            f"the checkpoint reads as digest {read}, {digest} at its commit: "
            "it changed after it was committed; the mirror keeps its earlier copies"
        )


def _fsync_tree(root: Path) -> None:
    """fsync every folder under root, deepest first: the entries are durable only then."""
    folders = [Path(d) for d, _, _ in os.walk(root)]
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(folder)


def _files_of(source: Path, prefix: str) -> Iterator[tuple[Path, str]]:
    """(file, name relative to the step folder) for a file or every file under a folder."""
    if source.is_dir() and not source.is_symlink():
        for path in sorted(source.rglob("*")):
            if path.is_file() and not path.is_symlink():
                yield path, f"{prefix}/{source.name}/{path.relative_to(source).as_posix()}"
    else:
        yield source, f"{prefix}/{source.name}"


# ----------------------------------------------------------------------------- the mirror


class Mirror:
    """Copies committed checkpoints to `root`, one at a time, newest wins."""

    def __init__(
        self,
        root: Path,
        *,
        run_dir: Path,
        format_name: str = "",
        checkpoint_dir: str = "checkpoints",
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.root = root
        self.run_dir = run_dir
        self.format_name = format_name
        self.checkpoint_dir = checkpoint_dir
        self.chunk_bytes = chunk_bytes
        self._turn = asyncio.Lock()
        self._newest_waiting: int | None = None
        # A cancelled caller leaves its thread running: never let two copies overlap.
        self._copying = threading.Lock()
        self._stop = threading.Event()

    def close(self) -> None:
        """Interrupt a copy in progress (it fails, latest.json stays) and refuse new ones."""
        self._stop.set()

    def newest_step(self) -> int | None:
        """The step latest.json names, or None when there is no readable pointer."""
        try:
            return read_pointer(self.root).step
        except MirrorError:
            return None

    async def copy(
        self, step: int, files: Iterable[Path], name: str | None = None, digest: str = ""
    ) -> MirrorResult:
        """Mirror one checkpoint (files[0] is its main path unless `name` says otherwise).

        Waits for the copy in progress; returns a superseded result without copying when
        a newer checkpoint arrived meanwhile.
        """
        paths = list(files)
        if self._newest_waiting is None or step >= self._newest_waiting:
            self._newest_waiting = step
        async with self._turn:
            newest = self._newest_waiting
            if newest is not None and newest > step:
                return MirrorResult(step, ok=False, superseded_by=newest)
            self._newest_waiting = None
            return await asyncio.to_thread(self.copy_now, step, paths, name, digest)

    def copy_now(
        self, step: int, files: list[Path], name: str | None = None, digest: str = ""
    ) -> MirrorResult:
        """The blocking copy, verification and pointer update. With `digest` (the
        checkpoint's at commit, see store.digest), a copy that reads otherwise is refused
        before it is put in place: the mirror keeps what it had."""
        started = time.monotonic()
        with self._copying:
            staging: Path | None = None
            try:
                check_stop(self._stop)
                if not files:
                    raise MirrorError(f"step {step}: no files to mirror")
                self.root.mkdir(parents=True, exist_ok=True)
                self._remove_leftovers()
                staging = self.root / f"{INCOMING_PREFIX}{step_dir_name(step)}"
                staging.mkdir()
                copied = self._copy_all(files, staging)
                if digest:
                    _check_digest(copied, digest)
                pointer = Pointer(
                    step=step,
                    dir=step_dir_name(step),
                    name=name or files[0].name,
                    format=self.format_name,
                    checkpoint_dir=self.checkpoint_dir,
                    files=tuple(copied),
                    t=time.time(),
                )
                write_pointer(staging, pointer, MANIFEST)
                _fsync_tree(staging)
                self._put_in_place(staging, self.root / step_dir_name(step))
                staging = None
                write_pointer(self.root, pointer)
                mirrored = self.steps()
            except ContentChanged as exc:
                failed = self._failed(step, str(exc), started, staging)
                return dataclasses.replace(failed, changed=True)
            except MirrorError as exc:
                return self._failed(step, str(exc), started, staging)
            except FileNotFoundError as exc:
                where = exc.filename or "a file"
                return self._failed(step, f"{where}: vanished during the copy", started, staging)
            except OSError as exc:
                where = exc.filename or self.root
                return self._failed(step, f"{where}: {exc.strerror or exc}", started, staging)
            return MirrorResult(
                step,
                ok=True,
                files=tuple(copied),
                bytes=sum(f.bytes for f in copied),
                seconds=time.monotonic() - started,
                mirrored=tuple(mirrored),
            )

    async def retract(self, step: int) -> int | None:
        """Drop the mirror's copy of `step` (quarantined locally); returns the step latest.json
        names afterwards (None: no copy is left). Waits for the copy in progress."""
        async with self._turn:
            return await asyncio.to_thread(self.retract_now, step)

    def retract_now(self, step: int) -> int | None:
        with self._copying:
            current = self.newest_step()
            if current == step:
                # Back to the newest older copy whose manifest still reads; none: no pointer.
                current = None
                for candidate in reversed([s for s in self.steps() if s < step]):
                    manifest = self.root / step_dir_name(candidate) / MANIFEST
                    try:
                        write_pointer(self.root, read_pointer(self.root, manifest))
                    except (MirrorError, OSError):
                        continue
                    current = candidate
                    break
                if current is None:
                    with contextlib.suppress(FileNotFoundError):
                        (self.root / LATEST).unlink()
            folder = self.root / step_dir_name(step)
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                fsync_dir(self.root)
            return current

    def _failed(self, step: int, error: str, started: float, staging: Path | None) -> MirrorResult:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        return MirrorResult(step, ok=False, error=error, seconds=time.monotonic() - started)

    def _copy_all(self, files: list[Path], staging: Path) -> list[MirroredFile]:
        sources = [pair for path in files for pair in _files_of(path, CHECKPOINT_PART)]
        for run_file in RUN_FILES:
            path = self.run_dir / run_file
            if path.is_file():
                sources.append((path, f"{RUN_PART}/{run_file}"))
        copied = []
        for source, relative in sources:
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            copied.append(self._copy_verified(source, target, relative))
        return copied

    def _copy_verified(self, source: Path, target: Path, relative: str) -> MirroredFile:
        read_digest, size = copy_hashed(source, target, self.chunk_bytes, self._stop)
        copy_digest, copy_size = hash_file(target, self.chunk_bytes, self._stop)
        source_digest, source_size = hash_file(source, self.chunk_bytes, self._stop)
        if copy_digest != read_digest or copy_size != size:
            raise MirrorError(
                f"{relative}: the copy reads back as xxh3_128 {copy_digest}, "
                f"but {read_digest} was written (the mirror disk corrupts data?)"
            )
        if source_digest != read_digest or source_size != size:
            raise MirrorError(
                f"{relative}: hash mismatch: the source now hashes to {source_digest}, the copy "
                f"to {read_digest}: the checkpoint changed while it was copied"
            )
        return MirroredFile(relative, size, read_digest)

    def _put_in_place(self, staging: Path, final: Path) -> None:
        if final.exists():
            # The same step mirrored again (a re-save): swap the old copy out first.
            old = self.root / f"{INCOMING_PREFIX}old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(staging, final)
            fsync_dir(self.root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
            fsync_dir(self.root)

    def _remove_leftovers(self) -> None:
        """Temporary folders of copies a crash interrupted (never a complete step folder)."""
        for entry in os.scandir(self.root):
            if entry.name.startswith(INCOMING_PREFIX) and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)

    def steps(self) -> list[int]:
        """Steps with a complete copy in the mirror, oldest first."""
        found = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                match = STEP_DIR.match(entry.name)
                if match and entry.is_dir(follow_symlinks=False):
                    found.append(int(match.group(1)))
        return sorted(found)

    async def prune(self, steps: Iterable[int]) -> list[int]:
        """Remove these steps' copies (never the one latest.json names); the steps removed.
        Waits for the copy in progress."""
        doomed = list(steps)
        async with self._turn:
            return await asyncio.to_thread(self.prune_now, doomed)

    def prune_now(self, steps: list[int]) -> list[int]:
        with self._copying:
            # A decision made before a newer copy moved latest.json must not take its step.
            pointed = self.newest_step()
            present = set(self.steps())
            removed = []
            for step in steps:
                if step == pointed or step not in present:
                    continue
                shutil.rmtree(self.root / step_dir_name(step), ignore_errors=True)
                removed.append(step)
            if removed:
                fsync_dir(self.root)
            return removed
