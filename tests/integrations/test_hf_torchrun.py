"""A real `transformers.Trainer` with the shipped callback on 2 CPU workers under torchrun
(gloo, DDP), under the real daemon with `signal_target = "children"`: a save or a stop, even
one that reached a single rank, makes both ranks save at the same step.

The script is test_hf's, with its record hook on: each rank appends `save STEP` at each save
and `end STEP` when training ends to seen/rank<R>.log, and writes its pid to rank<R>.pid.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import orjson
import pytest

from tests.integrations.ranks import agreed, workers
from tests.integrations.test_hf import OFFLINE, TRAIN_SCRIPT, spawns, trainer_state, wait_step
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


def torchrun_hf_run(run: Path) -> Path:
    run.mkdir(parents=True)
    (run / "train.py").write_text(TRAIN_SCRIPT)
    env = {
        **OFFLINE,
        "PYTHONPATH": str(REPO),
        "HF_DDP_BACKEND": "gloo",
        "HF_RECORD_DIR": "seen",
        "HF_STEPS": "100000",
        "HF_SAVE_STEPS": "100000",
        "HF_STEP_SLEEP_S": "0.1",
    }
    command = [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(run / "train.py"),
    ]  # fmt: skip
    return make_run(
        run,
        command,
        run={"name": run.name},
        trainer={"signal_target": "children", "env": env, "stop_timeout_s": 120.0},
        checkpoints={"format": "hf-trainer", "keep_last": 10},
        telemetry={"parser": "hf-trainer", "logging_steps": 1},
        restart={"backoff_initial_s": 300.0, "backoff_max_s": 300.0, "stall_timeout_s": 300.0},
    )


def complete(run: Path, step: int) -> bool:
    """checkpoint-<step> holds the Trainer's state for that step and both ranks' RNG."""
    folder = run / "checkpoints" / f"checkpoint-{step}"
    return (
        (folder / "trainer_state.json").is_file()
        and trainer_state(folder)["global_step"] == step
        and all((folder / f"rng_state_{rank}.pth").is_file() for rank in (0, 1))
    )


def hf_checkpoints(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("checkpoint-*"))


def test_both_ranks_save_and_stop_at_the_same_step(tmp_path: Path):
    run = torchrun_hf_run(tmp_path / "run")
    try:
        with running_daemon(run) as daemon:
            first = wait_step(daemon, 3)
            agent = first["trainer_pid"]
            pids = wait_for(lambda: len(p := workers(run)) == 2 and p, 120, what="workers")
            assert agent not in pids

            # save --wait: SIGUSR1 reaches both workers; one checkpoint, training goes on.
            saved = daemon.request("save", wait=True, timeout=300.0)
            (one,) = wait_for(lambda: agreed(run, 1), 120, what="both ranks saw the save")
            assert one == f"save {saved['step']}"
            assert complete(run, saved["step"])
            later = wait_step(daemon, saved["step"] + 3)
            assert later["trainer_pid"] == agent
            assert hf_checkpoints(run) == [saved["step"]]

            # A SIGUSR1 only rank 1 gets: rank 0 saves with it at the same step end.
            assert belongs_to_run(pids[1], run)
            os.kill(pids[1], signal.SIGUSR1)
            _, two = wait_for(lambda: agreed(run, 2), 120, what="rank 0 joined rank 1's save")
            step = int(two.split()[1])
            assert two == f"save {step}" and step > saved["step"]
            wait_for(lambda: complete(run, step), 60, what=f"checkpoint-{step}")
            wait_step(daemon, step + 2)

            result = daemon.request("stop", timeout=300.0)
            assert result["state"] == "stopped"
            assert result["outcome"] == "saved" and result["steps_lost"] == 0, result
            stopped = [r for r in journal(run) if r["kind"] == "trainer_stopped"]
            assert stopped[-1]["returncode"] == 0, "the agent exits 0 once both workers did"
            *_, last_save, end = agreed(run, 4)
            last = int(end.split()[1])
            assert (last_save, end) == (f"save {last}", f"end {last}")
            assert complete(run, last) and hf_checkpoints(run)[-1] == last
            assert last >= stopped[-1]["last_step"] > step
            assert (run / "training.log").read_text().count("train() returned") == 2
            # Rank 0 alone prints, one line per step, each with its own step.
            logged = [
                orjson.loads(line)["step"]
                for line in (run / ".loss.json").read_bytes().splitlines()
            ]
            assert logged == list(range(1, stopped[-1]["last_step"] + 1))
            assert not pid_alive(agent) and not any(pid_alive(pid) for pid in pids)
            assert not [r for r in journal(run) if r["kind"] == "crash"]
            assert len(spawns(run)) == 1
    finally:
        if (run / "seen").exists():
            for pid in workers(run):
                if belongs_to_run(pid, run):
                    kill_quietly(pid, group=False)
