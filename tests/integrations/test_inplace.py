"""In-place trainers under the real daemon: a trainer that knows nothing of trainwarden
overwrites checkpoints/ckpt.pt with a plain (not atomic) torch.save every few iterations
and resumes only from ckpt.pt when given --resume. The daemon snapshots each verified
version, puts the chosen snapshot back before every restart, and so loses no more than
the steps since the newest snapshot, also through kills in the middle of torch.save."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    PYTHON,
    belongs_to_run,
    journal,
    make_run,
    running_daemon,
    trainer_pid,
    wait_for,
)

torch = pytest.importorskip("torch")

# The trainer, as its user wrote it: no trainwarden, no signals, no atomic save.
INPLACE_TRAINER = r"""
import argparse, os, sys, time
import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--save-every", type=int, required=True)
p.add_argument("--resume", action="store_true")
p.add_argument("--pad", type=int, default=2000, help="tensors of 2000 floats, to slow the save")
p.add_argument("--tear-at", type=int, default=0, help="once: write half a ckpt.pt and die")
p.add_argument("--sleep", type=float, default=0.03)
args = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
iter_num = 0
os.makedirs("checkpoints", exist_ok=True)
if args.resume:
    ckpt = torch.load("checkpoints/ckpt.pt", weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    iter_num = ckpt["iter_num"]
    print(f"resumed from iter {iter_num}", flush=True)

def batch(i):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(16, 8, generator=g)
    return x, x.flip(1)

pad = [torch.zeros(2000) for _ in range(args.pad)]
while iter_num < args.steps:
    x, y = batch(iter_num)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    iter_num += 1
    print(f"iter {iter_num}: loss {loss.item():.6f}, time 1.00ms", flush=True)
    if iter_num % args.save_every == 0:
        ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                "iter_num": iter_num, "pad": pad}
        if iter_num == args.tear_at and not os.path.exists("torn-once"):
            open("torn-once", "w").close()
            torch.save(ckpt, "whole.pt")
            data = open("whole.pt", "rb").read()
            with open("checkpoints/ckpt.pt", "wb") as f:
                f.write(data[: len(data) // 2])
            os._exit(1)
        torch.save(ckpt, "checkpoints/ckpt.pt")
    time.sleep(args.sleep)
torch.save({"model": model.state_dict()}, "final.pt")
"""

ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def in_place_run(
    run_dir: Path, script: str, args: tuple[str, ...], checkpoints: dict[str, Any], parser: str
) -> Path:
    """A run of a trainer written by the test that rewrites its checkpoint in place and
    resumes from it only when given --resume; restarted at once, many times if need be."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train.py").write_text(script)
    return make_run(
        run_dir,
        [PYTHON, "train.py", *args],
        run={"name": run_dir.name},
        trainer={"resume_args": ["--resume"], "env": ENV, "stop_timeout_s": 30.0},
        checkpoints=checkpoints,
        restart={
            "backoff_initial_s": 0.0,
            "backoff_max_s": 0.5,
            "max_restarts_without_progress": 20,
            "stall_timeout_s": 120.0,
        },
        telemetry={"parser": parser},
        # Saves every 10 steps: the newest two span a spike rollback's reach, so retention
        # keeps keep_last snapshots and no more.
        divergence={"rollback_steps": 10},
    )


def inplace_run(run_dir: Path, *args: str, keep_last: int = 3) -> Path:
    fixed = {"fixed": "ckpt.pt", "step_key": "iter_num", "keep_last": keep_last}
    return in_place_run(run_dir, INPLACE_TRAINER, args, {"format": "torch-pt", **fixed}, "nanogpt")


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def snapshot_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in records(run_dir, "snapshot_taken")]


def final_weights(run_dir: Path) -> dict[str, Any]:
    return torch.load(run_dir / "final.pt", weights_only=True)["model"]


def uninterrupted(tmp_path: Path, *args: str) -> dict[str, Any]:
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "train.py").write_text(INPLACE_TRAINER)
    subprocess.run(
        [PYTHON, "train.py", *args], cwd=alone, check=True, timeout=600, env={**os.environ, **ENV}
    )
    return final_weights(alone)


