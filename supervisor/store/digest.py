"""Content digests of committed checkpoints: xxh3-128 of every file, streamed.

A checkpoint's digest is taken once, when it is first verified, and checked again before
the checkpoint is resumed from or mirrored: a file changed, truncated or replaced after
its commit then reads differently and is never treated as good. The digest covers the
checkpoint's main path (a file, or every regular file under a folder) and its companions,
each named relative to the checkpoint directory, so the mirror's per-file hashes (the
same names under `checkpoint/`) give the same digest.

Reading is blocking: call these in a worker thread, never on the event loop.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

CHUNK_BYTES = 4 * 1024 * 1024

FileDigest = tuple[str, int, str]
"""(name relative to the checkpoint directory, bytes, xxh3_128 hex)."""
Signature = tuple[int, ...]
"""What a write or a replacement changes: inode, size, mtime and mode of every file."""


class DigestInterrupted(Exception):
    """The stop event was set while a digest was being read."""


@dataclass(frozen=True)
class Digest:
    """Every file of one checkpoint, by name, size and xxh3-128."""

    files: tuple[FileDigest, ...]

    @classmethod
    def of_files(cls, files: Iterable[FileDigest]) -> Digest:
        return cls(tuple(sorted(files)))

    @property
    def hex(self) -> str:
        """One xxh3-128 over the sorted (name, size, hash) list: the checkpoint's digest."""
        combined = xxhash.xxh3_128()
        for name, size, file_hex in self.files:
            combined.update(f"{name}\0{size}\0{file_hex}\n".encode(errors="surrogateescape"))
        return combined.hexdigest()

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _ in self.files)


def checkpoint_files(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """(file, name relative to the checkpoint directory) for each path: a file itself, a
    folder's regular files (links inside are not followed and not counted)."""
    for path in paths:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            for inner in sorted(path.rglob("*")):
                if stat.S_ISREG(os.lstat(inner).st_mode):
                    yield inner, f"{path.name}/{inner.relative_to(path).as_posix()}"
        else:
            yield path, path.name


def hash_file(
    path: Path, stop: threading.Event | None = None, chunk_bytes: int = CHUNK_BYTES
) -> tuple[str, int]:
    """(xxh3_128 hex, size) of one file, read `chunk_bytes` at a time into one buffer;
    DigestInterrupted once `stop` is set."""
    digest = xxhash.xxh3_128()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while count := f.readinto(buffer):
            if stop is not None and stop.is_set():
                raise DigestInterrupted(str(path))
            digest.update(view[:count])
            size += count
    return digest.hexdigest(), size


def digest_checkpoint(paths: Iterable[Path], stop: threading.Event | None = None) -> Digest:
    """The digest of a checkpoint's files (its main path first, then its companions).

    Raises OSError (FileNotFoundError when a file vanished) like any read.
    """
    files = []
    for path, name in checkpoint_files(paths):
        file_hex, size = hash_file(path, stop)
        files.append((name, size, file_hex))
    return Digest.of_files(files)


def signature_of(paths: Iterable[Path]) -> Signature:
    """The stat figures of a checkpoint's paths (the main path's come first: inode, size,
    st_mtime_ns, mode), and of every entry inside a folder. Cheap: no data is read."""
    figures: list[int] = []
    for path in paths:
        st = os.lstat(path)
        figures += [st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode]
        if stat.S_ISDIR(st.st_mode):
            for inner in sorted(path.rglob("*")):
                inner_st = os.lstat(inner)
                figures += [inner_st.st_ino, inner_st.st_size, inner_st.st_mtime_ns]
    return tuple(figures)
