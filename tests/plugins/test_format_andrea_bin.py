"""The andrea-bin format checks the numbers, not only the header: non-finite weights or
moments and a negative Adam v fail verification with the region and the first bad index,
in any chunk of the stream; and a live daemon quarantines such a checkpoint and resumes
from an older good one."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.support import belongs_to_run, journal, running_daemon, scripted_run, wait_for
from trainwarden.plugins.formats import andrea_bin
from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.supervisor.contract import ANDREA_BIN_HEADER, checkpoint_name
from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.errors import CheckpointInvalid
from trainwarden.supervisor.shell.verdicts import CheckpointReports
from trainwarden.supervisor.store.checkpoints import CheckpointStore

pytestmark = pytest.mark.timeout(120)

N = 10_000
REGION = {"weight": 0, "m": 1, "v": 2}


def regions(n: int = N) -> np.ndarray:
    """Plausible contents, one row per region: weights and m of either sign, v > 0."""
    rng = np.random.default_rng(0)
    return np.stack(
        [
            rng.standard_normal(n).astype("<f4"),
            (1e-3 * rng.standard_normal(n)).astype("<f4"),
            rng.uniform(1e-9, 1e-6, n).astype("<f4"),
        ]
    )


def write(directory: Path, step: int, values: np.ndarray) -> Path:
    path = directory / checkpoint_name(step)
    path.write_bytes(ANDREA_BIN_HEADER.pack(step, values.shape[1]) + values.tobytes())
    return path


def refused(path: Path) -> str:
    with pytest.raises(CheckpointInvalid) as caught:
        AndreaBin().verify(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.fixture(params=["one chunk", "many chunks"])
def chunking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The whole file in one read, or 1,000 bytes at a time (10,000 values: each region
    spans 40 chunks, and the last read of every region is a partial one)."""
    if request.param == "many chunks":
        monkeypatch.setattr(andrea_bin, "CHUNK_BYTES", 1000)
    return str(request.param)


def test_a_valid_file_still_verifies(tmp_path: Path, chunking: str):
    values = regions()
    values[2, :5] = 0.0  # v is zero for parameters that never had a gradient
    values[2, 5] = -0.0
    info = AndreaBin().verify(write(tmp_path, 20, values))
    assert (info.step, info.n_params, info.bytes) == (20, N, 8 + 12 * N)


@pytest.mark.parametrize(
    ("region", "index", "value", "reason"),
    [
        ("weight", 1234, np.nan, "step_000020.bin: weight 1,234 is NaN"),
        ("weight", 0, -np.inf, "step_000020.bin: weight 0 is -inf"),
        ("m", 77, np.inf, "step_000020.bin: Adam m 77 is +inf"),
        ("v", 4321, np.inf, "step_000020.bin: Adam v 4,321 is +inf"),
        ("v", 17, -0.5, "step_000020.bin: Adam v 17 is negative (-0.5)"),
        ("v", N - 1, np.nan, "step_000020.bin: Adam v 9,999 is NaN"),
    ],
)
def test_a_bad_value_is_refused_with_its_region_and_index(
    tmp_path: Path, chunking: str, region: str, index: int, value: float, reason: str
):
    values = regions()
    values[REGION[region], index] = value
    assert refused(write(tmp_path, 20, values)) == reason


def test_all_nan_weights_name_the_first(tmp_path: Path, chunking: str):
    values = regions()
    values[0, :] = np.nan
    assert refused(write(tmp_path, 20, values)) == "step_000020.bin: weight 0 is NaN"


def test_the_first_bad_value_is_named_when_several_chunks_hold_one(tmp_path: Path, chunking: str):
    values = regions()
    values[0, [3000, 700, 9000]] = np.nan
    values[2, 10] = -1.0
    assert refused(write(tmp_path, 20, values)) == "step_000020.bin: weight 700 is NaN"


def test_one_exponent_bit_flipped_in_a_weight_is_refused(tmp_path: Path, chunking: str):
    values = regions()
    values[0, 6000] = 1.0  # 0x3f800000: setting exponent bit 30 makes 0x7f800000, +inf
    path = write(tmp_path, 20, values)
    data = bytearray(path.read_bytes())
    at = 8 + 4 * 6000 + 3  # the weight's most significant byte, little-endian
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    assert struct.unpack_from("<f", data, 8 + 4 * 6000)[0] == float("inf")
    assert refused(path) == "step_000020.bin: weight 6,000 is +inf"


def test_size_and_header_are_judged_before_the_numbers(tmp_path: Path):
    values = regions()
    values[0, 0] = np.nan
    path = write(tmp_path, 20, values)
    path.write_bytes(path.read_bytes()[:-4])
    assert "truncated or padded" in refused(path)


def test_verification_reads_in_bounded_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """No read asks for more than CHUNK_BYTES, however large the file."""
    monkeypatch.setattr(andrea_bin, "CHUNK_BYTES", 4096)
    path = write(tmp_path, 20, regions())
    asked: list[int] = []
    real_read = andrea_bin._read_exactly

    def spy(f: object, into: memoryview, name: str) -> None:
        asked.append(len(into))
        real_read(f, into, name)  # type: ignore[arg-type]

    monkeypatch.setattr(andrea_bin, "_read_exactly", spy)
    AndreaBin().verify(path)
    assert max(asked) == 4096 and sum(asked) == 12 * N