def writing_ckpt(pid: int, ckpt: Path) -> bool:
    """Whether process `pid` has ckpt.pt open (torch.save is writing it)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(ckpt):
                return True
        except OSError:
            continue
    return False


def live_trainer(run_dir: Path, previous: int | None) -> int:
    def found() -> int | None:
        pid = trainer_pid(run_dir)
        return pid if pid and pid != previous and belongs_to_run(pid, run_dir) else None

    return wait_for(found, 120, 0.01, what="a new trainer")


def kill_at_random_and_in_saves(run_dir: Path, written: Path, kills: int, seed: int) -> int:
    """SIGKILL the trainer `kills` times: every other kill inside a save (while `written`
    is open for writing, once this start has saved a version), the others at random
    moments. Each restart must resume from the newest snapshot taken before its kill (or
    from one of a save that completed just before it). Returns the kills inside a save."""
    rng = random.Random(seed)
    in_save = 0
    pid: int | None = None
    for kill in range(kills):
        pid = live_trainer(run_dir, pid)
        resumed_from = (records(run_dir, "spawn")[-1]["resume"] or {}).get("step") or 0
        if kill % 2 == 0:
            wait_for(
                lambda r=resumed_from: max(snapshot_steps(run_dir), default=0) > r,
                120,
                what="a snapshot of this start",
            )
            wait_for(
                lambda p=pid: writing_ckpt(p, written) or not os.path.exists(f"/proc/{p}"),
                120,
                0.001,
                what=f"the trainer writing {written.name}",
            )
        else:
            time.sleep(rng.uniform(0.2, 2.5))
        during_save = writing_ckpt(pid, written)
        newest_before = max(snapshot_steps(run_dir), default=None)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            break  # it finished first
        in_save += during_save
        spawns = len(records(run_dir, "spawn"))
        spawn = wait_for(
            lambda n=spawns: (s := records(run_dir, "spawn"))[n:] and s[n],
            120,
            what="the restart's spawn",
        )
        resumed = (spawn["resume"] or {}).get("step")
        assert newest_before is None or resumed >= newest_before, (spawn, newest_before)
    return in_save


# Five SIGKILLs at random moments of a real torch run, then the run again uninterrupted:
# a soak (over a minute beside a busy loop), in the slow tier; .ci/run runs it.
@pytest.mark.slow
def test_kills_at_random_moments_and_in_torch_save_lose_no_snapshot(tmp_path: Path) -> None:
    args = ("--steps", "150", "--save-every", "10", "--sleep", "0.05")
    run_dir = inplace_run(tmp_path / "run", *args)
    ckpt = (run_dir / "checkpoints" / "ckpt.pt").resolve()
    with running_daemon(run_dir) as daemon:
        in_save = kill_at_random_and_in_saves(run_dir, ckpt, kills=5, seed=19)
        daemon.wait_state("finished", timeout=300)
        # The last snapshot may still be verified as the run finishes: retention follows it.
        wait_for(
            lambda: len(list((run_dir / "checkpoints").glob("ckpt_*.pt"))) <= 3,
            60,
            what="the last snapshot verified and retention after it",
        )
    assert in_save >= 2, f"only {in_save} kills landed inside torch.save"
    # A kill inside torch.save leaves a torn ckpt.pt: journaled, never snapshotted.
    assert records(run_dir, "fixed_write_rejected")
    restored = records(run_dir, "snapshot_restored")
    assert len(restored) >= 5
    assert final_weights(run_dir).keys()
    alone = uninterrupted(tmp_path, *args)
    for key, value in final_weights(run_dir).items():
        assert torch.equal(value, alone[key]), key
    # Retention keeps the newest keep_last snapshots; the last save is always among them.
    snapshots = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt_*.pt"))
    newest = sorted(set(snapshot_steps(run_dir)))[-3:]
    assert newest[-1] == 150
    assert snapshots == [f"ckpt_{s:06d}.pt" for s in newest]


def test_a_torn_ckpt_pt_at_restart_is_replaced_by_the_snapshot(tmp_path: Path) -> None:
    run_dir = inplace_run(
        tmp_path / "run",
        *("--steps", "40", "--save-every", "10", "--tear-at", "30", "--pad", "200"),
        *("--sleep", "0.1"),
        keep_last=2,
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=300)
    rejected = records(run_dir, "fixed_write_rejected")
    assert rejected and "ckpt.pt" in rejected[0]["reason"]
    kinds = [r["kind"] for r in journal(run_dir)]
    before_crash = journal(run_dir)[: kinds.index("crash")]
    newest = max(r["step"] for r in before_crash if r["kind"] == "snapshot_taken")
    assert newest == 20  # the save at 30 was the torn one
    restored = records(run_dir, "snapshot_restored")
    assert [r["step"] for r in restored] == [newest]
    assert [r["resume"]["step"] for r in records(run_dir, "spawn") if r["resume"]] == [newest]
    assert f"resumed from iter {newest}" in (run_dir / "training.log").read_text()
    assert snapshot_steps(run_dir)[-2:] == [30, 40]
    # Retention keeps keep_last snapshots; the fixed file stays the trainer's.
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == [".snapshots", "ckpt.pt", "ckpt_000030.pt", "ckpt_000040.pt"]


def test_a_verified_ckpt_pt_found_at_start_is_resumed_from_not_overwritten(
    tmp_path: Path,
) -> None:
    run_dir = inplace_run(tmp_path / "run", "--steps", "40", "--save-every", "10")
    # What a run before the daemon left: ckpt.pt at iter 30 (the "600 -> 50").
    subprocess.run(
        [PYTHON, "train.py", "--steps", "30", "--save-every", "10", "--pad", "1"],
        cwd=run_dir,
        check=True,
        timeout=300,
        env={**os.environ, **ENV},
    )
    (run_dir / "final.pt").unlink()
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=300)
    assert snapshot_steps(run_dir)[0] == 30
    assert [r["resume"]["step"] for r in records(run_dir, "spawn")][:1] == [30]
    assert "resumed from iter 30" in (run_dir / "training.log").read_text()


def test_a_torn_ckpt_pt_at_a_fresh_start_goes_to_quarantine(tmp_path: Path) -> None:
    run_dir = inplace_run(tmp_path / "run", "--steps", "20", "--save-every", "10", "--pad", "1")
    (run_dir / "checkpoints").mkdir()
    torn = b"PK\x03\x04 half a torch.save"
    (run_dir / "checkpoints" / "ckpt.pt").write_bytes(torn)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=300)
    assert records(run_dir, "fixed_write_rejected")
    assert (run_dir / "checkpoints" / "quarantine" / "ckpt.pt").read_bytes() == torn
    first = records(run_dir, "spawn")[0]
    assert first["resume"] is None
    # Moved by the start the policy made again, before that start's fork; one record.
    (moved,) = records(run_dir, "quarantine")
    assert (moved["step"], moved["name"], moved["moved"]) == (None, "ckpt.pt", ["ckpt.pt"])
    kinds = [r["kind"] for r in journal(run_dir)]
    assert kinds.index("quarantine") < kinds.index("spawn")
    assert snapshot_steps(run_dir) == [10, 20]


# ------------------------------------------------------------------ a fixed folder

# A trainer that overwrites one folder, checkpoints/latest/, with plain writes: the weights
# and optimizer moments (model.safetensors, written in chunks like a slow disk would), then
# trainer_state.json last; --resume loads only that folder.
FOLDER_TRAINER = r"""
import argparse, json, os, time
import torch
from safetensors.torch import load, save

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--save-every", type=int, required=True)
p.add_argument("--resume", action="store_true")
p.add_argument("--pad", type=int, default=1 << 20, help="floats, to make the save take a while")
p.add_argument("--tear-at", type=int, default=0, help="once: write half the weights and die")
p.add_argument("--sleep", type=float, default=0.03)
args = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
folder = "checkpoints/latest"
step = 0
if args.resume:
    with open(f"{folder}/trainer_state.json") as f:
        step = json.load(f)["global_step"]
    with open(f"{folder}/model.safetensors", "rb") as f:
        tensors = load(f.read())
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state = opt.state_dict()
    state["state"] = {
        i: {"step": tensors[f"opt.{i}.step"], "exp_avg": tensors[f"opt.{i}.exp_avg"],
            "exp_avg_sq": tensors[f"opt.{i}.exp_avg_sq"]}
        for i in range(len(list(model.parameters())))
    }
    opt.load_state_dict(state)
    print(f"resumed from step {step}", flush=True)

