"""The `andrea-bin` checkpoint format: verifying the files the trainer contract names.

`step_NNNNNN.bin` = [int32 step][int32 n_params][n_params float32 weights]
[n_params float32 Adam m][n_params float32 Adam v], little-endian: a complete file is
exactly 8 + 12 * n_params bytes. `step_NNNNNN.json` beside it is an optional sidecar.
The naming and layout are the trainer contract's (trainwarden.supervisor.contract),
shared with the reference trainer; this plugin adds only the verification.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointInfo, CheckpointInvalid
from trainwarden.supervisor.contract import (
    ANDREA_BIN_HEADER,
    BYTES_PER_PARAM,
    TMP_SUFFIX,
    checkpoint_name,
    expected_size,
    is_in_flight_name,
    sidecar_path,
    step_of_name,
)

__all__ = ["HEADER", "TMP_SUFFIX", "AndreaBin", "checkpoint_name", "expected_size", "read_header"]

HEADER = ANDREA_BIN_HEADER


def read_header(path: Path) -> tuple[int, int]:
    """(step, n_params) from the first 8 bytes; raises CheckpointInvalid if short."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except OSError as exc:
        raise CheckpointInvalid(f"{path.name}: cannot read: {exc.strerror}") from None
    if len(head) < HEADER.size:
        raise CheckpointInvalid(f"{path.name}: {len(head)} bytes, shorter than the 8-byte header")
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
        step, n_params = read_header(path)
        if n_params <= 0:
            raise CheckpointInvalid(f"{path.name}: header says n_params = {n_params}, expected > 0")
        if step != name_step:
            raise CheckpointInvalid(
                f"{path.name}: header step {step} does not match the step {name_step} in the name"
            )
        size = path.stat().st_size
        if size != expected_size(n_params):
            raise CheckpointInvalid(
                f"{path.name}: {size} bytes, expected {HEADER.size} + {BYTES_PER_PARAM} x"
                f" {n_params} = {expected_size(n_params)}"
                " (truncated or padded)"
            )
        return CheckpointInfo(step=step, path=path, bytes=size, n_params=n_params)

    def companions(self, path: Path) -> list[Path]:
        return [sidecar_path(path)]