# ----------------------------------------------------------------------------- off the loop


class RecordingAndreaBin(AndreaBin):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def verify(self, path: Path):  # type: ignore[no-untyped-def]
        self.threads.append(threading.get_ident())
        return super().verify(path)


class NoHub:
    def checkpoint_seen(self, info: object, mtime: float, scanned: bool = False) -> None:
        pass


def test_the_daemon_verifies_in_a_worker_thread_never_on_its_loop(tmp_path: Path):
    """Reading every number of a large file takes seconds: never on the event loop, both
    for the start-up scan and for a commit the watcher reports."""
    fmt = RecordingAndreaBin()
    write(tmp_path, 20, regions())
    bad = regions()
    bad[0, 3] = np.nan
    write(tmp_path, 40, bad)
    events: list[core.Event] = []

    async def main() -> tuple[int, tuple[core.Scanned, ...]]:
        reports = CheckpointReports(CheckpointStore(tmp_path, fmt), NoHub(), events.append)  # type: ignore[arg-type]
        scanned = await reports.scan()
        write(tmp_path, 60, bad)
        reports.committed(checkpoint_name(60))
        while not any(not isinstance(e, core.CheckpointSeen) for e in events):
            await asyncio.sleep(0.01)
        return threading.get_ident(), scanned

    loop_thread, scanned = asyncio.run(main())
    assert len(fmt.threads) == 3 and loop_thread not in fmt.threads
    assert [(s.name, s.outcome) for s in scanned] == [
        (checkpoint_name(20), core.Outcome.VERIFIED),
        (checkpoint_name(40), core.Outcome.INVALID),
    ]
    assert "weight 3 is NaN" in str(events[-1])


# ----------------------------------------------------------------------------- live daemon

N_LIVE = 1000


def good_run(run_dir: Path) -> Path:
    """An endless scripted trainer saving valid (all-zero) checkpoints every 20 steps."""
    return scripted_run(
        run_dir,
        *("--steps", "100000000", "--save-every", "20", "--dt", "0.02"),
        *("--n-params", str(N_LIVE)),
        restart={"backoff_initial_s": 0.0, "backoff_max_s": 0.0, "stall_timeout_s": 60.0},
    )


def nan_weights(step: int) -> bytes:
    weights = np.zeros(N_LIVE, dtype="<f4")
    weights[N_LIVE // 2 :] = np.nan
    moments = np.zeros(2 * N_LIVE, dtype="<f4")
    return ANDREA_BIN_HEADER.pack(step, N_LIVE) + weights.tobytes() + moments.tobytes()


def quarantine_reason(run_dir: Path, name: str) -> str | None:
    for record in journal(run_dir):
        if record["kind"] == "quarantine" and record["name"] == name:
            return str(record["reason"])
    return None


def test_a_nan_checkpoint_committed_live_is_quarantined_and_never_resumed(tmp_path: Path):
    run_dir = good_run(tmp_path / "run")
    ckpts = run_dir / "checkpoints"
    bad = checkpoint_name(900_000)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running", timeout=60)
        wait_for(lambda: daemon.request("checkpoints")["checkpoints"], 30, 0.1, what="a save")
        # Newer than every good one, committed the contract's way: written, then renamed.
        staged = ckpts / f"staging-{bad}"
        staged.write_bytes(nan_weights(900_000))
        os.replace(staged, ckpts / bad)
        reason = wait_for(lambda: quarantine_reason(run_dir, bad), 10, what=f"{bad} quarantined")
        assert reason == f"{bad}: weight {N_LIVE // 2} is NaN"
        wait_for(lambda: (ckpts / "quarantine" / bad).exists(), 10, what="the move")
        assert not (ckpts / bad).exists()
        listed = daemon.request("checkpoints")["checkpoints"]
        assert listed and all(c["name"] != bad for c in listed)
        # A crash now restarts from the newest good checkpoint, never the NaN one.
        pid = daemon.status()["trainer_pid"]
        spawns = len([r for r in journal(run_dir) if r["kind"] == "spawn"])
        assert belongs_to_run(pid, run_dir)
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: len([r for r in journal(run_dir) if r["kind"] == "spawn"]) > spawns,
            30,
            what="the restart",
        )
        resume = [r for r in journal(run_dir) if r["kind"] == "spawn"][-1]["resume"]
        assert resume is not None and resume["step"] % 20 == 0 and resume["step"] < 900_000
        assert (ckpts / checkpoint_name(resume["step"])).exists()


def test_a_nan_checkpoint_present_at_start_is_quarantined_and_the_older_one_resumed(
    tmp_path: Path,
):
    run_dir = good_run(tmp_path / "run")
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir()
    good = ANDREA_BIN_HEADER.pack(20, N_LIVE) + bytes(12 * N_LIVE)
    (ckpts / checkpoint_name(20)).write_bytes(good)
    (ckpts / checkpoint_name(40)).write_bytes(nan_weights(40))
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running", timeout=60)
        spawn = next(r for r in journal(run_dir) if r["kind"] == "spawn")
        assert spawn["resume"]["step"] == 20
        reason = quarantine_reason(run_dir, checkpoint_name(40))
        assert reason == f"{checkpoint_name(40)}: weight {N_LIVE // 2} is NaN"
        assert (ckpts / "quarantine" / checkpoint_name(40)).exists()
