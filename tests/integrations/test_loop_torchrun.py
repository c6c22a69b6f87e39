"""The nanoGPT-style loop under torchrun (2 CPU workers, gloo, DDP) with Signals(sync=True):
every rank acts on a save or a stop at the same iteration, including a rank that got no
signal, and rank 0's checkpoint is that iteration's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.integrations.ranks import agreed, workers
from tests.support import (
    PYTHON,
    REPO,
    belongs_to_run,
    journal,
    kill_quietly,
    make_run,
    pid_alive,
    running_daemon,
    wait_for,
)

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("this torch build has no gloo backend", allow_module_level=True)

pytestmark = pytest.mark.timeout(600)

LOOP = Path(__file__).resolve().parent / "nanogpt_loop.py"


# Two ranks read both flags six times; rank 1 alone gets SIGUSR1 before read 2 and SIGTERM
# before read 4, and rank 0 alone calls saved() after the read that reported the save.
RANKS = textwrap.dedent(
    """
    import json, os, signal, sys
    import torch.distributed as dist
    from trainwarden.integrations.loop import Signals

    signals = Signals(sync=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reads = []
    for i in range(6):
        if rank == 1 and i == 2:
            os.kill(os.getpid(), signal.SIGUSR1)
        if rank == 1 and i == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        save, stop = signals.save_requested, signals.stop_requested
        reads.append([save, stop])
        if save and rank == 0:
            signals.saved()
    dist.destroy_process_group()
    print(json.dumps(reads), flush=True)
    os._exit(0)  # past a gloo abort in the interpreter's finalization (see nanogpt_loop.py)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sync_gives_every_rank_the_answer_of_any_rank(tmp_path: Path):
    base = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TRAINWARDEN_RUN_DIR": str(tmp_path),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
    }
    ranks = [
        subprocess.Popen(
            [PYTHON, "-c", RANKS],
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [proc.communicate(timeout=300) for proc in ranks]
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    for proc, (_, err) in zip(ranks, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    reads = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    expected = [[False, False], [False, False], [True, False], [False, False], [False, True],
                [False, True]]  # fmt: skip
    assert reads[0] == reads[1] == expected, reads


def torchrun_loop_run(run_dir: Path) -> Path:
    command = [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(LOOP), "--max-iters", "100000", "--sleep", "0.1", "--record-dir", "seen",
    ]  # fmt: skip
    return make_run(
        run_dir,
        command,
        run={"name": run_dir.name},
        trainer={
            "signal_target": "children",
            "stop_timeout_s": 120.0,
            "env": {"PYTHONPATH": str(REPO)},
        },
        checkpoints={"format": "torch-pt", "keep_last": 10},
        telemetry={"parser": "nanogpt"},
        restart={"backoff_initial_s": 300.0, "backoff_max_s": 300.0, "stall_timeout_s": 300.0},
    )


def pt_checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:11]) for p in (run_dir / "checkpoints").glob("ckpt_??????.pt"))


def test_every_rank_saves_and_stops_at_the_same_iteration(tmp_path: Path):
    run_dir = torchrun_loop_run(tmp_path / "run")
    try:
        with running_daemon(run_dir) as daemon:
            wait_for(lambda: (daemon.status().get("step") or 0) >= 5, 240, 0.2, what="steps")
            agent = daemon.status()["trainer_pid"]
            pids = wait_for(lambda: len(p := workers(run_dir)) == 2 and p, 60, what="workers")
            assert agent not in pids

            saved = daemon.request("save", wait=True, timeout_s=120)
            (first,) = wait_for(lambda: agreed(run_dir, 1), 60, what="both ranks saw the save")
            iteration = int(first.split()[1])
            assert first == f"save {iteration}"
            assert saved["step"] == iteration in pt_checkpoints(run_dir)

            # A request only rank 1 gets: rank 0 learns of it at the same read and writes.
            assert belongs_to_run(pids[1], run_dir)
            os.kill(pids[1], signal.SIGUSR1)
            _, second = wait_for(lambda: agreed(run_dir, 2), 60, what="rank 0 joined rank 1")
            assert second.startswith("save ")
            wait_for(lambda: int(second.split()[1]) in pt_checkpoints(run_dir), 60)

            result = daemon.request("stop", timeout=180)
            assert result["state"] == "stopped"
            assert result["outcome"] == "saved" and result["steps_lost"] == 0, result
            stopped = next(r for r in journal(run_dir) if r["kind"] == "trainer_stopped")
            assert stopped["returncode"] == 0, "the agent exits 0 once both workers did"
            *_, last = agreed(run_dir, 3)
            assert last == f"stop {stopped['last_step'] + 1}"
            assert pt_checkpoints(run_dir)[-1] == stopped["last_step"] + 1
            assert not pid_alive(agent) and not any(pid_alive(pid) for pid in pids)
            assert not [r for r in journal(run_dir) if r["kind"] == "crash"]
    finally:
        if (run_dir / "seen").exists():
            for pid in workers(run_dir):
                if belongs_to_run(pid, run_dir):
                    kill_quietly(pid, group=False)
