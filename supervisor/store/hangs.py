"""Stack dumps of a hung (or asked-about) trainer: RUN/.trainwarden/hangs/<UTC>-step<N>.txt,
each written atomically and bounded in size; the folder keeps the newest KEEP_DUMPS, at most
MAX_TOTAL_BYTES in all."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from trainwarden.supervisor.store.rundir import RunFiles, write_atomic

MAX_DUMP_BYTES = 4 * 1024 * 1024
"""A dump file is cut here (a tree of many workers with many threads each)."""
KEEP_DUMPS = 20
"""Dumps kept: the newest; older ones are deleted as new ones are written."""
MAX_TOTAL_BYTES = 32 * 1024 * 1024
"""The dumps kept together stay below this (the newest always stays)."""


def hangs_dir(files: RunFiles) -> Path:
    return files.state_dir / "hangs"


def dump_path(files: RunFiles, utc: float, step: int | None) -> Path:
    """A new file's name: the time, then the trainer's last logged step ("stepnone":
    none yet); a second dump in the same second gets a suffix."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(utc))
    base = f"{stamp}-step{step if step is not None else 'none'}"
    folder = hangs_dir(files)
    path = folder / f"{base}.txt"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{base}-{n}.txt"
    return path


def write_dump(path: Path, text: str) -> None:
    """The dump, complete or not at all (cut at MAX_DUMP_BYTES, saying so)."""
    data = text.encode()
    if len(data) > MAX_DUMP_BYTES:
        note = b"\n[cut: the dump was larger than 4 MiB]\n"
        data = data[: MAX_DUMP_BYTES - len(note)] + note
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_atomic(path, data, mode=0o600)
    prune_dumps(path.parent, keep=path.name)


def prune_dumps(folder: Path, keep: str) -> list[str]:
    """Delete the oldest dumps beyond KEEP_DUMPS or MAX_TOTAL_BYTES, never `keep` (the
    newest); the names deleted. Only regular `.txt` files are counted or touched."""
    dumps = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.endswith(".txt"):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    dumps.append((entry.name == keep, st.st_mtime_ns, entry.name, st.st_size))
    dumps.sort(reverse=True)  # the one just written first, then newest first
    total = 0
    gone = []
    for rank, (_, _, name, size) in enumerate(dumps):
        total += size
        if rank and (rank >= KEEP_DUMPS or total > MAX_TOTAL_BYTES):
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()
                gone.append(name)
    return gone
