"""Telemetry through the real daemon: loss history, resume audit, divergence, parsers, GPU."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import orjson
import pytest

from tests.support import (
    DaemonProcess,
    checkpoints,
    journal,
    journal_kinds,
    pid_alive,
    running_daemon,
    scripted_run,
    wait_for,
)
from trainwarden.plugins.formats.andrea_bin import checkpoint_name
from trainwarden.supervisor.store.losshistory import LossHistory

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parent.parent.parent


def loss_lines(run_dir: Path) -> list[dict]:
    return [orjson.loads(line) for line in (run_dir / ".loss.json").read_bytes().splitlines()]


def test_nan_kills_at_once_rolls_back_and_trains_on(tmp_path: Path):
    # Bit-exact training through the rollback is the reference trainer's resume (proven
    # through SIGKILLs in test_daemon.py and under the chaos soak's NaN); here the daemon's
    # side: the kill, the rollback target, the spawn, the loss history's segments.
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "60", "--save-every", "10", "--nan-at", "25", "--nan-once"
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=180)
        records = journal(run_dir)
        divergence = next(r for r in records if r["kind"] == "divergence")
        assert divergence["step"] == 25 and divergence["loss"] == "nan"
        # 20 may still be in verification at the NaN: then the record names no target yet.
        assert divergence.get("rollback_to", 20) == 20
        assert (
            "rollback_to" in divergence
            or checkpoint_name(20) in divergence["awaiting_verification"]
        )
        kill = next(r for r in records if r["kind"] == "signal")
        assert kill["signal"] == "SIGKILL" and "divergence" in kill["reason"]
        assert kill["t"] - divergence["t"] < 0.5
        spawns = [r for r in records if r["kind"] == "spawn"]
        assert spawns[1]["resume"]["step"] == 20 and spawns[1]["rollback_from"] == 25
        assert "trainer_killed" in journal_kinds(run_dir) and "crash" not in journal_kinds(run_dir)
    assert checkpoints(run_dir)[-1] == 60
    # The NaN line is in .loss.json with its segment; the newest segment has finite losses.
    lines = loss_lines(run_dir)
    assert any(line["step"] == 25 and line["loss"] == "nan" and line["seg"] == 1 for line in lines)
    history = LossHistory.load(run_dir / ".loss.json")
    assert [row.step for row in history] == list(range(1, 61))
    assert all(row.seg == 2 for row in history if row.step > 20)


def test_a_nan_logged_while_no_daemon_ran_is_acted_on_at_the_next_start(tmp_path: Path):
    """The daemon is SIGKILLed; its trainer goes on, logs a NaN at step 45 and saves at 50
    and 60 before the next daemon starts: that daemon reads the NaN among the lines it
    catches up on, quarantines 50 and 60 (written after it) and resumes from 40."""
    run_dir = scripted_run(
        tmp_path / "run",
        *("--steps", "100000", "--save-every", "10", "--dt", "0.02"),
        *("--nan-at", "45", "--nan-once"),
        trainer={"total_steps": 100_000},
        checkpoints={"keep_last": 5},
    )
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        wait_for(lambda: checkpoints(run_dir)[-1:] == [20], 60, what="checkpoint 20")
        daemon.kill()
        wait_for(lambda: 60 in checkpoints(run_dir), 60, what="the orphan's checkpoint 60")
        daemon.start()
        wait_for(
            lambda: len([r for r in journal(run_dir) if r["kind"] == "spawn"]) == 2,
            60,
            what="the second daemon's start",
        )
    finally:
        daemon.cleanup()
    records = journal(run_dir)
    divergence = next(r for r in records if r["kind"] == "divergence")
    assert divergence["step"] == 45 and divergence["loss"] == "nan", divergence
    assert divergence["caught_up"] is True and set(divergence["quarantined"]) >= {50, 60}
    spawn = [r for r in records if r["kind"] == "spawn"][-1]
    assert spawn["resume"]["step"] == 40 and spawn["rollback_from"] == 45, spawn
    quarantined = {r["step"] for r in records if r["kind"] == "quarantine"}
    assert {50, 60} <= quarantined


def test_a_divergence_quarantine_whose_move_failed_binds_the_next_daemon(tmp_path: Path):
    """checkpoints/quarantine is a file, so quarantining cannot move anything. A NaN at 45
    logged while no daemon ran: the next daemon quarantines 50 and 60 (the moves fail, the
    files stay) and rolls back. The daemon after it must not take 60 for the newest."""
    run_dir = scripted_run(
        tmp_path / "run",
        *("--steps", "100000", "--save-every", "10", "--dt", "0.1"),
        *("--nan-at", "45", "--nan-once"),
        trainer={"total_steps": 100_000},
        checkpoints={"keep_last": 10},
    )
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "quarantine").write_text("not a folder\n")
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        wait_for(lambda: 20 in checkpoints(run_dir), 60, what="checkpoint 20")
        daemon.kill()
        wait_for(lambda: 60 in checkpoints(run_dir), 60, what="the orphan's checkpoint 60")
        daemon.start()
        wait_for(
            lambda: any(r["kind"] == "divergence" for r in journal(run_dir)), 60, what="the NaN"
        )
        daemon.request("shutdown", timeout=60)
        daemon.wait_exit(60)
        assert {50, 60} <= set(checkpoints(run_dir))  # still there: the moves failed
        daemon.start()
        daemon.wait_state("stopped", timeout=60)  # the shutdown was the operator's
        listed = [c["step"] for c in daemon.request("checkpoints")["checkpoints"]]
        assert listed and max(listed) < 45, listed
        daemon.request("start", timeout=60)
        wait_for(
            lambda: len([r for r in journal(run_dir) if r["kind"] == "spawn"]) == 3,
            60,
            what="the third daemon's start",
        )
    finally:
        daemon.cleanup()
    spawn = [r for r in journal(run_dir) if r["kind"] == "spawn"][-1]
    assert spawn["resume"]["step"] < 45, spawn
    again = [
        r["step"]
        for r in journal(run_dir)
        if r["kind"] == "quarantine" and "the move out of the folder had failed" in r["reason"]
    ]
    assert {50, 60} <= set(again), again


def test_recurring_divergence_halts_in_diverged(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "1000",
        "--save-every",
        "10",
        "--nan-at",
        "25",
        restart={"divergence_retries": 1},
    )
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("diverged", timeout=60)
        assert "diverged again at step 25" in status["detail"]["reason"]
        assert journal_kinds(run_dir).count("divergence") == 2
        assert journal_kinds(run_dir).count("spawn") == 2
        assert checkpoints(run_dir) == [10, 20]


def test_loss_above_max_loss_is_a_divergence(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "1000", "--save-every", "10", telemetry={"max_loss": 4.99}
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("diverged", timeout=60)
        divergence = next(r for r in journal(run_dir) if r["kind"] == "divergence")
        # 4.999 at step 1 is already above max_loss: no checkpoint precedes it, so the
        # rollback is a fresh start, and the same divergence again halts.
        assert divergence["step"] == 1 and divergence["max_loss"] == 4.99
        assert divergence["rollback_to"] is None
        spawns = [r for r in journal(run_dir) if r["kind"] == "spawn"]
        assert [s["resume"] for s in spawns] == [None, None]


def test_resume_audit_verified_after_sigkill(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "300", "--save-every", "50", "--dt", "0.02")
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 70, 60, what="step 70")
        os.kill(daemon.status()["trainer_pid"], signal.SIGKILL)
        daemon.wait_state("finished", timeout=60)
        verified = next(r for r in journal(run_dir) if r["kind"] == "resume_verified")
        assert verified["checkpoint_step"] == 50 and verified["checked"] >= 20
        assert daemon.status()["resume_audit"]["status"] == "verified"


def test_resume_audit_reports_drift(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "300",
        "--save-every",
        "50",
        "--dt",
        "0.02",
        "--drift-per-seg",
        "0.5",
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 60, 60, what="step 60")
        os.kill(daemon.status()["trainer_pid"], signal.SIGKILL)
        wait_for(lambda: "resume_drift" in journal_kinds(run_dir), 60, what="drift event")
        drift = next(r for r in journal(run_dir) if r["kind"] == "resume_drift")
        assert drift["step"] == 51
        assert drift["new_loss"] - drift["old_loss"] == pytest.approx(0.5)


def test_status_fields_and_history_rebuilt_at_start(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "100000",
        "--save-every",
        "100",
        "--dt",
        "0.02",
        telemetry={"n_params": 1000, "peak_tflops": 100.0, "vocab_size": 50257},
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 40, 60, what="steps")
        status = daemon.status()
        # One clock for every rate: tokens/s is the pace times 512 tokens a step, whatever
        # the trainer's own dt says, and MFU is computed from that tokens/s.
        tokens_per_s = status["steps_per_min"] / 60 * 512
        assert status["tokens_per_s"] == pytest.approx(tokens_per_s, rel=1e-9)
        expected_mfu = 6 * 1000 * tokens_per_s / 100e12
        assert status["mfu"] == pytest.approx(expected_mfu, rel=1e-9)
        assert status["collapse_loss"] == pytest.approx(10.825, abs=1e-3)
        assert status["loss"] == pytest.approx(5.0 - 0.001 * status["step"], abs=0.01)
        assert status["steps_per_min"] > 0 and status["eta_s"] is None
        step_then = status["step"]
        daemon.kill()
    with running_daemon(run_dir) as daemon:
        status = daemon.status()
        # Telemetry comes back from .loss.json before the new trainer has logged anything.
        assert status["loss_ema"] is not None
        history = daemon.request("history", points=10)
        assert history["last_step"] >= step_then


def test_llmc_parser_and_log_copytruncate(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "100000",
        "--save-every",
        "100",
        "--dt",
        "0.02",
        "--format",
        "llmc",
        telemetry={"parser": "llmc"},
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 20, 60, what="llmc steps")
        os.truncate(run_dir / "training.log", 0)
        before = daemon.status()["step"]
        wait_for(lambda: daemon.status()["step"] > before + 10, 30, what="steps after copytruncate")
        assert daemon.status()["log"]["truncations"] >= 1


def test_gpu_telemetry_and_mfu_from_the_gpu_name(tmp_path: Path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text(
        "import sys\n"
        "from tests.supervisor.fake_pynvml import FakeNvml\n"
        "fake = FakeNvml()\n"
        "fake.values['name'] = 'NVIDIA A100-SXM4-80GB'\n"
        "sys.modules[__name__] = fake.module\n"
    )
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps",
        "100000",
        "--save-every",
        "100",
        "--dt",
        "0.02",
        telemetry={"n_params": 124_356_864},
    )
    env = {"PYTHONPATH": f"{shim}{os.pathsep}{REPO}"}
    with running_daemon(run_dir, env=env) as daemon:
        status = wait_for(
            lambda: (s := daemon.status())["gpu"] and s["mfu"] is not None and s,
            30,
            what="GPU sample and MFU",
        )
        gpu = status["gpu"]
        assert gpu["name"] == "NVIDIA A100-SXM4-80GB" and gpu["power_w"] == pytest.approx(412.345)
        expected = 6 * 124_356_864 * status["tokens_per_s"] / 312e12
        assert status["mfu"] == pytest.approx(expected, rel=1e-9)


def test_unknown_gpu_shows_mfu_unknown_with_a_hint(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--save-every", "100", telemetry={"n_params": 1000}
    )
    with running_daemon(run_dir) as daemon:
        status = wait_for(
            lambda: (s := daemon.status())["step"] and s["mfu_unknown_reason"] and s,
            30,
            what="status",
        )
        assert status["mfu"] is None and "peak_tflops" in status["mfu_unknown_reason"]


def test_daemon_cpu_is_small_while_supervising(tmp_path: Path):
    """Not a timing assertion (bench/ has the figure): the loop must not spin."""
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--save-every", "1000", "--dt", "0.1"
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 5, 30, what="steps")
        ticks = os.sysconf("SC_CLK_TCK")

        def cpu_s() -> float:
            fields = Path(f"/proc/{daemon.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / ticks

        before = cpu_s()
        time.sleep(5.0)
        used = cpu_s() - before
        assert pid_alive(daemon.pid)
        assert used < 1.0, f"daemon used {used:.2f} s of CPU in 5 s at 10 lines/s"


def test_telemetry_frames_flow_to_a_subscriber_as_steps_arrive(tmp_path: Path):
    # Frames are built only while someone is subscribed: subscribe mid-run and get them.
    run_dir = scripted_run(tmp_path / "run", "--steps", "400", "--dt", "0.02")
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 5, 60, what="first steps")
        with daemon.client(timeout=10.0) as client:
            snapshot = client.request("subscribe", topics=["telemetry"])
            first = snapshot["snapshot"]["telemetry"]["step"]
            steps = []
            deadline = time.monotonic() + 30
            while len(steps) < 3 and time.monotonic() < deadline:
                message = client.read_message()
                if message.get("topic") == "telemetry":
                    steps.append(message["data"]["step"])
        assert len(steps) == 3, steps
        assert first < steps[0] < steps[1] < steps[2]


HALF_LINE_TRAINER = """
import os, sys, time
seg = int(os.environ["TRAINWARDEN_SEG"])
if seg == 1:
    for step in range(1, 7):
        print(f"step: {step}, loss: 4.0, dt: 0.01, tokens: 512", flush=True)
    sys.stdout.write("step: 7, loss: 4.0, dt: 0.01, tokens: 512")  # killed before its newline
    sys.stdout.flush()
    open("half-written", "w").close()
    time.sleep(600)
