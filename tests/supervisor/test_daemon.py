"""The daemon against real trainers, processes, sockets and files: the reference trainer where
its bytes are the point (bit-exact through SIGKILLs, the config `init` writes), the scripted
trainer elsewhere."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import (
    PYTHON,
    DaemonProcess,
    checkpoints,
    journal,
    journal_kinds,
    kill_quietly,
    make_run,
    pid_alive,
    reference_run,
    refused_start,
    running_daemon,
    scripted_argv,
    scripted_run,
    trainer_argv,
    trainer_pid,
    wait_for,
)
from trainwarden.plugins.formats.andrea_bin import checkpoint_name

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted reference: the trainer alone, 120 steps."""
    run_dir = tmp_path_factory.mktemp("straight")
    subprocess.run(trainer_argv(120, 20), cwd=run_dir, check=True, capture_output=True, timeout=180)
    return run_dir


def final_bytes(run_dir: Path, step: int) -> bytes:
    return (run_dir / "checkpoints" / checkpoint_name(step)).read_bytes()


def test_survives_repeated_sigkill_and_ends_bit_exact(tmp_path: Path, straight_run: Path):
    run_dir = reference_run(
        tmp_path / "run",
        120,
        20,
        trainer={"env": {"TRAINER_TEST_SLOW_SAVE_S": "0.3"}},
        divergence={"rollback_steps": 20},  # keep_last 3 spans it: exactly three are kept
    )
    rng = random.Random(7)
    kills = 0
    with running_daemon(run_dir) as daemon:
        while kills < 5:
            status = daemon.wait_state("running", "finished", timeout=120)
            if status["state"] == "finished":
                break
            pid = status["trainer_pid"]
            if kills % 2 == 0:
                # Land this one during a checkpoint write.
                wait_for(
                    lambda: list((run_dir / "checkpoints").glob("*.tmp")),
                    60,
                    0.01,
                    what="a checkpoint write",
                )
            else:
                time.sleep(rng.uniform(0.2, 1.5))
            if not pid_alive(pid):
                continue
            os.kill(pid, signal.SIGKILL)
            kills += 1
            wait_for(lambda p=pid: daemon.status()["trainer_pid"] not in (p,), 30, what="restart")
        daemon.wait_state("finished", timeout=180)
        assert final_bytes(run_dir, 120) == final_bytes(straight_run, 120)
        assert checkpoints(run_dir) == [80, 100, 120]
        records = journal(run_dir)
        crashes = [r for r in records if r["kind"] == "crash"]
        assert len(crashes) == kills == 5
        assert all("SIGKILL" in r["cause"] for r in crashes)
        assert len([r for r in records if r["kind"] == "spawn"]) == 6
        assert not list((run_dir / "checkpoints").glob("*.tmp"))


def test_truncated_newest_checkpoint_is_quarantined_and_previous_resumed(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "40", "--save-every", "10")
    # What a run before the daemon left: checkpoints 10 and 20, the newest torn.
    subprocess.run(scripted_argv("--steps", "20"), cwd=run_dir, check=True, timeout=60)
    assert checkpoints(run_dir) == [10, 20]
    newest = run_dir / "checkpoints" / checkpoint_name(20)
    newest.write_bytes(newest.read_bytes()[:1000])
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running", "finished", timeout=60)
        spawn = next(r for r in journal(run_dir) if r["kind"] == "spawn")
        assert spawn["resume"]["step"] == 10
        assert (run_dir / "checkpoints" / "quarantine" / checkpoint_name(20)).exists()
        quarantine = next(r for r in journal(run_dir) if r["kind"] == "quarantine")
        assert "truncated" in quarantine["reason"]


