"""Host and trainer-process figures from psutil: CPU, memory, checkpoint disk, load.

`HostSampler.sample()` is cheap (a few /proc reads per trainer process) and blocking, so
the daemon calls it next to the GPU sample in a worker thread.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from trainwarden.supervisor.inputs.proctree import descendants

DISK_HEADROOM = 1.5
"""Free space on the checkpoint volume below this many newest checkpoints counts as low."""


class HostSample(NamedTuple):
    """One reading of the host and of the trainer's process tree."""

    trainer_cpu_percent: float | None
    """CPU of the trainer and all its descendants, in percent of one core (None: no trainer)."""
    trainer_rss_bytes: int | None
    """Resident memory summed over the tree (pages shared between processes count twice)."""
    trainer_processes: int
    """Processes in the trainer's tree (0: no trainer)."""
    mem_used_bytes: int
    """Host memory in use: total minus available (page cache counts as free)."""
    mem_total_bytes: int
    disk_free_bytes: int | None
    """Space an unprivileged user can still write on the checkpoint volume."""
    disk_total_bytes: int | None
    load_avg_1m: float
    load_avg_5m: float
    load_avg_15m: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly mapping of the fields."""
        return self._asdict()


def disk_low(free_bytes: int | None, newest_checkpoint_bytes: int | None) -> bool:
    """True when the next checkpoint may not fit: free < 1.5 x the newest checkpoint's size.

    Unknown figures (None) are never reported as low.
    """
    if free_bytes is None or newest_checkpoint_bytes is None:
        return False
    return free_bytes < DISK_HEADROOM * newest_checkpoint_bytes


class HostSampler:
    """Samples the host and the trainer's process tree; keeps psutil handles between calls.

    `psutil.Process.cpu_percent()` measures since the previous call on the same object,
    so the objects live on from one sample to the next; processes that exit are dropped,
    and a reused pid is recognised by its start time.
    """

    def __init__(self, checkpoint_dir: Path | str) -> None:
        self.checkpoint_dir = Path(checkpoint_dir)
        self._tree: dict[int, psutil.Process] = {}

    def sample(self, trainer_pid: int | None) -> HostSample:
        cpu, rss, count = self._trainer_figures(trainer_pid)
        memory = psutil.virtual_memory()
        free, total = self._disk()
        load_1m, load_5m, load_15m = os.getloadavg()
        return HostSample(
            trainer_cpu_percent=cpu,
            trainer_rss_bytes=rss,
            trainer_processes=count,
            mem_used_bytes=memory.total - memory.available,
            mem_total_bytes=memory.total,
            disk_free_bytes=free,
            disk_total_bytes=total,
            load_avg_1m=load_1m,
            load_avg_5m=load_5m,
            load_avg_15m=load_15m,
        )

    def _trainer_figures(self, pid: int | None) -> tuple[float | None, int | None, int]:
        tree = self._current_tree(pid)
        if tree is None:
            self._tree = {}
            return None, None, 0
        cpu, rss = 0.0, 0
        alive: dict[int, psutil.Process] = {}
        for child_pid, process in tree.items():
            try:
                with process.oneshot():
                    if process.status() == psutil.STATUS_ZOMBIE:
                        continue  # exited, not yet reaped by its parent: uses nothing
                    cpu += process.cpu_percent(interval=None)
                    rss += process.memory_info().rss
            except psutil.Error:  # exited since it was listed
                continue
            alive[child_pid] = process
        self._tree = alive
        if pid not in alive:
            return None, None, 0
        return cpu, rss, len(alive)

    def _current_tree(self, pid: int | None) -> dict[int, psutil.Process] | None:
        if pid is None:
            return None
        try:
            root = self._tree.get(pid)
            if root is None or not root.is_running():
                root = psutil.Process(pid)
        except psutil.Error:
            return None
        tree = {pid: root}
        for child_pid in descendants(pid):
            cached = self._tree.get(child_pid)
            try:
                # is_running() compares start times: the same process, not a reused pid.
                if cached is None or not cached.is_running():
                    cached = psutil.Process(child_pid)
                tree[child_pid] = cached
            except psutil.Error:
                continue  # exited since it was listed
        return tree

    def _disk(self) -> tuple[int | None, int | None]:
        path = self.checkpoint_dir
        while not path.exists() and path != path.parent:
            path = path.parent  # not created yet: its volume is the nearest existing parent's
        try:
            usage = shutil.disk_usage(path)
        except OSError:
            return None, None
        return usage.free, usage.total
