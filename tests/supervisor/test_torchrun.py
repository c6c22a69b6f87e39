"""torchrun under the real daemon (CPU, gloo): which process each signal_target reaches.

torchrun's agent starts every worker in a session of its own and, by default, handles
only SIGTERM, SIGINT, SIGHUP and SIGQUIT. So:
- "children" (use this for torchrun): SIGUSR1 and SIGTERM go straight to the workers; a
  save reaches every rank, and the agent carries on untouched;
- "main": the agent gets SIGUSR1, which it does not handle: it dies of it, the daemon
  records a crash, and stops the workers it leaves behind (they are the dead start's);
- "group" (the default) is no better for SIGUSR1: the workers are not in the agent's group.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import (
    PYTHON,
    belongs_to_run,
    checkpoints,
    journal,
    kill_quietly,
    make_run,
    pid_alive,
    running_daemon,
    wait_for,
)
from trainwarden.supervisor.errors import CommandRefused

pytestmark = pytest.mark.timeout(240)

WORKER = Path(__file__).resolve().parent.parent / "torchrun_worker.py"


def _distributed_unavailable() -> str | None:
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return f"torch.distributed cannot be imported: {exc}"
    if not dist.is_available():
        return "this torch build has no torch.distributed"
    if not dist.is_gloo_available():
        return "this torch build has no gloo backend"
    return None


if (reason := _distributed_unavailable()) is not None:
    pytest.skip(reason, allow_module_level=True)


def torchrun_run(
    run_dir: Path,
    signal_target: str,
    *extra: str,
    stop_timeout_s: float = 60.0,
    backoff_s: float = 300.0,
) -> Path:
    command = [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(WORKER), "--steps", "100000", "--save-every", "100000", "--dt", "0.05", *extra,
    ]  # fmt: skip
    return make_run(
        run_dir,
        command,
        run={"name": run_dir.name},
        trainer={"signal_target": signal_target, "stop_timeout_s": stop_timeout_s},
        restart={
            "backoff_initial_s": backoff_s,
            "backoff_max_s": backoff_s,
            "stall_timeout_s": 120.0,
        },
    )


def worker_pids(run_dir: Path) -> list[int]:
    folder = run_dir / "workers"
    return [int(p.read_text()) for p in sorted(folder.glob("rank*.pid"))] if folder.exists() else []


def signals_seen(run_dir: Path, rank: int) -> str:
    path = run_dir / "signals" / f"rank{rank}.log"
    return path.read_text() if path.exists() else ""


def kill_workers(run_dir: Path) -> None:
    for pid in worker_pids(run_dir):
        if belongs_to_run(pid, run_dir):
            kill_quietly(pid, group=False)


def test_children_target_saves_on_every_rank_and_spares_the_agent(tmp_path: Path):
    run_dir = torchrun_run(tmp_path / "run", "children")
    try:
        with running_daemon(run_dir) as daemon:
            wait_for(
                lambda: (daemon.status().get("step") or 0) >= 5, 120, 0.2, what="steps from rank 0"
            )
            agent = daemon.status()["trainer_pid"]
            workers = wait_for(lambda: len(pids := worker_pids(run_dir)) == 2 and pids, 30)
            assert agent not in workers

            saved = daemon.request("save", wait=True, timeout_s=60)
            assert checkpoints(run_dir) == [saved["step"]]
            for rank in (0, 1):
                assert "SIGUSR1" in signals_seen(run_dir, rank), f"rank {rank} got no SIGUSR1"
            status = daemon.status()
            assert status["trainer_pid"] == agent and pid_alive(agent)
            assert all(pid_alive(pid) for pid in workers)
            wait_for(
                lambda: daemon.status()["step"] >= saved["step"] + 3, 60, what="training continues"
            )
            assert status["restarts"] == 0

            result = daemon.request("stop", timeout=120)
            assert result["state"] == "stopped"
            stopped = next(r for r in journal(run_dir) if r["kind"] == "trainer_stopped")
            assert stopped["returncode"] == 0, "the agent exits 0 once its workers saved and exited"
            assert checkpoints(run_dir)[-1] == stopped["last_step"]
            for rank in (0, 1):
                assert "SIGTERM" in signals_seen(run_dir, rank)
            assert not pid_alive(agent) and not any(pid_alive(pid) for pid in workers)
            assert not [r for r in journal(run_dir) if r["kind"] == "crash"]
    finally:
        kill_workers(run_dir)


def test_main_target_save_is_refused_since_the_agent_would_die_of_sigusr1(tmp_path: Path):
    run_dir = torchrun_run(tmp_path / "run", "main")
    try:
        with running_daemon(run_dir) as daemon:
            wait_for(
                lambda: (daemon.status().get("step") or 0) >= 5, 120, 0.2, what="steps from rank 0"
            )
            agent = daemon.status()["trainer_pid"]
            workers = wait_for(lambda: len(pids := worker_pids(run_dir)) == 2 and pids, 30)
            # The agent catches SIGTERM but not SIGUSR1, whose default action would kill it.
            assert daemon.status()["handles"] == ["SIGTERM"]
            with pytest.raises(CommandRefused) as refused:
                daemon.request("save")
            assert refused.value.code == "unsupported"
            assert "does not handle SIGUSR1" in str(refused.value)
            step = daemon.status()["step"]
            wait_for(lambda: daemon.status()["step"] >= step + 3, 60, what="training continues")
            assert not [r for r in journal(run_dir) if r["kind"] in ("signal", "crash")]
            assert signals_seen(run_dir, 0) == signals_seen(run_dir, 1) == ""
            assert pid_alive(agent) and all(pid_alive(pid) for pid in workers)
    finally:
        kill_workers(run_dir)


def test_sigkill_after_the_grace_period_leaves_no_worker_behind(tmp_path: Path):
    run_dir = torchrun_run(tmp_path / "run", "children", "--ignore-term", stop_timeout_s=2.0)
    try:
        with running_daemon(run_dir) as daemon:
            wait_for(lambda: (daemon.status().get("step") or 0) >= 3, 120, 0.2, what="steps")
            workers = wait_for(lambda: len(pids := worker_pids(run_dir)) == 2 and pids, 30)
            # The workers ignore SIGTERM (not caught): only a forced stop goes ahead.
            result = daemon.request("stop", timeout=60, force=True)
            assert result["outcome"] == "killed"
            signals = [r["signal"] for r in journal(run_dir) if r["kind"] == "signal"]
            assert signals == ["SIGTERM", "SIGKILL"]
            wait_for(lambda: not any(pid_alive(pid) for pid in workers), 10, what="workers gone")
    finally:
        kill_workers(run_dir)


def test_a_killed_agents_workers_are_gone_before_the_next_start_and_their_lines_not_counted(
    tmp_path: Path,
):
    # Workers that ignore SIGTERM keep training (and logging) until the daemon SIGKILLs them.
    run_dir = torchrun_run(
        tmp_path / "run", "children", "--ignore-term", stop_timeout_s=3.0, backoff_s=8.0
    )
    workers: list[int] = []
    try:
        with running_daemon(run_dir) as daemon:
            wait_for(lambda: (daemon.status().get("step") or 0) >= 5, 120, 0.2, what="steps")
            agent = daemon.status()["trainer_pid"]
            workers = wait_for(lambda: len(pids := worker_pids(run_dir)) == 2 and pids, 30)
            assert belongs_to_run(agent, run_dir)
            kill_quietly(agent, group=False)
            crash = wait_for(lambda: next(iter(kinds(run_dir, "crash")), None), 60, what="crash")
            (leftovers,) = wait_for(
                lambda: kinds(run_dir, "leftover_processes"), 60, what="the workers stopped"
            )
            ended = {p["pid"]: p for p in leftovers["processes"]}
            assert set(workers) <= set(ended)
            assert all(ended[pid]["signal"] == "SIGKILL" for pid in workers)
            assert not any(pid_alive(pid) for pid in workers)
            # The orphans kept logging for the grace period: journaled, never decided on.
            status = daemon.status()
            assert status["state"] == "backoff"
            assert status["step"] == crash["last_step"]
            (stray,) = wait_for(lambda: kinds(run_dir, "stray_output"), 60, what="stray_output")
            assert stray["step_lines"] > 0
            new = wait_for(
                lambda: (pids := worker_pids(run_dir)) and not set(pids) & set(workers) and pids,
                120,
                what="the new start's workers",
            )
            assert len(new) == 2
            records = [r["kind"] for r in journal(run_dir)]
            assert records.index("leftover_processes") < len(records) - 1 - records[::-1].index(
                "trainer_started"
            )
    finally:
        kill_workers(run_dir)
        for pid in workers:  # the old start's, whose pid files the new start overwrote
            if belongs_to_run(pid, run_dir):
                kill_quietly(pid, group=False)


def kinds(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in journal(run_dir) if r["kind"] == kind]