def test_instant_crasher_ends_in_crash_loop_with_backoff_in_journal(tmp_path: Path):
    run_dir = tmp_path / "run"
    make_run(
        run_dir,
        [PYTHON, "-c", "import sys; sys.exit(3)"],
        restart={
            "backoff_initial_s": 0.05,
            "backoff_max_s": 0.2,
            "max_restarts_without_progress": 4,
        },
    )
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("crash_loop", timeout=60)
        assert "exit status 3" in status["detail"]["reason"]
        backoffs = [r["backoff_s"] for r in journal(run_dir) if r["kind"] == "restart_scheduled"]
        assert backoffs == [0.05, 0.1, 0.2, 0.2]
        assert journal_kinds(run_dir).count("spawn") == 5
        time.sleep(0.5)
        assert journal_kinds(run_dir).count("spawn") == 5  # halted: no more restarts


def test_hang_is_detected_and_restarted(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        *("--steps", "60", "--save-every", "10", "--hang-at", "15", "--dt", "0.02"),
        restart={"stall_timeout_s": 8.0},
        trainer={"stop_timeout_s": 2.0},
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: "crash" in journal_kinds(run_dir), 60, what="stall detection and kill")
        records = journal(run_dir)
        stall = next(r for r in records if r["kind"] == "stall")
        signals = [r["signal"] for r in records if r["kind"] == "signal"]
        assert signals[:2] == ["SIGTERM", "SIGKILL"]
        daemon.wait_state("finished", timeout=120)
        restarted = [r for r in journal(run_dir) if r["kind"] == "spawn"]
        assert len(restarted) == 2 and restarted[1]["resume"]["step"] == 10
        crash = next(r for r in journal(run_dir) if r["kind"] == "crash")
        sigterm = next(r for r in journal(run_dir) if r.get("signal") == "SIGTERM")
        # The SIGTERM after the stack dump (dump_timeout_s = 10 at most), the SIGKILL after 2 s.
        assert sigterm["t"] - stall["t"] <= 10.0 + 1.0
        assert crash["t"] - sigterm["t"] <= 2.0 + 1.0
        assert stall["silent_s"] >= 8.0


def test_daemon_sigterm_saves_at_the_current_step_and_both_exit_zero(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000000", "--save-every", "1000", "--dt", "0.02"
    )
    daemon = DaemonProcess(run_dir).start()
    try:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 5, 60, what="a few steps")
        pid = daemon.status()["trainer_pid"]
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait_exit(60) == 0
        stopped = next(r for r in journal(run_dir) if r["kind"] == "trainer_stopped")
        assert stopped["returncode"] == 0
        assert checkpoints(run_dir) == [stopped["last_step"]]
        assert not pid_alive(pid)
        assert journal_kinds(run_dir)[-1] == "daemon_exit"
    finally:
        daemon.cleanup()


def test_second_daemon_is_refused_naming_the_holder(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000000", "--save-every", "1000", "--dt", "0.02"
    )
    with running_daemon(run_dir) as daemon:
        second = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "daemon", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"pid {daemon.pid}" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1


def test_leftover_trainer_is_stopped_before_a_new_one_starts(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000000", "--save-every", "1000", "--dt", "0.02"
    )
    daemon = DaemonProcess(run_dir).start()
    try:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 3, 60, what="steps")
        old = trainer_pid(run_dir)
        daemon.kill()
        assert old is not None and pid_alive(old)
        daemon = DaemonProcess(run_dir).start()
        wait_for(lambda: daemon.status()["trainer_pid"] not in (None, old), 60, what="new trainer")
        assert not pid_alive(old)
        kinds = journal_kinds(run_dir)
        assert "leftover_trainer_stopped" in kinds
        # The old trainer saved on SIGTERM; the new one resumed from it.
        spawns = [r for r in journal(run_dir) if r["kind"] == "spawn"]
        assert spawns[-1]["resume"] is not None
    finally:
        daemon.cleanup()
        kill_quietly(old)


def test_stale_tmp_is_removed_at_startup(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "30", "--save-every", "10")
    (run_dir / "checkpoints").mkdir(parents=True)
    stale = run_dir / "checkpoints" / (checkpoint_name(10) + ".tmp")
    stale.write_bytes(b"x" * 100)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
        assert "stale_tmp_removed" in journal_kinds(run_dir)
        assert checkpoints(run_dir) == [10, 20, 30]