def batch(i):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(16, 8, generator=g)
    return x, x.flip(1)

def write_in_place(path, data, chunks=64):
    with open(path, "wb") as f:
        size = -(-len(data) // chunks)
        for at in range(0, len(data), size):
            f.write(data[at : at + size])
            f.flush()
            time.sleep(0.002)

pad = torch.zeros(args.pad)
while step < args.steps:
    x, y = batch(step)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    print(f"step: {step}, loss: {loss.item():.6f}, dt: 0.001", flush=True)
    if step % args.save_every == 0:
        os.makedirs(folder, exist_ok=True)
        tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
        for i, s in opt.state_dict()["state"].items():
            tensors.update({f"opt.{i}.{k}": v for k, v in s.items()})
        tensors["pad"] = pad
        data = save(tensors)
        if step == args.tear_at and not os.path.exists("torn-once"):
            open("torn-once", "w").close()
            with open(f"{folder}/model.safetensors", "wb") as f:
                f.write(data[: len(data) // 2])
            os._exit(1)
        write_in_place(f"{folder}/model.safetensors", data)
        write_in_place(f"{folder}/trainer_state.json", json.dumps({"global_step": step}).encode())
    time.sleep(args.sleep)
torch.save(model.state_dict(), "final.pt")
"""


def folder_run(run_dir: Path, *args: str, keep_last: int = 3) -> Path:
    checkpoints = {
        "format": "hf-trainer",
        "options": {"required_files": []},
        "fixed": "latest",
        "fixed_commit_file": "trainer_state.json",
        "step_key": "global_step",
        "keep_last": keep_last,
    }
    return in_place_run(run_dir, FOLDER_TRAINER, args, checkpoints, "step-line")


def folder_final(run_dir: Path) -> dict[str, Any]:
    return torch.load(run_dir / "final.pt", weights_only=True)


# Five SIGKILLs at random moments of a real torch run, then the run again uninterrupted:
# a soak (over a minute beside a busy loop), in the slow tier; .ci/run runs it.
@pytest.mark.slow
def test_kills_while_a_fixed_folder_is_rewritten_lose_no_snapshot(tmp_path: Path) -> None:
    args = ("--steps", "120", "--save-every", "10", "--sleep", "0.05")
    run_dir = folder_run(tmp_path / "run", *args)
    weights = (run_dir / "checkpoints" / "latest" / "model.safetensors").resolve()
    with running_daemon(run_dir) as daemon:
        in_save = kill_at_random_and_in_saves(run_dir, weights, kills=5, seed=23)
        daemon.wait_state("finished", timeout=300)
        # The last snapshot may still be verified as the run finishes: retention follows it.
        wait_for(
            lambda: any(r["step"] == 120 for r in records(run_dir, "checkpoint")),
            60,
            what="the last snapshot verified",
        )
    assert in_save >= 2, f"only {in_save} kills landed inside the folder's save"
    # Every restart put a whole snapshot folder back over the torn one it found.
    restored = records(run_dir, "snapshot_restored")
    assert len(restored) >= 5
    log = (run_dir / "training.log").read_text()
    for record in restored:
        assert f"resumed from step {record['step']}" in log
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "train.py").write_text(FOLDER_TRAINER)
    subprocess.run(
        [PYTHON, "train.py", *args], cwd=alone, check=True, timeout=600, env={**os.environ, **ENV}
    )
    uninterrupted = folder_final(alone)
    for key, value in folder_final(run_dir).items():
        assert torch.equal(value, uninterrupted[key]), key
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    newest = sorted(set(snapshot_steps(run_dir)))[-3:]
    assert newest[-1] == 120
    assert names == [".snapshots", *sorted(f"checkpoint-{s}" for s in newest), "latest"]


def test_a_torn_fixed_folder_at_restart_is_replaced_by_the_snapshot(tmp_path: Path) -> None:
    run_dir = folder_run(
        tmp_path / "run",
        *("--steps", "40", "--save-every", "10", "--tear-at", "30", "--pad", "1000"),
        *("--sleep", "0.1"),
        keep_last=2,
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=300)
    kinds = [r["kind"] for r in journal(run_dir)]
    before_crash = journal(run_dir)[: kinds.index("crash")]
    assert [r["step"] for r in before_crash if r["kind"] == "snapshot_taken"] == [10, 20]
    assert [r["step"] for r in records(run_dir, "snapshot_restored")] == [20]
    assert [r["resume"]["step"] for r in records(run_dir, "spawn") if r["resume"]] == [20]
    assert "resumed from step 20" in (run_dir / "training.log").read_text()
    assert snapshot_steps(run_dir)[-2:] == [30, 40]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == [".snapshots", "checkpoint-30", "checkpoint-40", "latest"]
