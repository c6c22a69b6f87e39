"""The daemon's periodic samples: the GPU (NVML) and the host (psutil) every
[telemetry] sample_interval_s, the trainer's bandit and samples files when they change,
a GPU's throttle episodes and a checkpoint disk running low; each published on its topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from trainwarden.plugins.api import CheckpointInfo
from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core.gpu_faults import Throttle, throttle_step
from trainwarden.supervisor.core.phases import STEPPING, Phase
from trainwarden.supervisor.protocol import (
    SIDECAR_READ_MAX_BYTES,
    bounded_sidecar,
    sidecar_too_large,
)
from trainwarden.supervisor.shell.telemetry import Monitor, no_gpu_reason
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.rundir import RunFiles

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import DiskRoomFacts

log = logging.getLogger("trainwarden.telemetry")


class Samplers:
    def __init__(
        self,
        cfg: Config,
        files: RunFiles,
        journal: Journal,
        monitor: Monitor,
        publish: Callable[[str, Any], None],
        trainer_pid: Callable[[], int | None],
        phase: Callable[[], Phase],
        newest_checkpoint: Callable[[], CheckpointInfo | None],
    ) -> None:
        self.cfg = cfg
        self.files = files
        self.journal = journal
        self.monitor = monitor
        """Told the GPU's name (its peak FLOPs) and asked for the MFU a throttle cost."""
        self.publish = publish
        self.trainer_pid = trainer_pid
        self.phase = phase
        self.newest_checkpoint = newest_checkpoint
        """The newest verified checkpoint: whether the disk has room for one more."""
        self.latest: dict[str, Any] = {"gpu": None, "host": None, "bandit": None, "samples": None}
        """Each topic's newest sample, for a subscriber's snapshot and status."""
        self.gpu_sampler: Any = None
        self.host_sampler: Any = None
        self.throttle = Throttle()
        """GPU 0's throttle episode (see core.gpu_faults.throttle_step)."""
        self.disk_low = False
        self._file_mtimes: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self._sample_forever())

    def gpu_status(self) -> str:
        if self.gpu_sampler is None:
            return "not sampled yet"
        if not getattr(self.gpu_sampler, "available", False):
            return getattr(self.gpu_sampler, "reason", None) or no_gpu_reason()
        return "ok"

    async def _sample_forever(self) -> None:
        from trainwarden.supervisor.inputs.gpu import GpuSampler
        from trainwarden.supervisor.inputs.host import HostSampler

        self.gpu_sampler = await asyncio.to_thread(GpuSampler)
        self.host_sampler = HostSampler(self.cfg.checkpoint_dir)
        if not self.gpu_sampler.available:
            if self.cfg.telemetry.peak_tflops == "auto":
                self.monitor.set_peak_tflops(None, no_gpu_reason())
        else:
            name = await asyncio.to_thread(self.gpu_sampler.name)
            if self.cfg.telemetry.peak_tflops == "auto":
                self.monitor.set_gpu_name(name)
        while True:
            try:
                await self._sample_once()
            except Exception:  # a sampler failure must never stop supervision
                log.exception("sampling failed")
            await asyncio.sleep(self.cfg.telemetry.sample_interval_s)

    def _publish(self, topic: str, data: Any) -> None:
        self.latest[topic] = data
        self.publish(topic, data)

    async def _sample_once(self) -> None:
        from trainwarden.supervisor.inputs.host import disk_low

        # One trip to a worker thread for all of it: each trip wakes the loop twice.
        gpu, host, sidecars = await asyncio.to_thread(self._read_all, self.trainer_pid())
        self._publish("gpu", gpu.to_dict() if gpu is not None else None)
        if gpu is not None:
            self._watch_throttle(gpu.index, gpu.throttle_reasons)
        self._publish("host", host.to_dict())
        newest = self.newest_checkpoint()
        if newest is not None:
            low = disk_low(host.disk_free_bytes, newest.bytes)
            if low != self.disk_low:
                self.disk_low = low
                room: DiskRoomFacts = {
                    "free_bytes": host.disk_free_bytes,
                    "checkpoint_bytes": newest.bytes,
                }
                if low:
                    self.journal.append({"kind": "disk_low", **room})
                else:
                    self.journal.append({"kind": "disk_ok", **room})
        for topic, data in sidecars.items():
            if data is not None:
                self._publish(topic, data)

    def _read_all(self, pid: int | None) -> tuple[Any, Any, dict[str, Any]]:
        """(the GPU's sample, the host's, each sidecar file that changed), in a thread."""
        gpu = self.gpu_sampler.sample()
        host = self.host_sampler.sample(pid)
        sidecars = {
            topic: self._read_if_changed(topic, path)
            for topic, path in (
                ("bandit", self.files.bandit_state),
                ("samples", self.files.samples),
            )
        }
        return gpu, host, sidecars

    def _watch_throttle(self, index: int, reasons: Any) -> None:
        """Journal `gpu_throttle` once per episode of heat or hardware slowdown that lasts
        [gpu] throttle_after_s, with the MFU it cost."""
        from trainwarden.supervisor.inputs.gpu import ALARMING_REASONS

        alarming = tuple(r for r in reasons or () if r in ALARMING_REASONS)
        mfu = self.monitor.snapshot().get("mfu") if self.phase() in STEPPING else None
        self.throttle, record = throttle_step(
            self.throttle, time.monotonic(), alarming, mfu, self.cfg.gpu.throttle_after_s
        )
        if record is not None:
            self.journal.append({"kind": "gpu_throttle", "gpu": index, **record})

    def _read_if_changed(self, topic: str, path: Path) -> Any:
        try:
            info = path.stat()
        except OSError:
            return None
        mtime = info.st_mtime
        if self._file_mtimes.get(topic) == mtime:
            return None
        self._file_mtimes[topic] = mtime
        if info.st_size > SIDECAR_READ_MAX_BYTES:
            return sidecar_too_large(info.st_size)
        try:
            raw = path.read_bytes()
            data = orjson.loads(raw)
        except (OSError, orjson.JSONDecodeError) as exc:
            # The trainer writes these atomically; a bad one is its bug, not ours.
            log.warning("ignoring %s: %s", path.name, exc)
            return None
        # Cut to what a subscribe's one line can carry (the cut is marked `truncated`).
        return bounded_sidecar(data, len(raw)) if isinstance(data, dict) else None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
