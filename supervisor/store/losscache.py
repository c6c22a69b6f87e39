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

import os
import shutil
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
    cache_dir.mkdir(mode=0o700, exist_ok=True)
    n = 1 + max(
        (int(p.name[4:]) for p in cache_dir.glob("gen-*") if p.name[4:].isdigit()), default=0
    )
    gen = cache_dir / f"gen-{n}"
    gen.mkdir(mode=0o700)
    rows = sum(len(part[0]) for part in parts)
    for i, (name, dtype) in enumerate(COLUMNS):
        _write_column(gen / f"{name}.npy", np.dtype(dtype), rows, [part[i] for part in parts])
    fsync_dir(gen)
    with open(history_path, "rb") as f:
        probe = _probe(f, prefix_bytes)
    manifest = {
        "format": FORMAT,
        "gen": gen.name,
        "prefix_bytes": prefix_bytes,
        "rows": rows,
        "probe": probe,
        **stats,
    }
    write_atomic(cache_dir / MANIFEST, orjson.dumps(manifest))
    # Older generations (and one a crash left half written) are no longer named; a reader
    # that still maps one keeps its pages until it lets go.
    for stale in cache_dir.glob("gen-*"):
        if stale.name != gen.name:
            shutil.rmtree(stale, ignore_errors=True)


COPY_BYTES = 16 << 20


def _write_column(path: Path, dtype: np.dtype, rows: int, pieces: list[Any]) -> None:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": dtype.str, "fortran_order": False, "shape": (rows,)}
        )
        for piece in pieces:
            if isinstance(piece, np.memmap) and piece.filename is not None:
                _copy_mapped(f, piece)
            else:
                f.write(np.ascontiguousarray(piece, dtype=dtype).tobytes())
        f.flush()
        os.fsync(f.fileno())


def _copy_mapped(out: Any, piece: np.memmap) -> None:
    # Copy the old generation's bytes file to file instead of through the map: touching
    # the map would count every page of a long run in the daemon's resident memory. A
    # mapped piece is always a prefix of its column (history rows are cut, never skipped),
    # so its bytes start right after the header.
    start = piece.offset
    left = piece.nbytes
    out.flush()
    with open(str(piece.filename), "rb") as src:
        src.seek(start)
        while left:
            data = src.read(min(COPY_BYTES, left))
            if not data:
                raise OSError(f"{piece.filename}: shorter than its header says")
            out.write(data)
            left -= len(data)
