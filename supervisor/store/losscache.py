"""A derived binary cache of `.loss.json`, so a start-up parses only the lines it lacks.

`.loss.json` stays the truth. The cache holds the resolved history (steps in order, the
newest segment's record for each) of a byte prefix of it, one numpy file per column, in
`RUN/.trainwarden/loss-cache/gen-N/`, named by `manifest.json`, which also records the
prefix's length and digests of its first and last few KB. A `.loss.json` that is shorter
than the prefix, or whose bytes there differ (truncated, rewritten, replaced), makes the
cache count for nothing; start-up then parses the whole file as it would without one.

The columns are mapped (np.load with mmap_mode), never read whole: their pages belong to
the page cache and are read in only where a query or a resume audit looks.

A new generation is written beside the old one and becomes current with the manifest's
atomic rename, so a crash mid-write leaves the previous cache (or none) in force.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

from trainwarden.supervisor.store.rundir import fsync_dir, write_atomic

COLUMNS = (("step", "<i8"), ("loss", "<f8"), ("dt", "<f8"), ("t", "<f8"), ("seg", "<i8"))
MANIFEST = "manifest.json"
PROBE_BYTES = 4096
"""How much of the prefix's start and end the manifest digests."""
FORMAT = 1


@dataclass(frozen=True, slots=True)
class Cached:
    prefix_bytes: int
    """The length of the `.loss.json` prefix the columns resolve."""
    columns: tuple[np.ndarray, ...]
    """step, loss, dt, t, seg: read-only maps, equal lengths."""
    stats: dict[str, int]
    """lines, garbage and superseded counted over the prefix."""


def _probe(f: Any, prefix_bytes: int) -> str:
    digest = xxhash.xxh3_64()
    f.seek(0)
    digest.update(f.read(min(PROBE_BYTES, prefix_bytes)))
    tail_at = max(prefix_bytes - PROBE_BYTES, 0)
    f.seek(tail_at)
    digest.update(f.read(prefix_bytes - tail_at))
    return digest.hexdigest()


def load(cache_dir: Path, history_path: Path) -> Cached | None:
    """The cache, when it still describes a prefix of `history_path`; else None."""
    try:
        manifest = orjson.loads((cache_dir / MANIFEST).read_bytes())
        if manifest.get("format") != FORMAT:
            return None
        prefix_bytes = int(manifest["prefix_bytes"])
        rows = int(manifest["rows"])
        with open(history_path, "rb") as f:
            if os.fstat(f.fileno()).st_size < prefix_bytes:
                return None  # truncated or replaced by a shorter file
            if _probe(f, prefix_bytes) != manifest["probe"]:
                return None
        gen = cache_dir / manifest["gen"]
        columns = tuple(np.load(gen / f"{name}.npy", mmap_mode="r") for name, _ in COLUMNS)
        if any(
            c.shape != (rows,) or c.dtype != np.dtype(d)
            for c, (_, d) in zip(columns, COLUMNS, strict=True)
        ):
            return None
        stats = {key: int(manifest[key]) for key in ("lines", "garbage", "superseded")}
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return None
    return Cached(prefix_bytes, columns, stats)


def save(
    cache_dir: Path,
    history_path: Path,
    prefix_bytes: int,
    parts: list[tuple[Any, ...]],
    stats: dict[str, int],
) -> None:
    """Write the columns (each the concatenation of `parts`) as the new generation."""
    builder = Builder(cache_dir)
    try:
        for part in parts:
            builder.append(part)
        builder.commit(history_path, prefix_bytes, stats)
    except BaseException:
        builder.abort()
        raise


COPY_BYTES = 1 << 20
HEADER_BYTES = 128
"""Each column's .npy header, padded to this length so that it can be written first with
no row count and again, in place, with the final one."""


def _header(dtype: np.dtype, rows: int) -> bytes:
    text = f"{{'descr': '{dtype.str}', 'fortran_order': False, 'shape': ({rows},), }}"
    body = text.encode("latin1")
    magic = b"\x93NUMPY\x01\x00" + struct.pack("<H", HEADER_BYTES - 10)
    return magic + body + b" " * (HEADER_BYTES - len(magic) - len(body) - 1) + b"\n"


