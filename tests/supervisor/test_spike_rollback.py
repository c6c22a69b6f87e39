"""Loss spikes handled by a real daemon supervising tests/scripted_trainer.py, whose data of
some steps is bad (a loss of 15 where the trend is about 5): detection, the rollback, the
environment the restarted trainer gets, the abandoned checkpoints set aside, the bound on
rollbacks, an outlier left alone, a trainer without skip_data, a daemon SIGKILLed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from tests.support import (
    PYTHON,
    DaemonProcess,
    belongs_to_run,
    journal,
    make_run,
    running_daemon,
    scripted_run,
    trainer_pid,
    wait_for,
)

PATIENCE = 3
SPIKE_TABLE = {
    "spike_factor": 2.0,
    "spike_window": 20,
    "spike_patience": PATIENCE,
    "spike_warmup": 5,
    "rollback_steps": 20,
    "skip_extra": 10,
    "lr_scale": 0.5,
    "max_rollbacks": 2,
    "rollback_horizon": 10_000,
}
BAD_AT = 100


def spiky_run(
    run_dir: Path,
    bad_steps: int,
    supports: list[str] | None = None,
    steps: int = 200,
    extra: tuple[str, ...] = (),
    keep_last: int = 3,
    bad_at: int = BAD_AT,
    **divergence: Any,
) -> Path:
    return scripted_run(
        run_dir,
        *("--steps", str(steps), "--save-every", "10", "--dt", "0.005", *extra),
        *("--bad-data-at", str(bad_at), "--bad-data-steps", str(bad_steps)),
        trainer={
            "stop_timeout_s": 10.0,
            "supports": ["skip_data", "lr_scale"] if supports is None else supports,
        },
        checkpoints={"keep_last": keep_last},
        divergence={**SPIKE_TABLE, **divergence},
    )


def cli(command: str, run_dir: Path, *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", command, str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def of_kind(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def starts_said(run_dir: Path) -> list[str]:
    """What each start of the scripted trainer said it got (its first line)."""
    text = (run_dir / "training.log").read_text()
    return re.findall(r"scripted trainer: (seg \d+, from step \d+, .*)", text)


def kill_between_saves(pid: int, run_dir: Path, every: int) -> None:
    """SIGKILL the trainer while its newest logged step is not a saved one, so the restart
    replays at least one logged step (a kill just after a save would leave none to audit).
    The trainer is paused (SIGSTOP) while its log is read."""
    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        logged = re.findall(r"^step: (\d+),", (run_dir / "training.log").read_text(), re.M)
        if logged and int(logged[-1]) % every:
            os.kill(pid, signal.SIGKILL)
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.003)
    raise AssertionError("the trainer never stood between two saves")


def test_a_spike_is_rolled_back_before_skipped_and_cured(tmp_path: Path):
    run_dir = spiky_run(tmp_path / "run", bad_steps=5)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
        status = daemon.status()
        markers = daemon.request("history", points=100)["markers"]
        shown = cli("status", run_dir)
        listed = cli("events", run_dir, "-n", "200")
    assert "spikes    1 rolled back (at steps 100), 1 data window(s) skipped, lr x0.5" in shown
    assert "set aside by a spike rollback" in shown
    assert re.search(r"  spike +loss 15\.0000 from step 100 to 102, above ", listed)
    assert re.search(r"  rollback +to step 80, skip 81\.\.\d+, lr x0\.5 .*spike_step=100", listed)
    assert "checkpoint=step_000080.bin" in listed
    # The chart's markers: the spike at its first step, the skip where its window starts.
    assert {"kind": "spike", "step": BAD_AT} in markers
    assert {"kind": "skip", "step": 81} in markers
    (spike,) = of_kind(run_dir, "spike")
    # Detected at the patience-th step above the threshold, not before, not later.
    assert (spike["first_step"], spike["step"]) == (BAD_AT, BAD_AT + PATIENCE - 1)
    assert spike["detected_after"] == PATIENCE and spike["peak"] == 15.0
    (rollback,) = of_kind(run_dir, "rollback")
    assert rollback["step"] == 80 and rollback["checkpoint"] == "step_000080.bin"
    window = [81, BAD_AT + PATIENCE - 1 + 1 + 10]
    assert rollback["window"] == window and rollback["lr_scale"] == 0.5
    assert rollback["supported"] == {"skip_data": True, "lr_scale": True}
    # Checkpoints after 80 were the abandoned timeline: set aside, never resumed.
    set_aside = [q for q in of_kind(run_dir, "quarantine") if q["cause"] == "rollback"]
    assert {q["step"] for q in set_aside} >= {90, 100}
    assert all(q["cause_step"] == BAD_AT for q in set_aside)
    quarantined = {p.name for p in (run_dir / "checkpoints" / "quarantine").iterdir()}
    assert {"step_000090.bin", "step_000100.bin"} <= quarantined
    kill = next(r for r in of_kind(run_dir, "signal") if "loss spike" in r["reason"])
    assert kill["signal"] == "SIGKILL"
    spawns = of_kind(run_dir, "spawn")
    assert spawns[1]["resume"]["step"] == 80 and spawns[1]["rollback_from"] == BAD_AT
    said = starts_said(run_dir)
    assert said[1] == f"seg 2, from step 80, skip_data [{window}], lr_scale 0.5"
    (outcome,) = of_kind(run_dir, "spike_outcome")
    assert outcome["outcome"] == "cured" and outcome["first_step"] == BAD_AT
    assert status["spikes"]["rollbacks"] == 1 and status["skips"] == [window]
    # The steps replayed after the rollback saw other data by design: no resume_drift.
    assert not of_kind(run_dir, "resume_drift")


def test_with_keep_last_1_the_spike_still_rolls_back_rollback_steps(tmp_path: Path):
    """keep_last = 1 alone would keep only step 100, saved in the bad data: retention keeps
    the checkpoints a rollback needs, and the spike rolls back to step 80 as with more."""
    run_dir = spiky_run(tmp_path / "run", bad_steps=5, keep_last=1)

    def kept() -> list[str]:
        return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*.bin"))

    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
        # Retention went on: at the end, keep_last plus at most the two rungs. The run is
        # finished at the trainer's exit; its last commits are verified, and older ones
        # deleted, after that (a loaded machine showed 170-200 still there at "finished").
        wait_for(
            lambda: "step_000200.bin" in kept() and len(kept()) <= 3,
            60,
            what=f"retention after the last commits ({kept()} at finished)",
        )
    (rollback,) = of_kind(run_dir, "rollback")
    assert rollback["step"] == 80 and rollback["checkpoint"] == "step_000080.bin"
    spawns = of_kind(run_dir, "spawn")
    assert spawns[1]["resume"]["step"] == 80
    (outcome,) = of_kind(run_dir, "spike_outcome")
    assert outcome["outcome"] == "cured"
    left = kept()
    assert "step_000200.bin" in left and len(left) <= 3, left


def test_the_resume_audit_still_flags_a_difference_outside_the_skipped_steps(tmp_path: Path):
    """After the rollback, a crash restart replays steps logged with the same windows:
    those are compared, and the trainer's drift (--drift-per-seg) is flagged."""
    run_dir = spiky_run(
        tmp_path / "run", bad_steps=5, steps=100_000, extra=("--drift-per-seg", "0.001")
    )
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: of_kind(run_dir, "spike_outcome"), timeout=60, what="the outcome")
        wait_for(lambda: (daemon.status()["step"] or 0) > 300, timeout=60, what="step 300")
        pid = trainer_pid(run_dir)
        assert pid is not None and belongs_to_run(pid, run_dir)
        kill_between_saves(pid, run_dir, every=10)
        wait_for(lambda: of_kind(run_dir, "resume_drift"), timeout=60, what="resume_drift")
    (drift,) = of_kind(run_dir, "resume_drift")
    assert drift["checkpoint_step"] > 200