def test_restart_after_daemon_sigkill_keeps_counters(tmp_path: Path):
    run_dir = tmp_path / "run"
    make_run(
        run_dir,
        [PYTHON, "-c", "import sys; sys.exit(1)"],
        restart={
            "backoff_initial_s": 0.05,
            "backoff_max_s": 0.05,
            "max_restarts_without_progress": 3,
        },
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("crash_loop", timeout=60)
        daemon.kill()
    with running_daemon(run_dir) as daemon:
        status = daemon.status()
        assert status["state"] == "crash_loop"
        assert status["restarts"] == 3
        time.sleep(0.3)
        assert journal_kinds(run_dir).count("spawn") == 4
        daemon.request("start")
        daemon.wait_state("crash_loop", timeout=60)
        assert journal_kinds(run_dir).count("spawn") == 8


BAD_CONFIGS = [
    ("[trainer]\ncommand = ['x']\nstop_timout_s = 3\n", "did you mean 'stop_timeout_s'"),
    ("[trainer]\ncommand = 'python train.py'\n", "'trainer.command'"),
    ("[trainer]\nenv = {}\n", "'[trainer] command' is missing"),
    ("[trainer]\ncommand = ['x']\n[checkpoints]\nkeep_last = 0\n", "'checkpoints.keep_last' = 0"),
    ("[trainer]\ncommand = ['x']\n[checkpoints]\nformat = 'nope'\n", "installed: andrea-bin"),
    ("[trainer]\ncommand = ['x']\n[telemetry]\nparser = 'nope'\n", "'telemetry.parser'"),
    ("[trainer\ncommand = ['x']\n", "not valid TOML"),
    ("[trainr]\ncommand = ['x']\n", "did you mean 'trainer'"),
    ("[trainer]\ncommand = ['x']\n[restart]\nstall_timeout_s = -1\n", "'restart.stall_timeout_s'"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_CONFIGS)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, text: str, expected: str):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "trainwarden.toml").write_text(text)
    line = refused_start(run_dir)
    assert expected in line and "trainwarden.toml" in line


def test_missing_and_unreadable_config(tmp_path: Path):
    missing = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "daemon", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "trainwarden init" in missing.stderr
    (tmp_path / "trainwarden.toml").write_bytes(b"\xff\xfe not utf8")
    bad = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "daemon", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_init_writes_a_working_config_and_refuses_to_overwrite(tmp_path: Path):
    run_dir = tmp_path / "fresh"
    ok = subprocess.run(
        [
            PYTHON,
            "-m",
            "trainwarden.supervisor",
            "init",
            str(run_dir),
            "--steps",
            "20",
            "--save-every",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    again = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "init", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 2 and "--force" in again.stderr
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
        assert checkpoints(run_dir) == [10, 20]
    assert sys.executable in (run_dir / "trainwarden.toml").read_text()


def test_the_daemon_does_not_import_torch():
    code = "import sys, trainwarden.supervisor.shell.daemon, trainwarden.supervisor.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([PYTHON, "-c", code], timeout=60).returncode == 0


def test_a_nan_on_the_first_line_after_a_spawn_is_acted_on_every_time(tmp_path: Path):
    """A trainer that prints a NaN the instant it starts: each start is killed as diverged,
    none is left to hang until the stall timeout (its line may reach the daemon before the
    spawn it belongs to has been processed)."""
    starts = 12
    run_dir = make_run(
        tmp_path / "run",
        ["/bin/sh", "-c", "echo 'step: 1, loss: nan, dt: 0.1'; exec sleep 60"],
        trainer={"stop_timeout_s": 5.0},
        restart={
            "backoff_initial_s": 0.0,
            "divergence_retries": starts - 1,
            "stall_timeout_s": 30.0,
        },
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("diverged", timeout=25.0)
        records = journal(run_dir)
    kinds = [r["kind"] for r in records]
    assert kinds.count("trainer_started") == starts, kinds
    assert kinds.count("divergence") == starts, kinds
    assert "stall" not in kinds, kinds
