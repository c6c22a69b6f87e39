"""Bugs the chaos soak and the bad-input catalogue turned up, pinned at the smallest scale.

Each test failed before its fix (see the report that came with it); the soak and the
catalogue exercise the same paths end to end.
"""

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


async def committed_names(store: CheckpointStore, act, settle_s: float = 1.5) -> list[str]:
    """The names the watcher reports as committed while `act()` runs."""
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    watcher = CheckpointWatcher(store, loop, on_committed=seen.append, on_writing=lambda: None)
    watcher.start()
    try:
        await asyncio.sleep(0.2)
        await asyncio.to_thread(act)
        deadline = loop.time() + settle_s
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
    finally:
        watcher.stop()
    return seen


async def test_a_checkpoint_renamed_in_from_another_folder_is_reported(tmp_path: Path):
    """The contract's commit point is the rename to the final name. A trainer that stages its
    temporary file outside checkpoints/ (same filesystem) renames it in: inotify reports an
    unpaired IN_MOVED_TO, which watchdog turns into a *created* event. The watcher ignored
    creates, so such checkpoints were invisible until the daemon restarted."""
    store = CheckpointStore(tmp_path / "run" / "checkpoints", AndreaBin())
    store.ensure()
    staging = tmp_path / "run" / "staging.tmp"

    def commit() -> None:
        staging.write_bytes(andrea_bin(100))
        os.replace(staging, store.dir / checkpoint_name(100))

    assert await committed_names(store, commit) == [checkpoint_name(100)]


async def test_a_link_renamed_in_is_reported_so_it_can_be_quarantined(tmp_path: Path):
    store = CheckpointStore(tmp_path / "run" / "checkpoints", AndreaBin())
    store.ensure()
    target = tmp_path / "outside.bin"
    target.write_bytes(andrea_bin(7))

    def commit() -> None:
        link = tmp_path / "run" / "link"
        link.symlink_to(target)
        os.replace(link, store.dir / checkpoint_name(7))

    assert await committed_names(store, commit) == [checkpoint_name(7)]
    assert "symbolic link" in store.verify(checkpoint_name(7)).reason


async def test_a_file_written_in_place_is_reported_once_it_is_closed_not_before(tmp_path: Path):
    """The other side of the fix: a bare create of a half-written file is still not judged."""
    store = CheckpointStore(tmp_path / "run" / "checkpoints", AndreaBin())
    store.ensure()
    data = andrea_bin(200, 1000)
    reported_while_open: list[list[str]] = []
    seen: list[str] = []

    def write_slowly() -> None:
        import time

        with open(store.dir / checkpoint_name(200), "wb") as f:
            f.write(data[:100])
            f.flush()
            time.sleep(0.5)
            reported_while_open.append(list(seen))
            f.write(data[100:])

    loop = asyncio.get_running_loop()
    watcher = CheckpointWatcher(store, loop, on_committed=seen.append, on_writing=lambda: None)
    watcher.start()
    try:
        await asyncio.sleep(0.2)
        await asyncio.to_thread(write_slowly)
        await asyncio.sleep(1.0)
    finally:
        watcher.stop()
    assert reported_while_open == [[]]
    assert checkpoint_name(200) in seen


async def test_trainer_identity_is_recorded_with_the_trainers_cmdline(tmp_path: Path):
    """TrainerIdentity.of read /proc/PID/cmdline right after spawn; while the child was still
    inside execve it read [] (about 1 spawn in 20 on a busy 2-core machine), and a daemon
    restarted later did not recognise its leftover trainer and started a second one (seen
    in the chaos soak). It now waits for the cmdline to appear."""
    import signal

    from trainwarden.supervisor.shell.process import TrainerIdentity, spawn

    empty = 0
    for _ in range(300):
        proc = await spawn(["/bin/sleep", "30"], tmp_path, dict(os.environ), tmp_path / "log")
        try:
            identity = TrainerIdentity.of(proc.pid)
            empty += not identity.cmdline
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert empty == 0, f"{empty} of 300 identities recorded an empty cmdline"


NAN_ONCE_TRAINER = """
import os, struct, sys
from pathlib import Path
run = Path.cwd(); (run / "checkpoints").mkdir(exist_ok=True)
start = 0
if os.environ.get("TRAINWARDEN_RESUME"):
    start = struct.unpack("<ii", open(os.environ["TRAINWARDEN_RESUME"], "rb").read(8))[0]
marker = run / "nan-fired"
for step in range(start + 1, 31):
    nan = step == 15 and not marker.exists()
    if nan:
        marker.touch()
    print(f"step: {step}, loss: {'nan' if nan else 5 - 0.001 * step:.6}, dt: 0.01", flush=True)
    if nan:
        import time; time.sleep(30)
    if step % 10 == 0:
        tmp = run / "checkpoints" / f"step_{step:06d}.bin.tmp"
        tmp.write_bytes(struct.pack("<ii", step, 10) + bytes(120))
        os.replace(tmp, tmp.with_name(f"step_{step:06d}.bin"))
"""


def test_a_divergence_rollback_is_not_reported_as_resume_drift(tmp_path: Path):
    from tests.support import PYTHON, journal, make_run, running_daemon

    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "-c", NAN_ONCE_TRAINER],
        trainer={"stop_timeout_s": 5.0},
        restart={"backoff_initial_s": 0.0, "backoff_max_s": 0.0},
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=60)
    records = journal(run_dir)
    assert any(r["kind"] == "divergence" for r in records)
    drifts = [r for r in records if r["kind"] == "resume_drift"]
    assert not drifts, drifts
