"""The run's journal: `.trainwarden/journal.jsonl`, one JSON object per line, append-only.

Each record is written with a single write(2) on an O_APPEND descriptor, so it survives
the daemon being SIGKILLed the moment after (the kernel has it); `sync=True` also
fsyncs, for records a power cut must not lose (pivot stages).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from trainwarden.supervisor.store.rundir import open_for_append

RECENT = 1000


def utc_now(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ"
    )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) and not -(1 << 63) <= value < 1 << 63:
        # A step number read from a file name can be any size; JSON here is 64-bit.
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every well-formed record; a torn last line (power cut mid-write) is skipped."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed by the with below; a missing file is empty)
    except FileNotFoundError:
        return
    with f:
        for line in f:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                yield record


def tail_records(path: Path, n: int) -> list[dict[str, Any]]:
    """The newest n records, reading from the end of the file."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            block = 65536
            data = b""
            pos = end
            while pos > 0 and data.count(b"\n") <= n:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except FileNotFoundError:
        return []
    records = []
    for line in data.splitlines()[-n:] if n else []:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records[-n:]


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = open_for_append(path, os.O_WRONLY, 0o600)
        os.fchmod(self.fd, 0o600)
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.listeners: list[Any] = []

    def append(
        self,
        kind: str,
        fields: dict[str, Any] | None = None,
        *,
        t: float | None = None,
        sync: bool = False,
    ) -> dict[str, Any]:
        now = time.time() if t is None else t
        record = {"ts": utc_now(now), "t": round(now, 6), "kind": kind, **_json_safe(fields or {})}
        os.write(self.fd, orjson.dumps(record) + b"\n")
        if sync:
            os.fsync(self.fd)
        self.recent.append(record)
        for listener in self.listeners:
            listener(record)
        return record

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
