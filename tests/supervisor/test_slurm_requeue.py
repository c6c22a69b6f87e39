"""A daemon in a Slurm job leaving before the limit, against the scripted trainer and an
`scontrol` on PATH that answers as Slurm does and writes down what it was asked: the
pre-timeout signal (or the end time drawing near) saves, requeues and exits 75; a save the
job's deadline cuts short is said and requeued anyway; a requeue Slurm refuses is said;
and the lease keeps a second job's daemon off a run another job's daemon holds."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.support import PYTHON, DaemonProcess, journal, scripted_run, wait_for
from tests.support.slurm import fake_scontrol

pytestmark = pytest.mark.timeout(120)

CLI = [PYTHON, "-m", "trainwarden.supervisor"]


def show_line(job: str, state: str, ends_in_s: float, requeue: int = 1) -> str:
    end = (datetime.now() + timedelta(seconds=ends_in_s)).replace(microsecond=0)
    return (
        f"JobId={job} JobName=train-gpt JobState={state} Reason=None Requeue={requeue} Restarts=0"
        f" TimeLimit=02:00:00 StartTime={(end - timedelta(hours=2)).isoformat()}"
        f" EndTime={end.isoformat()} Partition=gpu NodeList=node01"
    )


def fake_slurm(
    tmp_path: Path,
    ends_in_s: float = 3600.0,
    requeue_exit: int = 0,
    others: str = "",
    requeue: int = 1,
) -> tuple[dict[str, str], Path]:
    """`scontrol` on PATH: `show job -o 4242` prints a running job ending in `ends_in_s`,
    `requeue` exits `requeue_exit`; every call is written to the returned file. `others`:
    more `case` arms (shell) for other jobs."""
    asked = tmp_path / "asked"
    refused = "echo 'Requested operation is presently disabled' >&2"
    env = fake_scontrol(
        tmp_path / "bin",
        f'echo "$*" >> {asked}\n'
        'case "$*" in\n'
        f"  'show job -o 4242') echo '{show_line('4242', 'RUNNING', ends_in_s, requeue)}' ;;\n"
        f"  requeue*) {refused if requeue_exit else ':'}; exit {requeue_exit} ;;\n"
        f"{others}"
        "esac",
        SLURM_RESTART_COUNT="0",
    )
    return env, asked


def records(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def test_the_pre_timeout_signal_saves_requeues_and_exits_75(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--dt", "0.02", slurm={"act_before_end_s": 0}
    )
    env, asked = fake_slurm(tmp_path)
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        wait_for(lambda: records(run_dir, "slurm_job"), timeout=30, what="the job read")
        wait_for(lambda: (daemon.status().get("step") or 0) >= 15, timeout=60, what="steps")
        os.kill(daemon.pid, signal.SIGUSR1)
        assert daemon.wait_exit(60) == 75, daemon.stderr()
        assert "requeue 4242" in asked.read_text().splitlines()
        (asked_to,) = records(run_dir, "slurm_requeue_requested")
        assert asked_to["why"] == "SIGUSR1" and 3000 < asked_to["seconds_left"] <= 3590
        (outcome,) = records(run_dir, "stop_outcome")
        assert outcome["outcome"] == "saved" and outcome["steps_lost"] == 0, outcome
        (requeued,) = records(run_dir, "slurm_requeue")
        assert requeued["by"] == "scontrol" and requeued["job_id"] == "4242"
        # Journaled before Slurm is asked: Slurm kills the job once it takes the requeue.
        kinds = [r["kind"] for r in journal(run_dir)]
        assert kinds.index("stop_outcome") < kinds.index("slurm_requeue") == len(kinds) - 2
        assert journal(run_dir)[-1] == {**journal(run_dir)[-1], "kind": "daemon_exit", "code": 75}
        assert not (run_dir / ".trainwarden" / "lease.json").exists()
    finally:
        daemon.cleanup()


def test_without_the_signal_the_end_time_drawing_near_does_the_same(tmp_path: Path):
    # The job ends in 140 s; act_before_end_s 135: the daemon leaves about 5 s in.
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--dt", "0.02", slurm={"act_before_end_s": 135}
    )
    env, asked = fake_slurm(tmp_path, ends_in_s=140)
    daemon = DaemonProcess(run_dir, env)
    try:
        started = time.monotonic()
        daemon.start()
        assert daemon.wait_exit(60) == 75, daemon.stderr()
        assert time.monotonic() - started >= 3
        (asked_to,) = records(run_dir, "slurm_requeue_requested")
        assert asked_to["why"] == "end_time"
        # Asked twice before leaving: at the start, and again in case the end moved.
        assert asked.read_text().splitlines().count("show job -o 4242") == 2
        assert records(run_dir, "slurm_requeue")[0]["by"] == "scontrol"
    finally:
        daemon.cleanup()


def test_a_save_the_jobs_deadline_cuts_short_is_said_and_the_job_requeued_anyway(
    tmp_path: Path,
):
    # 16 s to the end, 10 of them kept for Slurm: 6 s for a save that takes 30.
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "100000",
        "--dt",
        "0.02",
        "--slow-save",
        "30",
        trainer={"stop_timeout_s": 60.0},
        slurm={"act_before_end_s": 0},
    )
    env, _ = fake_slurm(tmp_path, ends_in_s=16)
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        wait_for(lambda: records(run_dir, "slurm_job"), timeout=30, what="the job read")
        wait_for(lambda: (daemon.status().get("step") or 0) >= 5, timeout=60, what="steps")
        os.kill(daemon.pid, signal.SIGUSR1)
        assert daemon.wait_exit(60) == 75, daemon.stderr()
        (late,) = records(run_dir, "slurm_save_late")
        assert late["gave_up"] == "the trainer's save"
        (outcome,) = records(run_dir, "stop_outcome")
        assert outcome["outcome"] == "killed" and outcome["exit"] == "killed at the job's deadline"
        assert records(run_dir, "slurm_requeue")[0]["by"] == "scontrol"
    finally:
        daemon.cleanup()


def test_a_requeue_slurm_refuses_is_said_and_the_exit_still_asks_for_one(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--dt", "0.02", slurm={"act_before_end_s": 0}
    )
    env, _ = fake_slurm(tmp_path, requeue_exit=1)
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        wait_for(lambda: records(run_dir, "slurm_job"), timeout=30, what="the job read")
        os.kill(daemon.pid, signal.SIGUSR1)
        assert daemon.wait_exit(60) == 75
        (failed,) = records(run_dir, "slurm_requeue_failed")
        assert failed["error"] == "scontrol exited 1: Requested operation is presently disabled"
        # Said after the exit record it followed, and the exit said again: still the last.
        kinds = [r["kind"] for r in journal(run_dir)]
        assert kinds[-4:] == ["slurm_requeue", "daemon_exit", "slurm_requeue_failed", "daemon_exit"]
        assert journal(run_dir)[-1]["code"] == 75
    finally:
        daemon.cleanup()


# ----------------------------------------------------------------------------- the lease


def plant_lease(run_dir: Path, job: str, node: str) -> None:
    state = run_dir / ".trainwarden"
    state.mkdir(exist_ok=True)
    lease = {"host": f"{node}.cluster", "pid": 812, "started": time.time(), "job_id": job}
    (state / "lease.json").write_text(json.dumps({**lease, "node": node}))


def test_a_run_another_jobs_daemon_holds_is_refused_in_one_line_until_that_job_ends(
    tmp_path: Path,
):
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    plant_lease(run_dir, "999", "node07")
    state = tmp_path / "job999"
    state.write_text("RUNNING")
    others = f"  'show job -o 999') echo \"JobId=999 JobState=$(cat {state}) Reason=None\" ;;\n"
    env, _ = fake_slurm(tmp_path, others=others)
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start(wait=False)
        assert daemon.wait_exit(30) == 1
        lines = daemon.stderr().strip().splitlines()
        assert len(lines) == 1, lines
        assert (
            f"{run_dir} is already supervised by Slurm job 999 on node07 (daemon pid 812)"
            in lines[0]
        )
        assert "running; it is taken over once that job ends (`scancel 999` ends it)" in lines[0]
        assert records(run_dir, "daemon_start") == []
        # The job ends: the next daemon takes the run.
        state.write_text("COMPLETED")
        daemon = DaemonProcess(run_dir, env)
        daemon.start()
        held = json.loads((run_dir / ".trainwarden" / "lease.json").read_text())
        assert (held["job_id"], held["node"], held["host"]) == (
            "4242",
            "node01",
            socket.gethostname(),
        )
        assert held["pid"] == daemon.pid
    finally:
        daemon.cleanup()


def test_a_lease_slurm_has_forgotten_or_left_by_this_jobs_last_segment_is_taken(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    others = "  'show job -o 998') echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1 ;;\n"
    env, asked = fake_slurm(tmp_path, others=others)
    for job in ("998", "4242"):
        plant_lease(run_dir, job, "node07")
        daemon = DaemonProcess(run_dir, env)
        try:
            daemon.start()
            assert (
                json.loads((run_dir / ".trainwarden" / "lease.json").read_text())["job_id"]
                == "4242"
            )
        finally:
            daemon.cleanup()
    # Its own job's lease: Slurm was not asked about it.
    assert (
        "show job -o 998" in asked.read_text() and asked.read_text().count("show job -o 4242") == 2
    )


def test_on_another_machine_the_tui_and_status_say_where_the_daemon_runs(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "10")
    plant_lease(run_dir, "999", "node07")
    for command, ssh in (("tui", "ssh -t"), ("status", "ssh")):
        done = subprocess.run(
            [*CLI, command, str(run_dir)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1 and done.stdout == "", done
        assert done.stderr.strip().splitlines() == [
            f"trainwarden: the daemon of {run_dir} runs on node07 (Slurm job 999 on node07"
            f" (daemon pid 812)), not on this machine ({socket.gethostname()}), and its socket"
            f" answers only there: `{ssh} node07 trainwarden {command} {run_dir}`"
        ]
    # A lease untouched for STALE_S: its daemon is gone; the usual message.
    os.utime(run_dir / ".trainwarden" / "lease.json", (1.0, 1.0))
    done = subprocess.run(
        [*CLI, "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert "no trainwarden daemon answers" in done.stderr


def test_an_end_time_moved_earlier_is_the_one_the_stop_must_beat(tmp_path: Path):
    # scontrol says the job ends in 140 s at the start, then (an operator's `scontrol
    # update TimeLimit=`) in 25 s when the daemon asks again before leaving.
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--dt", "0.02", slurm={"act_before_end_s": 135}
    )
    sooner = show_line("4242", "RUNNING", 25)
    counted = tmp_path / "shown"
    env, _ = fake_slurm(tmp_path, ends_in_s=140)
    script = tmp_path / "bin" / "scontrol"
    # The second `show job` answers the sooner end.
    script.write_text(
        script.read_text().replace(
            "  'show job -o 4242') echo",
            f"  'show job -o 4242') [ -e {counted} ] && echo '{sooner}' && exit 0;"
            f" touch {counted}; echo",
        )
    )
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        assert daemon.wait_exit(60) == 75, daemon.stderr()
        (asked_to,) = records(run_dir, "slurm_requeue_requested")
        # 25 s to the new end, 10 of them kept for Slurm; the old end would have left 125.
        assert asked_to["why"] == "end_time" and asked_to["seconds_left"] <= 15, asked_to
    finally:
        daemon.cleanup()


def test_the_jobs_signal_during_the_start_is_acted_on_once_the_run_is_up(tmp_path: Path):
    # The daemon is held asking Slurm about a lease another job left: the signal comes
    # before the start's inputs are listening (it ended the daemon by its default action).
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.02")
    plant_lease(run_dir, "999", "node07")
    others = "  'show job -o 999') sleep 2; echo 'JobId=999 JobState=COMPLETED Reason=None' ;;\n"
    env, asked = fake_slurm(tmp_path, others=others)
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start(wait=False)
        wait_for(
            lambda: asked.exists() and "show job -o 999" in asked.read_text(),
            timeout=30,
            what="the daemon asking about the other job",
        )
        os.kill(daemon.pid, signal.SIGUSR1)
        assert daemon.wait_exit(60) == 75, daemon.stderr()
        (asked_to,) = records(run_dir, "slurm_requeue_requested")
        assert asked_to["why"] == "SIGUSR1"
        assert "requeue 4242" in asked.read_text().splitlines()
    finally:
        daemon.cleanup()


def test_outside_a_job_the_signal_is_said_and_ignored(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        wait_for(lambda: (daemon.status().get("step") or 0) >= 3, timeout=60, what="steps")
        pid = daemon.status()["trainer_pid"]
        os.kill(daemon.pid, signal.SIGUSR1)
        wait_for(lambda: records(run_dir, "signal_ignored"), timeout=30, what="the record")
        (ignored,) = records(run_dir, "signal_ignored")
        assert ignored["signal"] == "SIGUSR1" and "not in a Slurm job" in ignored["reason"]
        assert ignored["count"] == 1
        # A flood of them is counted, not journaled one by one (said again a minute on).
        for _ in range(100):
            os.kill(daemon.pid, signal.SIGUSR1)
        wait_for(lambda: daemon.status()["state"] == "running", timeout=30, what="an answer")
        assert len(records(run_dir, "signal_ignored")) == 1
        assert daemon.stderr(100_000).count("SIGUSR1 ignored") == 1
        status = daemon.status()
        assert status["state"] == "running" and status["trainer_pid"] == pid
        daemon.request("shutdown", timeout=60)
        assert daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()


def test_a_job_slurm_will_not_requeue_is_said_at_the_start(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    env, _ = fake_slurm(tmp_path, requeue=0)
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        wait_for(lambda: records(run_dir, "slurm_not_requeueable"), timeout=30, what="it")
        assert records(run_dir, "slurm_not_requeueable") == [
            {**records(run_dir, "slurm_not_requeueable")[0], "job_id": "4242"}
        ]
        warned = [line for line in daemon.stderr().splitlines() if "Requeue=0" in line]
        assert len(warned) == 1 and "#SBATCH --requeue" in warned[0], daemon.stderr()
    finally:
        daemon.cleanup()
    # A job Slurm would requeue is not warned about.
    run_dir = scripted_run(tmp_path / "run2", "--steps", "100000", "--dt", "0.05")
    env, _ = fake_slurm(tmp_path / "ok")
    daemon = DaemonProcess(run_dir, env)
    try:
        daemon.start()
        wait_for(lambda: records(run_dir, "slurm_job"), timeout=30, what="the job read")
        assert records(run_dir, "slurm_not_requeueable") == []
    finally:
        daemon.cleanup()


def _blocked(pid: int, sig: int) -> bool:
    """Whether `pid` holds `sig` blocked (its SigBlk mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(int(mask, 16) & (1 << (sig - 1)))


def test_a_signal_while_the_daemon_still_starts_is_held_not_fatal(tmp_path: Path):
    # Sent while the command imports and reads the config, before the daemon's loop and
    # its handler exist: the default action of USR1 would end the process there.
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000", "--dt", "0.05")
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start(wait=False)
        wait_for(
            lambda: _blocked(daemon.pid, signal.SIGUSR1) or not daemon.alive,
            timeout=30,
            interval=0.002,
            what="the command holding USR1",
        )
        os.kill(daemon.pid, signal.SIGUSR1)
        daemon.wait_ready()
        wait_for(lambda: records(run_dir, "signal_ignored"), timeout=30, what="the record")
        (ignored,) = records(run_dir, "signal_ignored")
        assert ignored["signal"] == "SIGUSR1" and ignored["count"] == 1
        wait_for(lambda: daemon.status().get("trainer_pid"), timeout=60, what="the trainer")
        trainer = daemon.status()["trainer_pid"]
        assert not _blocked(trainer, signal.SIGUSR1), "the trainer inherited the held mask"
        daemon.request("shutdown", timeout=60)
        assert daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()


def test_a_daemon_command_that_cannot_start_leaves_the_signal_mask_as_it_was(tmp_path: Path):
    # In this process: held after the command ended, USR1 would never reach the
    # processes this test process starts next (a trainer's save request, say).
    from trainwarden.supervisor.cli.main import main

    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert main(["daemon", str(tmp_path / "no-run-here")]) == 2
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