def test_a_spike_that_recurs_after_each_rollback_halts_in_diverged(tmp_path: Path):
    run_dir = spiky_run(tmp_path / "run", bad_steps=100_000, steps=100_000)
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("diverged", timeout=120)
    rollbacks = of_kind(run_dir, "rollback")
    assert len(rollbacks) == SPIKE_TABLE["max_rollbacks"]
    assert [r["rollbacks"] for r in rollbacks] == [1, 2]
    spikes = of_kind(run_dir, "spike")
    assert len(spikes) == 3 and spikes[-1]["halts"] is True
    assert [o["outcome"] for o in of_kind(run_dir, "spike_outcome")] == ["recurred"] * 2
    (halt,) = of_kind(run_dir, "halt")
    assert halt["state"] == "diverged" and halt["cause"] == "spike"
    assert "after 2 rollbacks" in status["detail"]["reason"]
    # The windows accumulate: the second restart got both, the LR scaled twice.
    said = starts_said(run_dir)
    assert len(said) == 3 and said[2].endswith("lr_scale 0.25")
    assert said[2].count("], [") == 1  # two windows


def test_a_single_outlier_step_is_noted_and_not_acted_on(tmp_path: Path):
    run_dir = spiky_run(tmp_path / "run", bad_steps=1)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=120)
    (outlier,) = of_kind(run_dir, "spike_outlier")
    assert outlier["first_step"] == BAD_AT and outlier["steps"] == 1
    assert not of_kind(run_dir, "spike") and not of_kind(run_dir, "rollback")
    assert len(of_kind(run_dir, "spawn")) == 1


