"""The status reply's figures are true: the next checkpoint on the trainer's cadence and
never past the total, no pace or ETA while the trainer is not stepping, the checkpoint's
age from its file, and an ETA that a noisy machine does not throw about."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.support import DaemonProcess, running_daemon, scripted_run, wait_for
from trainwarden.plugins.formats.andrea_bin import checkpoint_name
from trainwarden.supervisor.shell.save_cadence import SaveCadence
from trainwarden.supervisor.shell.telemetry import Monitor, MonitorSettings

pytestmark = pytest.mark.timeout(240)

PACE = ("tokens_per_s", "steps_per_min", "eta_s", "mfu")


# ----------------------------------------------------------------------------- the cadence


def test_a_manual_save_does_not_shift_the_next_checkpoint():
    cadence = SaveCadence(total_steps=5000)
    for step in (200, 400):
        cadence.committed(step)
    cadence.signalled("SIGUSR1")
    cadence.committed(498)
    assert cadence.next_after(498) == 600
    assert cadence.next_after(600) == 800
    # A stop's save too (SIGTERM), and the next start goes on from it.
    cadence.signalled("SIGTERM")
    cadence.committed(451)
    cadence.started()
    assert cadence.next_after(451) == 600


def test_an_own_save_in_flight_when_a_save_is_asked_does_not_take_the_requests_place():
    """The signal arrives while the trainer writes its own save at 600: that commit is
    on the cadence and is not the requested one; the manual save at 613 that follows is."""
    cadence = SaveCadence(total_steps=5000)
    for step in (200, 400):
        cadence.committed(step)
    cadence.signalled("SIGUSR1")
    cadence.committed(600)
    cadence.committed(613)
    assert cadence.every == 200
    assert cadence.next_after(613) == 800
    # Two saves asked before either is written: both commits are the requested ones.
    cadence.signalled("SIGUSR1")
    cadence.signalled("SIGUSR1")
    cadence.committed(615)
    cadence.committed(616)
    assert cadence.every == 200 and cadence.next_after(616) == 800


def test_the_next_checkpoint_is_never_past_the_total():
    cadence = SaveCadence(total_steps=5050)
    for step in (200, 400, 600):
        cadence.committed(step)
    assert cadence.next_after(4900) == 5000
    assert cadence.next_after(5010) == 5050  # the trainer's save at its end
    assert cadence.next_after(5050) is None
    assert cadence.next_after(6000) is None
    cadence.committed(5050)  # the end's save is not on the cadence
    assert cadence.every == 200


def test_a_cadence_counted_from_its_own_phase():
    cadence = SaveCadence()
    for step in (199, 399, 599):
        cadence.committed(step)
    assert cadence.every == 200 and cadence.next_after(650) == 799


def test_the_cadence_is_learnt_again_from_the_journal():
    records = [
        {"kind": "spawn", "seg": 1},
        {"kind": "checkpoint", "step": 200},
        {"kind": "save_requested", "step": 298},
        {"kind": "signal", "signal": "SIGUSR1"},
        {"kind": "checkpoint", "step": 298},
        {"kind": "checkpoint", "step": 400},
        {"kind": "signal", "signal": "SIGTERM"},
        {"kind": "checkpoint", "step": 451},
    ]
    cadence = SaveCadence(total_steps=5000)
    cadence.replay(records)
    assert cadence.every == 200 and cadence.next_after(451) == 600


# ----------------------------------------------------------------------------- a steady ETA


def test_the_eta_stays_steady_while_the_instant_pace_jumps():
    """A busy machine: bursts of slow steps among fast ones. The instantaneous pace (the
    20-step window) jumps by half and more; the ETA moves by a few percent per 20 s."""
    rng = random.Random(7)
    monitor = Monitor(MonitorSettings(window=20, total_steps=200_000, tokens_per_step=512))
    t, step = 0.0, 0
    etas: list[tuple[float, float]] = []
    paces: list[float] = []
    while t < 1800:
        slow = (int(t) // 15) % 3 == 0  # 15 s of every 45 the machine is busy
        dt = (0.3 if slow else 0.1) * rng.uniform(0.7, 1.3)
        t += dt
        step += 1
        monitor.observe(step, 3.0, dt, t)
        snap = monitor.snapshot()
        if t > 600:  # past the first window: the rate then spans five minutes
            etas.append((t, snap["eta_s"]))
            paces.append(snap["steps_per_min"])
    # The instantaneous pace swings by far more than half.
    assert max(paces) / min(paces) > 2.0
    worst = 0.0
    j = 0
    for i, (ti, eta) in enumerate(etas):
        while etas[j][0] < ti - 20:
            j += 1
        for tk, other in etas[j:i]:
            # The ETA falls by the time that passed: what is left is its noise.
            expected = other - (ti - tk)
            worst = max(worst, abs(eta - expected) / expected)
    assert worst < 0.1, worst


def test_a_stop_and_a_start_at_the_same_step_leave_the_stopped_time_out_of_the_eta():
    """A stop saves at its last step and the next start resumes there, so the step numbers
    go on: only the start itself (new_segment) can tell the rate that the trainer was not
    running. Before: 100 steps at 1 step/s, a 6-minute stop, then 1 step/s again gave a
    rate of 0.2 step/s and an ETA five times too long."""
    monitor = Monitor(MonitorSettings(total_steps=10_000))
    for step in range(1, 101):
        monitor.observe(step, 3.0, 1.0, float(step))
    monitor.new_segment()  # the stop's checkpoint is step 100; the start resumes there
    eta = []
    for i, step in enumerate(range(101, 141)):
        monitor.observe(step, 3.0, 1.0, 100.0 + 360.0 + i)
        eta.append(monitor.snapshot()["eta_s"])
    assert eta[:10] == [None] * 10  # no ETA before 10 s of this start's steps
    remaining = 10_000 - 140
    assert eta[-1] == pytest.approx(remaining / 1.0, rel=0.2)
    assert monitor.snapshot()["steps_per_min"] == pytest.approx(60.0)


def test_a_new_segment_starts_the_eta_rate_afresh():
    monitor = Monitor(MonitorSettings(total_steps=10_000))
    for step in range(1, 101):
        monitor.observe(step, 3.0, 1.0, float(step))  # 1 step/s
    assert monitor.eta_steps_per_s() == pytest.approx(1.0)
    for i, step in enumerate(range(50, 170)):  # resumed from 50, now 10 steps/s
        monitor.observe(step, 3.0, 0.1, 200.0 + i * 0.1)
    assert monitor.eta_steps_per_s() == pytest.approx(10.0)


# ----------------------------------------------------------------------------- the real daemon


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / checkpoint_name(step)


def test_status_tells_the_truth_across_a_manual_save_a_stop_and_a_daemon_restart(
    tmp_path: Path,
):
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "1000000", "--save-every", "20", "--dt", "0.01", "--usr1", "save",
        trainer={"total_steps": 1_000_000},
        checkpoints={"keep_last": 5},
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: checkpoint_path(run_dir, 40).exists(), 60, what="checkpoint 40")
        saved = 0
        while saved % 20 == 0:  # a save that happened to land on the cadence proves nothing
            saved = daemon.request("save", wait=True)["step"]
        running = daemon.status()
        # The manual save is no cadence: the next is the next multiple of 20 after the step.
        nxt = running["next_checkpoint_step"]
        assert nxt % 20 == 0 and running["step"] < nxt <= running["step"] + 20, running
        assert running["tokens_per_s"] is not None
        # An ETA once this start's steps span 10 s.
        wait_for(lambda: daemon.status()["eta_s"] is not None, 60, what="an ETA")
        assert running["last_line"] and running["last_line"].startswith("step")
        daemon.request("stop", wait=True)
        stopped = daemon.wait_state("stopped")
        assert {k: stopped[k] for k in PACE} == dict.fromkeys(PACE), stopped
        assert stopped["mfu_avg"] is None or stopped["mfu_avg"] >= 0  # the run average stays
        newest = stopped["last_checkpoint_step"]
        nxt = stopped["next_checkpoint_step"]
        assert nxt % 20 == 0 and stopped["step"] < nxt <= stopped["step"] + 20, stopped
    # The newest checkpoint was written an hour ago, as far as its file says.
    hour_ago = time.time() - 3600
    os.utime(checkpoint_path(run_dir, newest), (hour_ago, hour_ago))
    again = DaemonProcess(run_dir)
    try:
        again.start()
        status = wait_for(
            lambda: (s := again.status())["last_checkpoint_step"] == newest and s,
            60,
            what="the newest checkpoint seen",
        )
        assert status["last_checkpoint_age_s"] >= 3600, status
        assert status["next_checkpoint_step"] % 20 == 0
    finally:
        again.cleanup()


def test_a_finished_run_shows_no_next_checkpoint_and_no_eta(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run",
        "--steps", "50", "--save-every", "20", "--dt", "0.01",
        trainer={"total_steps": 50},
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        finished = daemon.wait_state("finished")
        assert finished["next_checkpoint_step"] is None, finished
        assert {k: finished[k] for k in PACE} == dict.fromkeys(PACE), finished
        assert finished["step"] == 50
