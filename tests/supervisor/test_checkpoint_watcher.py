"""The checkpoint watcher wakes for what commits or writes a checkpoint, not for reads."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest

from trainwarden.plugins.formats.andrea_bin import AndreaBin, checkpoint_name
from trainwarden.supervisor.inputs.checkpoint_watch import CheckpointWatcher
from trainwarden.supervisor.store.checkpoints import CheckpointStore

pytestmark = pytest.mark.timeout(60)


def andrea_bin(step: int, n_params: int = 4) -> bytes:
    return struct.pack("<ii", step, n_params) + bytes(12 * n_params)


async def test_reading_checkpoints_does_not_wake_the_watcher(tmp_path: Path):
    store = CheckpointStore(tmp_path / "checkpoints", AndreaBin())
    store.ensure()
    final = store.dir / checkpoint_name(10)
    final.write_bytes(andrea_bin(10))
    events = []
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    watcher = CheckpointWatcher(store, loop, on_committed=seen.append, on_writing=lambda: None)
    original = watcher.on_any_event
    watcher.on_any_event = lambda event: (events.append(event), original(event))  # type: ignore[method-assign]
    watcher.start()
    try:
        await asyncio.sleep(0.2)

        def read_many() -> None:
            for _ in range(50):
                final.read_bytes()  # verification, a mirror copying, a user's cat
                os.listdir(store.dir)  # ls

        await asyncio.to_thread(read_many)
        await asyncio.sleep(0.5)
        assert events == []

        def commit() -> None:
            tmp = store.dir / (checkpoint_name(20) + ".tmp")
            tmp.write_bytes(andrea_bin(20))
            os.replace(tmp, store.dir / checkpoint_name(20))

        await asyncio.to_thread(commit)
        deadline = loop.time() + 5
        while not seen and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert seen == [checkpoint_name(20)]
    finally:
        watcher.stop()
