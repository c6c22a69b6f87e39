"""Checkpoints that do not stall training: snapshot at the step boundary, write behind.

At a save the step loop copies weights, Adam m and Adam v into one host buffer, allocated
once (pinned on CUDA, so the device-to-host copy runs at the bus's speed), and goes on
training; a background thread writes the andrea-bin file from that buffer by the same
commit protocol as a synchronous save (trainer.checkpoint.commit_checkpoint). The copy is
made between steps, so the file's bytes are the ones a synchronous save of that step
would write.

At most one write is in flight: a save asked for while one is writing first waits for it,
and that wait is part of the save's reported stall. The thread is not a daemon thread: a
trainer that dies of an exception still commits the snapshot it took at a clean step
boundary before the interpreter exits; only a kill loses it, leaving the previous
checkpoint and at most a .tmp.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from torch import nn

from trainwarden.supervisor.contract import save_report_line
from trainwarden.trainer.adamw import AdamW
from trainwarden.trainer.atomic import json_bytes
from trainwarden.trainer.checkpoint import (
    REGIONS,
    commit_checkpoint,
    region_tensors,
    save_checkpoint,
    write_float32,
)


@dataclass(frozen=True)
class SaveDone:
    """A committed save, as its report line tells it."""

    path: Path
    reason: str
    stall_s: float
    """Seconds the step loop waited for this save."""
    write_s: float
    """Seconds the write to disk took (in the background for an asynchronous save)."""

    def line(self) -> str:
        size_mb = self.path.stat().st_size / 1e6
        return save_report_line(self.path.name, self.reason, size_mb, self.stall_s, self.write_s)


class HostSnapshot:
    """One reusable host copy of the three regions, in file order."""

    def __init__(self, model: nn.Module, optimizer: AdamW, device: torch.device) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.n_params = sum(p.numel() for p in model.parameters())
        # Zeroed, not left empty: every page is faulted in now, at start-up, and not during
        # the first save (a quarter of a 100 MB save's stall on the CPU).
        self.buffer = torch.zeros(
            len(REGIONS) * self.n_params, dtype=torch.float32, pin_memory=device.type == "cuda"
        )

    @torch.no_grad()
    def fill(self) -> None:
        """Copy the live tensors in; returns once the buffer holds them all."""
        cuda = self.device.type == "cuda"
        offset = 0
        for region in REGIONS:
            for tensor in region_tensors(self.model, self.optimizer, region):
                size = tensor.numel()
                self.buffer[offset : offset + size].copy_(tensor.reshape(-1), non_blocking=cuda)
                offset += size
        if cuda:
            # The copies were queued on the current stream behind the optimizer step; the
            # buffer is only whole once they have run.
            torch.cuda.current_stream(self.device).synchronize()

    def write_to(self, f: BinaryIO) -> None:
        write_float32(f, self.buffer)  # from the buffer's own memory: no staging copy


class CheckpointSaver:
    """Saves one step's checkpoint at a time, in the background unless `background` is off."""

    def __init__(
        self,
        directory: Path,
        model: nn.Module,
        optimizer: AdamW,
        device: torch.device,
        background: bool = True,
    ) -> None:
        self.directory = directory
        self.model = model
        self.optimizer = optimizer
        self.background = background
        # Allocated before the first step: its cost (seconds for a pinned 1.5 GB) is paid
        # at start-up, not as the first save's stall.
        self.snapshot = HostSnapshot(model, optimizer, device) if background else None
        self._thread: threading.Thread | None = None
        self._done: SaveDone | None = None
        self._error: BaseException | None = None
        self.writing_step: int | None = None
        """The step whose write is in flight, if any."""

    def save(self, step: int, sidecar: dict, reason: str, started: float) -> SaveDone | None:
        """Take step `step`'s checkpoint; `started` is when the loop began waiting (it counts
        in the stall). Returns the report when the save is already committed (a synchronous
        save); an asynchronous one reports through poll() or wait()."""
        assert self._thread is None, "wait() for the write in flight first"
        data = json_bytes(sidecar)
        if self.snapshot is None:
            path = save_checkpoint(self.directory, step, self.model, self.optimizer, sidecar)
            elapsed = time.perf_counter() - started
            return SaveDone(path, reason, elapsed, elapsed)
        self.snapshot.fill()
        stall = time.perf_counter() - started
        self.writing_step = step
        self._thread = threading.Thread(
            target=self._write,
            args=(step, data, reason, stall),
            name=f"checkpoint-{step}",
        )
        self._thread.start()
        return None

    def _write(self, step: int, sidecar: bytes, reason: str, stall: float) -> None:
        assert self.snapshot is not None
        started = time.perf_counter()
        try:
            path = commit_checkpoint(
                self.directory, step, self.snapshot.n_params, sidecar, self.snapshot.write_to
            )
        except BaseException as exc:
            self._error = exc
            return
        self._done = SaveDone(path, reason, stall, time.perf_counter() - started)

    def poll(self) -> SaveDone | None:
        """The write that finished since the last look, if one did; raises its error."""
        if self._thread is None or self._thread.is_alive():
            return None
        return self.wait()

    def wait(self) -> SaveDone | None:
        """Wait for the write in flight (if any); its report, or its error raised here."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        self.writing_step = None
        done, self._done = self._done, None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return done
