"""The `andrea-bin` checkpoint format: verifying the files the trainer contract names.

`step_NNNNNN.bin` = [int32 step][int32 n_params][n_params float32 weights]
[n_params float32 Adam m][n_params float32 Adam v], little-endian: a complete file is
exactly 8 + 12 * n_params bytes. `step_NNNNNN.json` beside it is an optional sidecar.
The naming and layout are the trainer contract's (trainwarden.supervisor.contract),
shared with the reference trainer; this plugin adds only the verification.

Verification checks the header (n_params > 0, the step of the name), the size, and then
the numbers: every weight and every Adam m is finite, every Adam v finite and >= 0 (a
second moment cannot be negative). The regions are streamed CHUNK_BYTES at a time into
one reusable buffer, so a file of any size costs the same memory; the first bad value
fails the file with its region and index.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointInfo, CheckpointInvalid
from trainwarden.supervisor.contract import (
    ANDREA_BIN_HEADER,
    ANDREA_BIN_REGIONS,
    BYTES_PER_PARAM,
    TMP_SUFFIX,
    checkpoint_name,
    expected_size,
    is_in_flight_name,
    sidecar_path,
    step_of_name,
)

__all__ = [
    "CHUNK_BYTES",
    "HEADER",
    "TMP_SUFFIX",
    "AndreaBin",
    "checkpoint_name",
    "expected_size",
    "read_header",
]

HEADER = ANDREA_BIN_HEADER
FLOAT_BYTES = 4
CHUNK_BYTES = 4 * 1024 * 1024
"""How much of a float region verification reads at a time (a multiple of 4): small enough
that the check reads each chunk from the CPU cache it was just copied into (faster than 1
or 16 MiB on this machine, bench section 8)."""
REGION_LABELS = dict(zip(ANDREA_BIN_REGIONS, ("weight", "Adam m", "Adam v"), strict=True))
"""How a reason names one value of each region: "weight 1,234 is NaN"."""
NON_NEGATIVE = frozenset({"exp_avg_sq"})


def read_header(path: Path) -> tuple[int, int]:
    """(step, n_params) from the first 8 bytes; raises CheckpointInvalid if short."""
    try:
        with open(path, "rb", buffering=0) as f:
            return _header(f, path.name)
    except OSError as exc:
        raise CheckpointInvalid(f"{path.name}: cannot read: {exc.strerror}") from None


def _header(f: io.FileIO, name: str) -> tuple[int, int]:
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise CheckpointInvalid(f"{name}: {len(head)} bytes, shorter than the 8-byte header")
    step, n_params = HEADER.unpack(head)
    return step, n_params


class AndreaBin:
    """Raw float32 weights + Adam moments with an 8-byte header."""

    name = "andrea-bin"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def step_of(self, path: Path) -> int | None:
        return step_of_name(path.name)

    def is_in_flight(self, path: Path) -> bool:
        # The sidecar is written (to its own .tmp) before the .bin: both are writes in flight.
        return is_in_flight_name(path.name)

    def verify(self, path: Path) -> CheckpointInfo:
        name_step = self.step_of(path)
        if name_step is None:
            raise CheckpointInvalid(
                f"{path.name}: not an andrea-bin checkpoint name (step_NNNNNN.bin)"
            )
        try:
            # One open for header, size and numbers: all three judge the same file.
            with open(path, "rb", buffering=0) as f:
                step, n_params = _header(f, path.name)
                if n_params <= 0:
                    raise CheckpointInvalid(
                        f"{path.name}: header says n_params = {n_params}, expected > 0"
                    )
                if step != name_step:
                    raise CheckpointInvalid(
                        f"{path.name}: header step {step} does not match the step"
                        f" {name_step} in the name"
                    )
                size = os.fstat(f.fileno()).st_size
                if size != expected_size(n_params):
                    raise CheckpointInvalid(
                        f"{path.name}: {size} bytes, expected {HEADER.size} + {BYTES_PER_PARAM}"
                        f" x {n_params} = {expected_size(n_params)}"
                        " (truncated or padded)"
                    )
                check_numbers(f, n_params, path.name)
        except OSError as exc:
            raise CheckpointInvalid(f"{path.name}: cannot read: {exc.strerror}") from None
        return CheckpointInfo(step=step, path=path, bytes=size, n_params=n_params)

    def companions(self, path: Path) -> list[Path]:
        return [sidecar_path(path)]


def check_numbers(f: io.FileIO, n_params: int, name: str) -> None:
    """Stream the three float regions from just after the header; raise CheckpointInvalid
    naming the first value that is not finite (or, in Adam v, negative)."""
    # Imported here, not at module level: the CLI and the TUI load this plugin without
    # ever verifying a file, and need not pay for numpy.
    import numpy as np

    if hasattr(os, "posix_fadvise"):  # read once, front to back: a larger read-ahead
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    chunk = max(FLOAT_BYTES, CHUNK_BYTES - CHUNK_BYTES % FLOAT_BYTES)
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    for region in ANDREA_BIN_REGIONS:
        non_negative = region in NON_NEGATIVE
        first = 0  # the region index of the chunk's first value
        while first < n_params:
            count = min(n_params - first, chunk // FLOAT_BYTES)
            _read_exactly(f, view[: count * FLOAT_BYTES], name)
            values = np.frombuffer(buffer, dtype="<f4", count=count)
            # min and max propagate NaN and allocate nothing: one cheap pass each.
            low, high = values.min(), values.max()
            if not ((low >= 0.0 if non_negative else low > -np.inf) and high < np.inf):
                raise CheckpointInvalid(_first_bad(values, region, first, name, non_negative))
            first += count


def _first_bad(values: Any, region: str, first: int, name: str, non_negative: bool) -> str:
    import numpy as np

    bad = ~np.isfinite(values)
    if non_negative:
        bad |= values < 0.0
    index = int(np.flatnonzero(bad)[0])
    value = float(values[index])
    if math.isnan(value):
        what = "NaN"
    elif math.isinf(value):
        what = "+inf" if value > 0 else "-inf"
    else:
        what = f"negative ({value:g})"
    return f"{name}: {REGION_LABELS[region]} {first + index:,} is {what}"


def _read_exactly(f: io.FileIO, into: memoryview, name: str) -> None:
    done = 0
    while done < len(into):
        got = f.readinto(into[done:])
        if not got:
            raise CheckpointInvalid(f"{name}: ended while being verified (truncated meanwhile)")
        done += got
