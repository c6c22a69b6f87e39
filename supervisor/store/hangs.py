"""Stack dumps of a hung (or asked-about) trainer: RUN/.trainwarden/hangs/<UTC>-step<N>.txt,
each written atomically and bounded in size."""

from __future__ import annotations

import time
from pathlib import Path

from trainwarden.supervisor.store.rundir import RunFiles, write_atomic

MAX_DUMP_BYTES = 4 * 1024 * 1024
"""A dump file is cut here (a tree of many workers with many threads each)."""


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