def test_a_trainer_without_skip_data_gets_a_plain_rollback_and_the_journal_says_so(
    tmp_path: Path,
):
    run_dir = spiky_run(tmp_path / "run", bad_steps=5, supports=[], max_rollbacks=1)
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("diverged", timeout=120)
    first, *_ = of_kind(run_dir, "rollback")
    assert first["window"] is None and first["skip_data"] == []
    assert "does not declare skip_data" in first["note"]
    # The same data again: the spike recurs where it was.
    spikes = of_kind(run_dir, "spike")
    assert [s["first_step"] for s in spikes] == [BAD_AT, BAD_AT]
    assert starts_said(run_dir)[1] == "seg 2, from step 80, skip_data [], lr_scale 1.0"


def test_a_spike_in_the_data_before_the_first_checkpoint_halts_instead_of_starting_over(
    tmp_path: Path,
):
    """Bad data from step 8, the first save at step 10: the only checkpoints are after the
    spike's first step. Rolling back would train from step 0 and skip steps 1 to 8 for
    good: the run halts in diverged and keeps its checkpoints."""
    # Detected 12 steps (0.6 s) into the bad data: checkpoint 10 is verified by then.
    run_dir = spiky_run(
        tmp_path / "run",
        bad_steps=100_000,
        steps=100_000,
        extra=("--dt", "0.05"),
        bad_at=8,
        spike_patience=12,
    )
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("diverged", timeout=60)
    assert "no verified checkpoint before it is left" in status["detail"]["reason"]
    (spike,) = of_kind(run_dir, "spike")
    assert spike["first_step"] == 8
    assert spike["halts"] is True and spike["rollback_to"] is None
    assert not of_kind(run_dir, "rollback") and not of_kind(run_dir, "quarantine")
    assert (run_dir / "checkpoints" / "step_000010.bin").is_file()
    assert len([r for r in journal(run_dir) if r["kind"] == "spawn"]) == 1


def test_a_spike_logged_while_no_daemon_ran_is_found_in_the_lines_caught_up(tmp_path: Path):
    """The daemon is SIGKILLed before the bad data (steps 100 to 124); its trainer goes on
    through it and saves inside it. The next daemon resumes after the bad region's last
    step but the first few, inside a start's warmup: the spike is seen only in the lines it
    catches up from the log. It must roll back to before step 100 all the same."""
    run_dir = spiky_run(tmp_path / "run", bad_steps=25, steps=100_000, extra=("--dt", "0.05"))
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        wait_for(lambda: (daemon.status()["step"] or 0) >= 70, 60, what="step 70")
        daemon.kill()
        log = run_dir / "training.log"
        wait_for(lambda: "step: 121," in log.read_text(), 60, what="the orphan at step 121")
        daemon.start()
        (spike,) = wait_for(lambda: of_kind(run_dir, "spike"), 60, what="the spike")
        (rollback,) = wait_for(lambda: of_kind(run_dir, "rollback"), 30, what="the rollback")
        # The rollback's start is journaled after the rollback, once the old start is gone.
        spawn = wait_for(
            lambda: [r for r in of_kind(run_dir, "spawn") if r.get("rollback_from")][-1:],
            30,
            what="the rollback's start",
        )[0]
    finally:
        daemon.cleanup()
    assert spike["caught_up"] is True and spike["first_step"] == BAD_AT, spike
    assert rollback["step"] <= BAD_AT - SPIKE_TABLE["rollback_steps"], rollback
    assert spawn["resume"]["step"] == rollback["step"] and spawn["rollback_from"] == BAD_AT


