"""The run's journal: `.trainwarden/journal.jsonl`, one JSON object per line, append-only.

Each record is written with a single write(2) on an O_APPEND descriptor, so it survives
the daemon being SIGKILLed the moment after (the kernel has it); `sync=True` also
fsyncs, for records a power cut must not lose (pivot stages).

On a full disk the records are held in memory (up to HOLD_BYTES, the oldest dropped past
it) and written when space returns, after a `disk_full` record and before a
`disk_recovered` one that counts any lost (see store.appendfile).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from trainwarden.supervisor.store.appendfile import AppendFile, DiskSpace
from trainwarden.supervisor.store.repeats import RepeatFold

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import JournalEntry

RECENT = 1000
HOLD_BYTES = 16 << 20
"""Journal records held in memory while the disk is full, at most (bytes)."""


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


def _fields_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A record's own fields: the entry less its kind (the journal writes the kind itself)."""
    return {key: value for key, value in entry.items() if key != "kind"}


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
    def __init__(self, path: Path, space: DiskSpace | None = None) -> None:
        self.path = path
        self.space = space if space is not None else DiskSpace()
        self.file = AppendFile(path, 0o600, HOLD_BYTES, chmod=True)
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.listeners: list[Any] = []
        self.fold: RepeatFold | None = None
        """Set by the daemon: a fast crash loop's cycles counted, not written (repeats)."""
        self._note_space(time.time())

    def fold_repeats(self, quiet: Callable[[], bool]) -> None:
        """Count a fast crash loop's cycles instead of writing them (see store.repeats);
        `quiet()`: the start that just crashed logged no step line."""
        self.fold = RepeatFold(quiet, lambda kind, fields, t: self._write(kind, fields, t))

    def append(
        self, entry: JournalEntry, *, t: float | None = None, sync: bool = False
    ) -> dict[str, Any]:
        """Write one record (`entry`: its kind and fields, typed by core.records) stamped
        with `ts` and `t`; `sync`: fsync it before returning."""
        now = time.time() if t is None else t
        kind = entry["kind"]
        fields = _fields_of(entry)
        self.retry(now)
        if self.fold is not None and self.fold.takes(kind, fields, now, sync):
            return {"ts": utc_now(now), "t": round(now, 6), "kind": kind, **fields}
        record = self._write(kind, fields, now)
        if sync and not self.file.full:
            self.file.fsync()
        self._note_space(now)
        return record

    def tail(self, n: int) -> list[dict[str, Any]]:
        """The newest n records, those held in memory on a full disk included."""
        return self.with_held(tail_records(self.path, n), n)

    def with_held(self, written: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
        """The newest n of `written` (read from the file) and the records held in memory."""
        records = list(written)
        if self.file.full:
            # Held lines are the newest; a held line's written start is a torn line, skipped.
            held = min(self.file.held_lines, len(self.recent))
            records += list(self.recent)[len(self.recent) - held :]
        return records[-n:] if n else []

    def retry(self, t: float | None = None) -> bool:
        """Write the records held since the disk filled; True once none is held."""
        if not self.file.full:
            return True
        now = time.time() if t is None else t
        if not self.file.flush():
            return False
        self._note_space(now)
        return True

    def _write(
        self, kind: str, fields: Mapping[str, Any] | None, now: float, keep: bool = False
    ) -> dict[str, Any]:
        record = {"ts": utc_now(now), "t": round(now, 6), "kind": kind, **_json_safe(fields or {})}
        self.file.write(orjson.dumps(record) + b"\n", keep=keep)
        self.recent.append(record)
        for listener in self.listeners:
            listener(record)
        return record

    def _note_space(self, now: float) -> None:
        """Journal (and log) the file's change between full and written again."""
        change = self.space.change(
            self.path, self.file.error, "holding its records in memory", "record",
            self.file.take_lost, now,
        )  # fmt: skip
        if change is not None:
            kind = change["kind"]
            fields = _fields_of(change)
            self._write(kind, fields, now, keep=kind == "disk_full")  # never dropped past the bound

    def close(self) -> None:
        if self.fold is not None:
            self.fold.end(time.time())
        self.file.close()
