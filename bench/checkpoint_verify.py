"""8. andrea-bin verification: the daemon's check of a committed checkpoint (header, size,
every weight and Adam moment finite, Adam v non-negative), its content digest (xxh3-128)
and both in turn (what the daemon does per commit), against a raw sequential read of the
same file, from the page cache and from the disk.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.common import Context, Section, Target

TITLE = "8. Checkpoint verification (andrea-bin)"
METHODS = ("verify", "digest", "verify + digest", "raw read")
ROUNDS = 3
FULL_BYTES = 1_500_000_000
QUICK_BYTES = 200_000_000
TARGET = 0.9


def write_checkpoint(directory: Path, total_bytes: int) -> Path:
    """A valid step_000100.bin of about `total_bytes`: plausible weights and m (either
    sign), v > 0, written from one repeated block, fsynced."""
    import numpy as np

    from trainwarden.plugins.formats.andrea_bin import CHUNK_BYTES
    from trainwarden.supervisor.contract import ANDREA_BIN_HEADER, checkpoint_name

    n_params = (total_bytes - ANDREA_BIN_HEADER.size) // 12
    rng = np.random.default_rng(0)
    block = CHUNK_BYTES // 4
    signed = rng.standard_normal(block).astype("<f4")
    positive = (1e-6 * np.abs(signed)).astype("<f4")
    path = directory / checkpoint_name(100)
    with open(path, "wb") as f:
        f.write(ANDREA_BIN_HEADER.pack(100, n_params))
        for values in (signed, signed, positive):  # weights, Adam m, Adam v
            left = n_params
            while left:
                count = min(left, block)
                f.write(values[:count].tobytes())
                left -= count
        f.flush()
        os.fsync(f.fileno())
    return path


def raw_read(path: Path) -> None:
    """The floor: the same bytes read front to back into one reusable buffer."""
    from trainwarden.plugins.formats.andrea_bin import CHUNK_BYTES

    buffer = bytearray(CHUNK_BYTES)
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while f.readinto(buffer):
            pass


def verify(path: Path) -> None:
    from trainwarden.plugins.formats.andrea_bin import AndreaBin

    AndreaBin().verify(path)


def digest(path: Path) -> None:
    from trainwarden.supervisor.store.digest import digest_checkpoint

    digest_checkpoint([path])


def verify_and_digest(path: Path) -> None:
    """Per commit, the daemon verifies the checkpoint, then records its digest."""
    verify(path)
    digest(path)


def evict(path: Path) -> None:
    """Drop this one file's pages from the page cache (it is clean: fsynced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timings(path: Path, cold: bool) -> dict[str, list[float]]:
    """Seconds per method, ROUNDS rounds, the methods taking turns within each round."""
    runs = {
        "verify": verify,
        "digest": digest,
        "verify + digest": verify_and_digest,
        "raw read": raw_read,
    }
    seconds: dict[str, list[float]] = {m: [] for m in METHODS}
    if not cold:
        raw_read(path)  # warm the cache once, so the first method does not pay for it
    for _ in range(ROUNDS):
        for method in METHODS:
            if cold:
                evict(path)
            t0 = time.perf_counter()
            runs[method](path)
            seconds[method].append(time.perf_counter() - t0)
    return seconds


def run(ctx: Context) -> Section:
    total = QUICK_BYTES if ctx.quick else FULL_BYTES
    directory = ctx.work.dir("verify")
    t0 = time.perf_counter()
    path = write_checkpoint(directory, total)
    write_s = time.perf_counter() - t0
    size = path.stat().st_size
    results: dict[str, Any] = {}
    for cache in ("page cache", "disk"):
        seconds = timings(path, cold=cache == "disk")
        rate = {m: size / min(seconds[m]) for m in METHODS}
        results[cache] = {
            "seconds": seconds,
            "mb_per_s": {m: rate[m] / 1e6 for m in METHODS},
            "ratio": rate["verify"] / rate["raw read"],
        }
    path.unlink()
    from trainwarden.plugins.formats.andrea_bin import CHUNK_BYTES
    from trainwarden.supervisor.store import digest as digest_module

    chunk_mib = CHUNK_BYTES / 2**20
    digest_mib = digest_module.CHUNK_BYTES / 2**20
    section = Section(
        key="verify",
        title=TITLE,
        intro=(
            f"One valid andrea-bin checkpoint of {size / 1e6:,.0f} MB (written in "
            f"{write_s:.1f} s with fsync). `verify` is the format plugin's `verify`, what the "
            "daemon runs in a worker thread for every commit: header, size, then every "
            f"weight, Adam m and Adam v streamed {chunk_mib:g} MiB at a time through numpy (min "
            "and max of each chunk, which carry any NaN). `digest` is the content digest the "
            "daemon records at commit and checks before a resume, a restore or a mirror copy "
            f"(`digest_checkpoint`: xxh3-128 streamed {digest_mib:g} MiB at a time); `verify + "
            "digest` is one "
            "after the other, the daemon's work per commit, so it reads the file twice. `raw "
            "read` reads the same file front to back into one buffer of the same size and looks "
            f"at nothing. The methods take turns, "
            f"{ROUNDS} rounds; the best round counts. 'page cache': the file is cached, as "
            "a checkpoint just written usually is; 'disk': its pages are dropped before "
            "every read (`posix_fadvise(DONTNEED)` on this file only)."
        ),
        header=["file in", "method", "MB/s (best)", "seconds (all rounds)", "share of raw read"],
    )
    for cache, result in results.items():
        for m in METHODS:
            section.rows.append(
                [
                    cache,
                    m,
                    f"{result['mb_per_s'][m]:,.0f}",
                    ", ".join(f"{s:.3f}" for s in result["seconds"][m]),
                    f"{100 * result['mb_per_s'][m] / result['mb_per_s']['raw read']:.0f} %",
                ]
            )
    if ctx.quick:
        section.notes.append(f"Quick mode: a {size / 1e6:,.0f} MB file; the full run uses 1.5 GB.")
    section.raw = {"bytes": size, "write_s": write_s, **results}
    for cache, result in results.items():
        ratio = result["ratio"]
        section.targets.append(
            Target(
                f"andrea-bin verified at >= 90 % of a raw read ({cache})",
                f"{100 * ratio:.0f} % ({result['mb_per_s']['verify']:,.0f} vs "
                f"{result['mb_per_s']['raw read']:,.0f} MB/s)",
                ratio >= TARGET,
                ""
                if ratio >= TARGET
                else "each chunk's check (a min and a max) runs after its read, not beside it:"
                " from the page cache the copy and the check take comparable time",
            )
        )
    return section