def test_the_spike_log_survives_a_daemon_sigkill(tmp_path: Path):
    """After a rollback the daemon is SIGKILLed: the next daemon passes the same windows
    and still counts the rollback, so a recurring spike halts after max_rollbacks = 1."""
    run_dir = spiky_run(tmp_path / "run", bad_steps=100_000, steps=100_000, max_rollbacks=1)
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        wait_for(lambda: of_kind(run_dir, "rollback"), timeout=60, what="a rollback")
        daemon.kill()
        (rollback,) = of_kind(run_dir, "rollback")
        daemon.start()
        status = daemon.wait_state("diverged", timeout=120)
    finally:
        daemon.cleanup()
    assert "after 1 rollback within" in status["detail"]["reason"]
    window = rollback["window"]
    assert all(f"skip_data [{window}]" in said for said in starts_said(run_dir)[1:])


def test_kills_around_a_rollback_leave_one_rollback_and_no_drift(tmp_path: Path):
    """The trainer killed before the spike; the daemon killed as soon as it has journaled
    the rollback (so the lines of the killed start that it had not yet recorded, and the
    restart it had decided, are left to the next daemon); that daemon's first start killed
    at once, the next at its first step, the next later: one rollback, every replay
    compared only with losses of its own data timeline (the bad region's losses of the
    abandoned timeline are never taken for drift), and the run finishes. (The reference
    trainer's bytes through SIGKILLs under skips are proven in
    tests/trainer/test_skip_data.py, and through SIGKILLs under the daemon in
    tests/supervisor/test_daemon.py.)"""
    run_dir = spiky_run(tmp_path / "run", bad_steps=5, steps=400, extra=("--dt", "0.01"))

    def newest_row() -> tuple[int, int]:
        """(seg, step) of .loss.json's newest row."""
        lines = (run_dir / ".loss.json").read_bytes().splitlines() or [b'{"seg":0,"step":0}']
        row = orjson.loads(lines[-1])
        return row["seg"], row["step"]

    def kill(pid: int) -> None:
        assert belongs_to_run(pid, run_dir)
        os.kill(pid, signal.SIGKILL)

    def kill_trainer_at(step: int, after_seg: int) -> None:
        """SIGKILL the trainer once a start later than `after_seg` has logged `step`."""
        wait_for(
            lambda: (row := newest_row())[0] > after_seg and row[1] >= step, 60, 0.005,
            what=f"step {step} of a start after seg {after_seg}",
        )  # fmt: skip
        kill(trainer_pid(run_dir) or 0)

    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        kill_trainer_at(BAD_AT - 30, 0)
        wait_for(lambda: of_kind(run_dir, "rollback"), 60, 0.005, what="the rollback")
        daemon.kill()
        (rollback,) = of_kind(run_dir, "rollback")
        starts = len(of_kind(run_dir, "trainer_started"))
        daemon.start()
        first = wait_for(lambda: of_kind(run_dir, "trainer_started")[starts:], 60, 0.005)[0]
        kill(first["pid"])
        kill_trainer_at(rollback["step"] + 1, first["seg"])
        kill_trainer_at(BAD_AT + 60, first["seg"] + 1)
        daemon.wait_state("finished", timeout=120)
    finally:
        daemon.cleanup()
    assert len(of_kind(run_dir, "rollback")) == 1
    crashes = [r for r in of_kind(run_dir, "crash") if r.get("returncode") == -signal.SIGKILL]
    assert len(crashes) == 4
    assert not of_kind(run_dir, "resume_drift"), of_kind(run_dir, "resume_drift")
    assert of_kind(run_dir, "resume_verified")


GRAD_TRAINER = """
import time
for step in range(1, 100_000):
    norm = 40.0 if step > 60 else 1.0
    print(f"step: {step}, loss: 3.0, dt: 0.005, grad_norm: {norm}", flush=True)
    time.sleep(0.005)
"""


def test_a_grad_norm_spike_is_acted_on_when_grad_norm_factor_is_set(tmp_path: Path):
    """The loss stays flat; the step lines' grad_norm extra jumps 40-fold at step 61."""
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "-c", GRAD_TRAINER],
        trainer={"stop_timeout_s": 10.0},
        restart={"backoff_initial_s": 0.0},
        divergence={**SPIKE_TABLE, "grad_norm_factor": 3.0, "max_rollbacks": 0},
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("diverged", timeout=60)
    (spike,) = of_kind(run_dir, "spike")
    assert (spike["first_step"], spike["step"]) == (61, 61 + PATIENCE - 1)
    assert spike["peak"] == 3.0  # the loss did not move: the grad norm did
