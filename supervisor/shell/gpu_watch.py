"""NVML's critical XID events and a lost GPU, watched in a thread (inputs.gpu_events), as
the policy's events on the daemon's queue; and, once the watcher is up, a `gpu_events`
record of which GPUs it watches and why any it cannot (nothing where NVML is unusable)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.inputs.gpu import shared_nvml
from trainwarden.supervisor.inputs.gpu_events import GpuEventWatcher
from trainwarden.supervisor.store.journal import Journal

READY_WAIT_S = 60.0


def watch_gpus(
    loop: asyncio.AbstractEventLoop, report: Callable[[Any], None], journal: Journal
) -> tuple[GpuEventWatcher, asyncio.Task[None]]:
    """The watcher, started; the task that journals what it watches."""

    def on_xid(gpu: int, xid: int, recovery: str | None) -> None:
        loop.call_soon_threadsafe(report, core.GpuFault(time.monotonic(), gpu, xid, recovery))

    def on_lost(gpu: int, error: str) -> None:
        loop.call_soon_threadsafe(report, core.GpuLost(time.monotonic(), gpu, error))

    watcher = GpuEventWatcher(shared_nvml(), on_xid, on_lost)
    watcher.start()

    async def journal_watching() -> None:
        await asyncio.to_thread(watcher.ready.wait, READY_WAIT_S)
        if watcher.watching or watcher.without_events:
            without = {str(i): why for i, why in watcher.without_events.items()}
            journal.append(
                {"kind": "gpu_events", "watching": watcher.watching, "without_events": without}
            )

    return watcher, loop.create_task(journal_watching())
