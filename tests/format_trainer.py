"""A tiny trainer that writes checkpoints in the torch-pt, hf-trainer or llmc format.

Usage: python tests/format_trainer.py --format torch-pt|hf-trainer|llmc --steps N
  [--save-every K] [--dt SECONDS] [--crash-at STEP]
Prints `step: N, loss: X, dt: D` lines, writes into ./checkpoints the way the real
writers do (torch-pt: torch.save to a .tmp name, fsync, rename; hf-trainer: the files of
checkpoint-N/ in place with trainer_state.json last, as the Trainer does; llmc: model and
state files in place, then the empty DONE marker, as llm.c does), resumes from
TRAINWARDEN_RESUME, saves and exits 0 on SIGTERM, saves and continues on SIGUSR1, and with
--crash-at exits 3 at that step without saving.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# llm.c's header layout with a tiny GPT-2: maxT 8, V 10, Vp 16, L 1, NH 1, C 4.
LLMC_CONFIG = (8, 10, 1, 1, 4, 16)
LLMC_N_PARAMS = 16 * 4 + 8 * 4 + 1 * (12 * 4 * 4 + 13 * 4) + 2 * 4


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------- torch-pt


def save_torch_pt(directory: Path, step: int) -> None:
    import torch

    final = directory / f"ckpt_{step:06d}.pt"
    tmp = final.with_name(final.name + ".tmp")
    state = {
        "model": {"w": torch.full((4, 4), float(step)), "b": torch.zeros(4)},
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
        "step": step,
    }
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)


def resume_torch_pt(path: str) -> int:
    import torch

    return int(torch.load(path, weights_only=True)["step"])


# ----------------------------------------------------------------------------- hf-trainer


def save_hf_trainer(directory: Path, step: int) -> None:
    import torch
    from safetensors.torch import save_file

    folder = directory / f"checkpoint-{step}"
    folder.mkdir(exist_ok=True)
    save_file(
        {"w": torch.full((4, 4), float(step)), "b": torch.zeros(4)},
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    for name, value in (
        ("optimizer.pt", {"state": {}, "param_groups": [{"lr": 0.1}]}),
        ("scheduler.pt", {"last_epoch": step}),
        ("rng_state.pth", {"cpu": torch.random.get_rng_state()}),
    ):
        with open(folder / name, "wb") as f:
            torch.save(value, f)
            f.flush()
            os.fsync(f.fileno())
    state = {"global_step": step, "epoch": step / 100, "log_history": [], "max_steps": 1000}
    _write(folder / "trainer_state.json", json.dumps(state, indent=2).encode())
    _fsync_dir(folder)
    _fsync_dir(directory)


def resume_hf_trainer(path: str) -> int:
    return int(json.loads((Path(path) / "trainer_state.json").read_text())["global_step"])


# ----------------------------------------------------------------------------- llmc


def llmc_model_bytes(step: int, version: int = 3) -> bytes:
    header = [0] * 256
    header[0], header[1] = 20240326, version
    header[2:8] = LLMC_CONFIG
    width = 4 if version == 3 else 2
    return struct.pack("<256i", *header) + bytes([step % 256]) * (LLMC_N_PARAMS * width)


def llmc_state_bytes(
    step: int, rank: int = 0, processes: int = 1, master_weights: int = 1
) -> bytes:
    header = [0] * 256
    header[0], header[1], header[2], header[3], header[4] = (
        20240527,
        1,
        processes,
        rank,
        master_weights,
    )
    header[10] = step
    return struct.pack("<256i", *header) + bytes(4 * (2 + master_weights) * LLMC_N_PARAMS)


def save_llmc(directory: Path, step: int) -> None:
    _write(directory / f"model_{step:08d}.bin", llmc_model_bytes(step))
    _write(directory / f"state_{step:08d}_00000.bin", llmc_state_bytes(step))
    with open(directory / f"DONE_{step:08d}", "w"):
        pass
    _fsync_dir(directory)


def resume_llmc(path: str) -> int:
    step = int(Path(path).name.split("_")[1])
    with open(Path(path).parent / f"state_{step:08d}_00000.bin", "rb") as f:
        return struct.unpack("<256i", f.read(1024))[10]  # type: ignore[no-any-return]


SAVERS = {"torch-pt": save_torch_pt, "hf-trainer": save_hf_trainer, "llmc": save_llmc}
RESUMERS = {"torch-pt": resume_torch_pt, "hf-trainer": resume_hf_trainer, "llmc": resume_llmc}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--format", choices=sorted(SAVERS), required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--dt", type=float, default=0.01)
    parser.add_argument("--crash-at", type=int, default=None)
    args = parser.parse_args()
    directory = Path.cwd() / "checkpoints"
    directory.mkdir(exist_ok=True)
    save = SAVERS[args.format]
    step = 0
    resume = os.environ.get("TRAINWARDEN_RESUME")
    if resume:
        step = RESUMERS[args.format](resume)
        print(f"resumed from {resume} at step {step}", flush=True)
    else:
        print("fresh start", flush=True)
    requests = {"save": False, "stop": False}
    saved = step

    def on_signal(signum: int, _frame: object) -> None:
        requests["stop" if signum == signal.SIGTERM else "save"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    while step < args.steps and not requests["stop"]:
        step += 1
        time.sleep(args.dt)
        if args.crash_at == step:
            print(f"crashing at step {step}", flush=True)
            return 3
        print(f"step: {step}, loss: {5.0 - 0.001 * step:.6f}, dt: {args.dt}", flush=True)
        if step % args.save_every == 0 or step == args.steps or requests["save"]:
            requests["save"] = False
            save(directory, step)
            saved = step
    if requests["stop"] and saved != step:
        save(directory, step)
    return 0


# ----------------------------------------------------------------------------- the daemon test


def daemon_scenario(
    tmp_path: Path,
    fmt: Any,
    unit_step: Callable[[str], int | None],
    corrupt: Callable[[Path, int], None],
    reason: str,
) -> None:
    """The retention and fallback rules under the real daemon, for one checkpoint format.

    First a fresh run to step 50 with keep_last = 2 must end with exactly the units of
    steps 40 and 50: every file of 10, 20 and 30 deleted, nothing half-removed. Then its
    checkpoints move to a new run directory with unit 50 damaged: the daemon must
    quarantine 50 whole at start-up and resume from 40 (TRAINWARDEN_RESUME names it).
    `fmt` is the format plugin; `unit_step` maps any name in the checkpoint folder to the
    step of the unit it belongs to.
    """
    from tests.support import PYTHON, journal, make_run, running_daemon, wait_for

    def configure(run_dir: Path, steps: int) -> None:
        command = [
            PYTHON,
            str(Path(__file__).resolve()),
            "--format",
            fmt.name,
            "--steps",
            str(steps),
        ]
        make_run(
            run_dir,
            command,
            run={"name": run_dir.name},
            trainer={"stop_timeout_s": 30.0, "total_steps": steps},
            checkpoints={"format": fmt.name, "keep_last": 2},
            restart={"backoff_initial_s": 0.0, "backoff_max_s": 1.0, "stall_timeout_s": 60.0},
            # The two kept span a spike rollback's reach: retention keeps nothing more.
            divergence={"rollback_steps": 10},
        )

    def units(directory: Path) -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        for entry in sorted(os.listdir(directory)):
            if entry == "quarantine":
                continue
            step = unit_step(entry)
            assert step is not None, f"unexpected entry {entry} in {directory}"
            found.setdefault(step, []).append(entry)
        return found

    def assert_whole(directory: Path, size: int) -> None:
        for step, entries in units(directory).items():
            assert len(entries) == size, f"unit {step} is not whole: {entries}"
            (main,) = [e for e in entries if fmt.step_of(directory / e) is not None]
            assert fmt.verify(directory / main).step == step

    fresh = tmp_path / "fresh"
    configure(fresh, 50)
    with running_daemon(fresh) as daemon:
        daemon.wait_state("finished", timeout=180)
        wait_for(
            lambda: sorted(units(fresh / "checkpoints")) == [40, 50],
            120,
            what=f"units 40 and 50 only: {units(fresh / 'checkpoints')}",
        )
    records = journal(fresh)
    assert sorted(r["step"] for r in records if r["kind"] == "delete") == [10, 20, 30]
    assert not [r for r in records if r["kind"] in ("quarantine", "crash")]
    unit_size = len(units(fresh / "checkpoints")[50])
    assert_whole(fresh / "checkpoints", unit_size)

    moved = tmp_path / "moved"
    configure(moved, 60)
    directory = moved / "checkpoints"
    shutil.copytree(fresh / "checkpoints", directory)
    damaged = units(directory)[50]
    corrupt(directory, 50)
    with running_daemon(moved) as daemon:
        daemon.wait_state("finished", timeout=180)
        wait_for(lambda: 60 in units(directory), 120, what="the checkpoint of step 60")
    records = journal(moved)
    quarantined = [r for r in records if r["kind"] == "quarantine"]
    assert [r["step"] for r in quarantined] == [50]
    assert reason in quarantined[0]["reason"]
    assert sorted(os.listdir(directory / "quarantine")) == sorted(damaged)
    spawn = next(r for r in records if r["kind"] == "spawn")
    assert spawn["resume"]["step"] == 40
    resumed = directory / spawn["resume"]["name"]
    assert unit_step(resumed.name) == 40
    assert f"resumed from {resumed} at step 40" in (moved / "training.log").read_text()
    assert_whole(directory, unit_size)
    assert not [r for r in records if r["kind"] == "crash"]


if __name__ == "__main__":
    sys.exit(main())
