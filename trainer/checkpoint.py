"""Writing and reading andrea-bin checkpoints: weights, Adam m and Adam v as float32.

Commit protocol: the sidecar (everything else exact resume needs) is replaced
atomically first, then the .bin is written to a .tmp name, fsynced and renamed. The
.bin rename is the single commit point, so a crash at any moment leaves either the old
set of committed checkpoints or the old set plus the new one, never a torn file under a
committed name. Regions are in model parameter order, each parameter flattened.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from trainwarden.libc import memory_at
from trainwarden.supervisor.contract import (
    ANDREA_BIN_HEADER,
    ANDREA_BIN_REGIONS,
    checkpoint_name,
    in_flight_path,
    sidecar_path,
)
from trainwarden.trainer.adamw import AdamW
from trainwarden.trainer.atomic import fsync_dir, json_bytes, write_bytes_atomically

SLOW_SAVE_ENV = "TRAINER_TEST_SLOW_SAVE_S"
"""Test-only: seconds to sleep between the fsync of the .tmp file and its rename."""
REGIONS = ANDREA_BIN_REGIONS

if sys.byteorder != "little":
    # The format is little-endian and tensors are written as the machine holds them.
    raise ImportError("andrea-bin checkpoints can only be written on a little-endian machine")


@dataclass
class Regions:
    """A checkpoint's three flat float32 regions, on the CPU."""

    step: int
    weights: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor


def write_float32(f: Any, tensor: torch.Tensor) -> None:
    """Append the tensor's values as little-endian float32."""
    flat = tensor.detach().to("cpu", torch.float32).reshape(-1).contiguous()
    # Straight from the tensor's own memory (kept alive by `flat` during the write): no
    # staging copy of a 1.5 GB model. The module refuses big-endian machines at import.
    f.write(memory_at(flat.data_ptr(), 4 * flat.numel()))


def region_tensors(model: nn.Module, optimizer: AdamW, region: str) -> Iterator[torch.Tensor]:
    for param in model.parameters():
        if region == "weights":
            yield param
        else:
            yield getattr(optimizer.state[param], region)


def param_step_counts(model: nn.Module, optimizer: AdamW) -> list[int]:
    """Adam's per-parameter step count (bias correction), in model parameter order."""
    return [optimizer.state[param].step for param in model.parameters()]


def commit_checkpoint(
    directory: Path,
    step: int,
    n_params: int,
    sidecar: bytes,
    write_regions: Callable[[BinaryIO], None],
) -> Path:
    """Commit `step_NNNNNN.bin` by the protocol above; `write_regions` appends the three
    regions after the header. Returns the committed path."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(step)
    write_bytes_atomically(sidecar_path(final), sidecar)
    tmp = in_flight_path(final)
    try:
        with open(tmp, "wb") as f:
            f.write(ANDREA_BIN_HEADER.pack(step, n_params))
            write_regions(f)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        # A full disk, say: leave no partial .tmp behind to take up the space.
        tmp.unlink(missing_ok=True)
        raise
    slow = float(os.environ.get(SLOW_SAVE_ENV, "0") or 0)
    if slow > 0:
        time.sleep(slow)
    os.replace(tmp, final)
    fsync_dir(directory)
    return final


def save_checkpoint(
    directory: Path,
    step: int,
    model: nn.Module,
    optimizer: AdamW,
    sidecar: dict[str, Any],
) -> Path:
    """Commit `step_NNNNNN.bin` (and its sidecar first) straight from the live tensors, in
    the caller's thread; returns the committed path."""

    def write_regions(f: BinaryIO) -> None:
        for region in REGIONS:
            for tensor in region_tensors(model, optimizer, region):
                write_float32(f, tensor)

    n_params = sum(p.numel() for p in model.parameters())
    return commit_checkpoint(directory, step, n_params, json_bytes(sidecar), write_regions)


def read_regions(path: Path) -> Regions:
    """The three regions of a checkpoint that AndreaBin().verify has already accepted."""
    with open(path, "rb") as f:
        step, n_params = ANDREA_BIN_HEADER.unpack(f.read(ANDREA_BIN_HEADER.size))
        tensors = []
        for _ in REGIONS:
            buffer = bytearray(4 * n_params)
            if f.readinto(buffer) != len(buffer):
                raise OSError(f"{path.name}: shorter than its header says")
            tensors.append(torch.frombuffer(buffer, dtype=torch.float32))
    return Regions(step, *tensors)


def _unflatten(flat: torch.Tensor, model: nn.Module) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
    offset = 0
    for param in model.parameters():
        yield param, flat[offset : offset + param.numel()].view_as(param)
        offset += param.numel()


def load_into(
    model: nn.Module,
    optimizer: AdamW,
    regions: Regions,
    step_counts: list[int],
) -> None:
    """Put saved weights, moments and per-parameter step counts back in place."""
    with torch.no_grad():
        for param, saved in _unflatten(regions.weights, model):
            param.copy_(saved)
    moments = zip(
        _unflatten(regions.exp_avg, model),
        _unflatten(regions.exp_avg_sq, model),
        step_counts,
        strict=True,
    )
    with torch.no_grad():
        for (param, exp_avg), (_, exp_avg_sq), count in moments:
            state = optimizer.state[param]
            state.step = int(count)
            state.exp_avg.copy_(exp_avg)
            state.exp_avg_sq.copy_(exp_avg_sq)
