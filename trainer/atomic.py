"""Durable file replacement: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    # The rename is not durable until the directory entry pointing at it is.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def json_bytes(document: Any) -> bytes:
    return (json.dumps(document, indent=1) + "\n").encode()


def write_json_atomically(path: Path, document: Any) -> None:
    write_bytes_atomically(path, json_bytes(document))
