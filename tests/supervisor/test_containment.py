"""Containment with real processes: nothing a trainer start began outlives it, and a daemon
killed at any instant around a spawn never leaves two trainers running.

tests/forking_trainer.py double-forks a helper (setsid between the forks), which is then
in no process group or session of the trainer's and has lost its parent: only the
daemon's subreaper and the start's marker still tie it to the start.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import (
    PYTHON,
    DaemonProcess,
    belongs_to_run,
    journal,
    kill_quietly,
    make_run,
    pid_alive,
    running_daemon,
    scripted_run,
    wait_for,
)
from tests.support.procs import argv_of

pytestmark = pytest.mark.timeout(300)

FORKING_TRAINER = Path(__file__).resolve().parent.parent / "forking_trainer.py"
SCRIPTED = b"scripted_trainer.py"
FAULT_HOOKS = Path(__file__).resolve().parent / "fault_hooks"


def forking_run(run_dir: Path, *args: str, stop_timeout_s: float = 10.0) -> Path:
    return make_run(
        run_dir,
        [PYTHON, str(FORKING_TRAINER), *args],
        trainer={"stop_timeout_s": stop_timeout_s},
        restart={"backoff_initial_s": 0.0, "backoff_max_s": 1.0, "stall_timeout_s": 120.0},
    )


def helper_pid(run_dir: Path, seg: int, timeout: float = 30.0) -> int:
    path = run_dir / "helpers" / f"seg{seg}.pid"
    pid: int = wait_for(lambda: path.exists() and int(path.read_text()), timeout, what=path.name)
    return pid


def kill_helpers(run_dir: Path) -> None:
    for path in (run_dir / "helpers").glob("seg*.pid"):
        pid = int(path.read_text())
        if belongs_to_run(pid, run_dir):
            kill_quietly(pid, group=False)


def records(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def killed_pids(run_dir: Path) -> set[int]:
    return {p["pid"] for r in records(run_dir, "leftover_processes") for p in r["processes"]}


def test_a_crashed_trainers_helper_is_gone_before_the_next_start(tmp_path: Path):
    run_dir = forking_run(tmp_path / "run", "--crash-at", "20")
    try:
        with running_daemon(run_dir):
            first = helper_pid(run_dir, 1)
            second = helper_pid(run_dir, 2)
            assert not pid_alive(first), "the first start's helper outlived its crash"
            assert first in killed_pids(run_dir)
            kinds = [r["kind"] for r in journal(run_dir)]
            # The helper was stopped (and journaled) before the second start's spawn.
            assert (
                kinds.index("leftover_processes")
                < [i for i, k in enumerate(kinds) if k == "spawn"][1]
            )
            assert second != first
    finally:
        kill_helpers(run_dir)


def test_an_orphaned_helper_is_adopted_by_the_daemon_and_reaped_when_it_exits(tmp_path: Path):
    run_dir = forking_run(tmp_path / "run", "--helper-lifetime", "1")
    try:
        with running_daemon(run_dir) as daemon:
            helper = helper_pid(run_dir, 1)
            ppid = run_dir / "helpers" / "seg1.ppid"
            adopter = wait_for(lambda: ppid.exists() and int(ppid.read_text()), 30, what="ppid")
            assert adopter == daemon.pid, "the subreaper adopts the trainer's orphans"
            # Exited on its own: reaped by the daemon, not left as its zombie.
            wait_for(lambda: not os.path.exists(f"/proc/{helper}"), 30, what="the helper reaped")
            assert daemon.status()["trainer_pid"], "the trainer itself runs on"
    finally:
        kill_helpers(run_dir)


def test_stop_leaves_no_helper(tmp_path: Path):
    run_dir = forking_run(tmp_path / "run")
    try:
        with running_daemon(run_dir) as daemon:
            helper = helper_pid(run_dir, 1)
            assert daemon.request("stop", timeout=60)["state"] == "stopped"
            (record,) = wait_for(
                lambda: records(run_dir, "leftover_processes"), 30, what="the helper stopped"
            )
            assert not pid_alive(helper)
            (ended,) = record["processes"]
            assert ended["pid"] == helper and ended["signal"] == "SIGTERM"
    finally:
        kill_helpers(run_dir)


def test_shutdown_kills_a_helper_that_ignores_sigterm_before_the_daemon_exits(tmp_path: Path):
    run_dir = forking_run(tmp_path / "run", "--stubborn-helper", stop_timeout_s=2.0)
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        helper = helper_pid(run_dir, 1)
        daemon.proc.terminate()  # type: ignore[union-attr]
        assert daemon.wait_exit(60) == 0
        assert not pid_alive(helper), "the helper outlived the daemon's shutdown"
        (ended,) = records(run_dir, "leftover_processes")[0]["processes"]
        assert ended["pid"] == helper and ended["signal"] == "SIGKILL"
        assert ended["ended"] == "killed by SIGKILL", "adopted by the subreaper, reaped by it"
    finally:
        daemon.cleanup()
        kill_helpers(run_dir)


def test_a_leftover_trainers_helper_is_stopped_by_the_next_daemon(tmp_path: Path):
    run_dir = forking_run(tmp_path / "run")
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        helper = helper_pid(run_dir, 1)
        daemon.kill()  # the trainer and its helper live on, orphaned
        assert pid_alive(helper)
        daemon.start()
        helper_pid(run_dir, 2)
        assert not pid_alive(helper)
        stopped = records(run_dir, "leftover_trainer_stopped")[0]
        assert helper in {p["pid"] for p in stopped["processes"]}
    finally:
        daemon.cleanup()
        kill_helpers(run_dir)


def test_a_shutdown_while_a_trainer_is_being_started_stops_it_and_the_run_stays_stopped(
    tmp_path: Path,
):
    """The request reaches the daemon while the start is under way (here a start that takes
    2 s before its fork): it is decided once the trainer's pid is known, so the shutdown
    stops that trainer, says so, and the next daemon keeps the run stopped. Before, it was
    decided without the pid: 'no trainer was running', the daemon exited and left the new
    trainer running, and the next daemon went on training."""
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    env = {
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(FAULT_HOOKS), os.environ.get("PYTHONPATH")) if p
        ),
        "TRAINWARDEN_TEST_PAUSE_SPAWN": "2",
    }
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        wait_for(lambda: records(run_dir, "spawn"), 30, 0.02, what="the start under way")
        assert daemon.status()["trainer_pid"] is None  # being started: no pid yet
        daemon.request("shutdown", timeout=60)
        assert daemon.wait_exit(60) == 0
        (started,) = records(run_dir, "trainer_started")
        assert not pid_alive(started["pid"]), "the trainer outlived the daemon's shutdown"
        (outcome,) = records(run_dir, "stop_outcome")
        assert outcome["outcome"] != "not_running", outcome
        daemon.start()
        assert daemon.wait_state("stopped", "running", timeout=60)["state"] == "stopped"
        assert len(records(run_dir, "spawn")) == 1
    finally:
        daemon.cleanup()


# ----------------------------------------------------------------------------- one trainer

POINTS = [
    "journal:spawn:before",
    "journal:spawn:after",
    "spawn:before",
    "spawn:after",
    "journal:trainer_started:before",
    "journal:trainer_started:after",
    "identity:before",
    "identity:after",
]
DELAYS = [0.0, 0.002, 0.005, 0.01, 0.03, 0.08, 0.2]


def dying_at(point: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(FAULT_HOOKS), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "TRAINWARDEN_TEST_DIE_AT": point}


def run_trainers(run_dir: Path) -> list[int]:
    """Live trainer processes of the run (the scripted trainer's main processes)."""
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    return [
        pid
        for pid in pids
        if any(a.endswith(SCRIPTED) for a in argv_of(pid)[:2]) and belongs_to_run(pid, run_dir)
    ]


def test_a_daemon_killed_anywhere_around_a_spawn_never_leaves_two_trainers(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000000", "--save-every", "100000000", "--dt", "0.05"
    )
    seen: set[int] = set()
    daemons: list[DaemonProcess] = []
    try:
        for case in POINTS + [f"delay:{d}" for d in DELAYS]:
            dying = DaemonProcess(run_dir, env=dying_at(case))
            daemons.append(dying)
            dying.start(wait=False)
            try:
                dying.wait_exit(60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{case}: the daemon was never killed")
            seen.update(run_trainers(run_dir))
            normal = DaemonProcess(run_dir)
            daemons.append(normal)
            normal.start()
            started = wait_for(lambda d=normal: d.status().get("trainer_pid"), 60, what="a trainer")
            seen.update(run_trainers(run_dir))
            trainers = run_trainers(run_dir)
            assert trainers == [started], f"killed at {case}: trainers {trainers}"
            normal.kill()  # its trainer lives on: the next daemon must find and stop it
    finally:
        for daemon in daemons:
            daemon.cleanup()
        for pid in seen | set(run_trainers(run_dir)):
            if belongs_to_run(pid, run_dir):
                kill_quietly(pid)