print("second start", flush=True)
print("step: 1, loss: 9.0, dt: 0.01, tokens: 512", flush=True)
"""


def test_a_line_its_trainer_was_killed_in_is_not_glued_to_the_next_starts_first(
    tmp_path: Path,
):
    """Killed between a line's text and its newline (PYTHONUNBUFFERED writes them apart),
    the trainer's last line is ended at its exit: it is its own step 7, and the next
    start's first line is read as the next start's, not as the end of step 7's."""
    from tests.support import PYTHON, make_run

    run_dir = make_run(
        tmp_path / "run", [PYTHON, "-c", HALF_LINE_TRAINER],
        restart={"backoff_initial_s": 0.0},
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (run_dir / "half-written").exists(), 60, what="the half line")
        # Under load the file can come before the daemon has heard of the start's pid.
        pid = wait_for(lambda: daemon.status()["trainer_pid"], 60, what="the trainer's pid")
        os.kill(pid, signal.SIGKILL)
        daemon.wait_state("finished", timeout=60)
    (crash,) = [r for r in journal(run_dir) if r["kind"] == "crash"]
    assert crash["last_step"] == 7
    lines = (run_dir / "training.log").read_text().splitlines()
    assert "step: 7, loss: 4.0, dt: 0.01, tokens: 512" in lines and "second start" in lines