class Builder:
    """A new generation written a block of rows at a time, steps increasing: what a load
    parses goes to disk as it goes, and only the block in hand is in memory.

    Rows may be taken back from the end (`take_tail`) to merge a block that replays steps
    already written. Nothing counts until `commit()` renames the manifest; `abort()`
    removes the half-written generation.
    """

    def __init__(self, cache_dir: Path) -> None:
        cache_dir.mkdir(mode=0o700, exist_ok=True)
        n = 1 + max(
            (int(p.name[4:]) for p in cache_dir.glob("gen-*") if p.name[4:].isdigit()),
            default=0,
        )
        self.cache_dir = cache_dir
        self.gen = cache_dir / f"gen-{n}"
        self.gen.mkdir(mode=0o700)
        self.rows = 0
        self.last_step: int | None = None
        self._dtypes = [np.dtype(d) for _, d in COLUMNS]
        # Open as long as the builder: commit() or abort() closes them.
        self._files = [open(self.gen / f"{name}.npy", "w+b") for name, _ in COLUMNS]  # noqa: SIM115
        for f, dtype in zip(self._files, self._dtypes, strict=True):
            f.write(_header(dtype, 0))

    def append(self, columns: tuple[Any, ...]) -> None:
        """Rows whose steps follow the last one written (numpy arrays, typed arrays or
        maps of an older generation's columns, copied file to file)."""
        n = len(columns[0])
        if not n:
            return
        for f, dtype, piece in zip(self._files, self._dtypes, columns, strict=True):
            if isinstance(piece, np.memmap) and piece.filename is not None:
                _copy_mapped(f, piece)
            else:
                f.write(np.ascontiguousarray(piece, dtype=dtype).tobytes())
        self.rows += n
        self.last_step = int(columns[0][n - 1])

    def index(self, step: int) -> int:
        """How many rows written have a step below `step`."""
        steps = self._files[0]
        steps.flush()
        if not self.rows:
            return 0
        view = np.memmap(steps, np.int64, "r", HEADER_BYTES, (self.rows,))
        i = int(np.searchsorted(view, step, side="left"))
        del view
        return i

    def take_tail(self, lo: int) -> tuple[np.ndarray, ...]:
        """Rows lo.. written so far, read back and removed from the generation."""
        tail = []
        for f, dtype in zip(self._files, self._dtypes, strict=True):
            f.flush()
            f.seek(HEADER_BYTES + lo * dtype.itemsize)
            tail.append(np.fromfile(f, dtype, self.rows - lo))
            f.truncate(HEADER_BYTES + lo * dtype.itemsize)
            f.seek(0, os.SEEK_END)
        self.rows = lo
        self.last_step = None if not lo else int(self._step_at(lo - 1))
        return tuple(tail)

    def _step_at(self, i: int) -> int:
        f = self._files[0]
        f.seek(HEADER_BYTES + 8 * i)
        (step,) = struct.unpack("<q", f.read(8))
        f.seek(0, os.SEEK_END)
        return int(step)

    def commit(self, history_path: Path, prefix_bytes: int, stats: dict[str, int]) -> Cached:
        """Make this generation the cache of the first `prefix_bytes` of `history_path`;
        returns it, mapped."""
        for f, dtype in zip(self._files, self._dtypes, strict=True):
            f.flush()
            os.pwrite(f.fileno(), _header(dtype, self.rows), 0)
            os.fsync(f.fileno())
            f.close()
        fsync_dir(self.gen)
        with open(history_path, "rb") as history:
            probe = _probe(history, prefix_bytes)
        manifest = {
            "format": FORMAT,
            "gen": self.gen.name,
            "prefix_bytes": prefix_bytes,
            "rows": self.rows,
            "probe": probe,
            **stats,
        }
        write_atomic(self.cache_dir / MANIFEST, orjson.dumps(manifest))
        # Older generations (and one a crash left half written) are unlinked now. One the
        # running history or a query's snapshot still maps stays readable through its
        # maps (an unlinked file lives on while mapped); its space returns when the last
        # map of it goes.
        for stale in self.cache_dir.glob("gen-*"):
            if stale.name != self.gen.name:
                shutil.rmtree(stale, ignore_errors=True)
        columns = tuple(np.load(self.gen / f"{name}.npy", mmap_mode="r") for name, _ in COLUMNS)
        return Cached(prefix_bytes, columns, dict(stats))

    def abort(self) -> None:
        for f in self._files:
            f.close()
        shutil.rmtree(self.gen, ignore_errors=True)


def _copy_mapped(out: Any, piece: np.memmap) -> None:
    # Copy the old generation's bytes file to file instead of through the map: touching
    # the map would count every page of a long run in the daemon's resident memory. In the
    # kernel where it can (copy_file_range), so no buffer of them passes through ours.
    start = _file_position(piece)
    left = piece.nbytes
    out.flush()
    with open(str(piece.filename), "rb") as src:
        try:
            while left:
                done = os.copy_file_range(src.fileno(), out.fileno(), min(COPY_BYTES, left), start)
                if not done:
                    raise OSError(f"{piece.filename}: shorter than its header says")
                start += done
                left -= done
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        finally:
            out.seek(0, os.SEEK_END)
        src.seek(start)
        while left:
            data = src.read(min(COPY_BYTES, left))
            if not data:
                raise OSError(f"{piece.filename}: shorter than its header says")
            out.write(data)
            left -= len(data)


def _file_position(piece: np.memmap) -> int:
    """Where a mapped column's (or a slice's) first byte lies in its file. A slice keeps
    its column's `offset`, so it comes from the map: numpy maps from the offset rounded
    down to the allocation granularity."""
    mapped = getattr(piece, "_mmap", None)
    if mapped is None:
        return int(piece.offset)
    map_start = piece.offset - piece.offset % mmap.ALLOCATIONGRANULARITY
    map_address = np.frombuffer(mapped, np.uint8).ctypes.data
    return int(map_start + piece.ctypes.data - map_address)
