"""The `andrea-bin` checkpoint format (see README, "Checkpoint format").

`step_NNNNNN.bin` = [int32 step][int32 n_params][n_params float32 weights]
[n_params float32 Adam m][n_params float32 Adam v], little-endian: a complete file is
exactly 8 + 12 * n_params bytes. `step_NNNNNN.json` beside it is an optional sidecar.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwarden.plugins.api import CheckpointInfo
from trainwarden.supervisor.errors import CheckpointInvalid

HEADER = struct.Struct("<ii")
NAME = re.compile(r"^step_(\d{6,})\.bin$")
SIDECAR = re.compile(r"^step_(\d{6,})\.json$")
TMP_SUFFIX = ".tmp"


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}.bin"


def expected_size(n_params: int) -> int:
    return HEADER.size + 12 * n_params


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
        match = NAME.match(path.name)
        return int(match.group(1)) if match else None

    def is_in_flight(self, path: Path) -> bool:
        if not path.name.endswith(TMP_SUFFIX):
            return False
        # The sidecar is written (to its own .tmp) before the .bin: both are writes in flight.
        stem = path.name[: -len(TMP_SUFFIX)]
        return NAME.match(stem) is not None or SIDECAR.match(stem) is not None

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
                f"{path.name}: {size} bytes, expected 8 + 12 x {n_params} = {expected_size(n_params)}"
                " (truncated or padded)"
            )
        return CheckpointInfo(step=step, path=path, bytes=size, n_params=n_params)

    def companions(self, path: Path) -> list[Path]:
        return [path.with_suffix(".json")]
