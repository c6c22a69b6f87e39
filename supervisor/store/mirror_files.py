"""The mirror's files: its layout on disk (a folder per step, `latest.json` and each step's
`manifest.json` as a `Pointer`, read back checked), and the streamed, hashed copy of one
file that the mirror and `trainwarden restore` both make (see store.mirror for the whole).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import xxhash

from trainwarden.supervisor.errors import TrainwardenError
from trainwarden.supervisor.store.digest import DigestInterrupted
from trainwarden.supervisor.store.digest import hash_file as digest_file
from trainwarden.supervisor.store.rundir import write_atomic

LATEST = "latest.json"
MANIFEST = "manifest.json"
POINTER_VERSION = 1
CHECKPOINT_PART = "checkpoint"
RUN_PART = "run"
STEP_DIR = re.compile(r"^step-(\d{9,})$")
CHUNK_BYTES = 8 * 1024 * 1024


class MirrorError(TrainwardenError):
    """A mirror copy, its verification or the mirror's pointer failed."""


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


@dataclass(frozen=True)
class MirroredFile:
    """One file of a mirrored checkpoint, named relative to its step folder."""

    name: str
    bytes: int
    xxh3_128: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "xxh3_128": self.xxh3_128}


@dataclass(frozen=True)
class Pointer:
    """What latest.json says: the newest complete, verified copy in the mirror."""

    step: int
    dir: str
    name: str
    format: str
    checkpoint_dir: str
    files: tuple[MirroredFile, ...]
    t: float

    def to_json(self) -> dict[str, Any]:
        return {
            "version": POINTER_VERSION,
            "step": self.step,
            "dir": self.dir,
            "name": self.name,
            "format": self.format,
            "checkpoint_dir": self.checkpoint_dir,
            "files": [f.to_json() for f in self.files],
            "t": self.t,
        }


# ----------------------------------------------------------------------------- hashing


def check_stop(stop: threading.Event | None) -> None:
    """MirrorError once `stop` is set (the daemon is shutting down)."""
    if stop is not None and stop.is_set():
        raise MirrorError("interrupted: the daemon is shutting down")


def hash_file(
    path: Path, chunk_bytes: int = CHUNK_BYTES, stop: threading.Event | None = None
) -> tuple[str, int]:
    """(xxh3_128 hex digest, size) of a file, streamed (store.digest's, stopping as a copy does)."""
    try:
        return digest_file(path, stop, chunk_bytes)
    except DigestInterrupted:
        raise MirrorError("interrupted: the daemon is shutting down") from None


def copy_hashed(
    source: Path, target: Path, chunk_bytes: int = CHUNK_BYTES, stop: threading.Event | None = None
) -> tuple[str, int]:
    """Stream source into a new file target, fsync it; (xxh3_128 of what was read, size)."""
    digest = xxhash.xxh3_128()
    size = 0
    with open(source, "rb") as fin, open(target, "xb") as fout:
        while chunk := fin.read(chunk_bytes):
            check_stop(stop)
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
        # Drop the copy's pages so reading it back checks the disk, not the page cache.
        with contextlib.suppress(AttributeError, OSError):
            os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return digest.hexdigest(), size


# ----------------------------------------------------------------------------- pointer


def read_pointer(root: Path, path: Path | None = None) -> Pointer:
    """The mirror's latest.json (or a step's manifest), checked; MirrorError says what is wrong."""
    path = path or root / LATEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise MirrorError(
            f"{path}: missing; {root} is not a trainwarden mirror or holds no checkpoint yet"
        ) from None
    except OSError as exc:
        raise MirrorError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = orjson.loads(raw)
        files = tuple(
            MirroredFile(str(f["name"]), int(f["bytes"]), str(f["xxh3_128"])) for f in data["files"]
        )
        pointer = Pointer(
            step=int(data["step"]),
            dir=str(data["dir"]),
            name=str(data.get("name", "")),
            format=str(data.get("format", "")),
            checkpoint_dir=str(data.get("checkpoint_dir", "checkpoints")),
            files=files,
            t=float(data.get("t", 0.0)),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise MirrorError(
            f"{path}: corrupt (not the pointer a trainwarden mirror writes)"
        ) from None
    unsafe = [
        f.name
        for f in files
        if f.name.startswith("/") or ".." in f.name.split("/") or "\x00" in f.name
    ]
    if STEP_DIR.match(pointer.dir) is None or unsafe or not files:
        raise MirrorError(f"{path}: corrupt (bad folder or file names)")
    return pointer


def write_pointer(root: Path, pointer: Pointer, name: str = LATEST) -> None:
    """Replace latest.json (or a manifest) atomically, then read it back: a pointer that
    reads back different from what was written is a failure, not a success."""
    data = orjson.dumps(pointer.to_json(), option=orjson.OPT_INDENT_2) + b"\n"
    write_atomic(root / name, data, mode=0o644)
    if read_pointer(root, root / name) != pointer:
        raise MirrorError(f"{root / name}: reads back different from what was written")
