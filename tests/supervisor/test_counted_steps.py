"""A parser that numbers steps by counting lines (hf-trainer: the Trainer's printed dicts
carry no step) keeps every line's true step across a daemon restart.

The trainer below prints `{'loss': ...}` dicts whose loss encodes the step (5 + step/1000),
saves at step 20, and stops at a gate after step 24 until the test lets it go on. The
daemon is SIGKILLed at the gate; the trainer logs steps 25-40 with no daemon watching; a
new daemon catches those lines up from the log, stops the trainer (it has no SIGTERM
handler, as a plain Trainer has none) and restarts it from step 20.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import orjson

from tests.support.daemon import DaemonProcess
from tests.support.runs import PYTHON, journal, make_run
from tests.support.wait import wait_for
from trainwarden.supervisor.store.losshistory import LossHistory

DICT_TRAINER = textwrap.dedent(
    """
    import os, struct, sys, time
    from pathlib import Path

    steps, save_at, gate = 40, 20, 24
    run = Path(os.environ["TRAINWARDEN_RUN_DIR"])
    resume = os.environ.get("TRAINWARDEN_RESUME")
    start = struct.unpack("<ii", open(resume, "rb").read(8))[0] if resume else 0
    for step in range(start + 1, steps + 1):
        time.sleep(0.02)
        print({"loss": f"{5 + step / 1000:.4g}", "learning_rate": "0.001", "epoch": "0.5"})
        sys.stdout.flush()
        if step == save_at:
            final = run / "checkpoints" / f"step_{step:06d}.bin"
            tmp = final.with_name(final.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(struct.pack("<ii", step, 1) + bytes(12))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        if step == gate:
            while not (run / "go").exists():
                time.sleep(0.02)
    if os.environ.get("TRAINWARDEN_SEG") == "1":
        while True:  # the first start waits to be stopped by the restarted daemon
            time.sleep(1)
    """
)


def loss_rows(run: Path) -> list[dict]:
    path = run / ".loss.json"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def logged_loss_lines(run: Path) -> int:
    log = run / "training.log"
    return log.read_text().count("'loss'") if log.exists() else 0


def test_lines_caught_up_after_a_daemon_restart_keep_their_steps(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer.py").write_text(DICT_TRAINER)
    make_run(
        run,
        [PYTHON, str(run / "trainer.py")],
        trainer={"stop_timeout_s": 5.0},
        restart={"backoff_initial_s": 0.0, "stall_timeout_s": 120.0},
        telemetry={"parser": "hf-trainer"},
    )
    daemon = DaemonProcess(run)
    try:
        daemon.start()
        wait_for(lambda: any(r["step"] == 24 for r in loss_rows(run)), 120, 0.05, what="step 24")
        daemon.kill()
        (run / "go").touch()
        wait_for(lambda: logged_loss_lines(run) >= 40, 120, 0.05, what="steps 25-40 logged")
        daemon.start()
        wait_for(
            lambda: any(r["kind"] == "spawn" and r["seg"] == 2 for r in journal(run)),
            120,
            0.1,
            what="the restart after the daemon's",
        )
        first_start = [r for r in loss_rows(run) if r["seg"] == 1]
        # Every line of the first start, those caught up included, under its true step.
        assert [r["step"] for r in first_start if r["step"] > 24] == list(range(25, 41))
        for row in first_start:
            assert row["loss"] == float(f"{5 + row['step'] / 1000:.4g}"), row
        recovery = [r for r in journal(run) if r["kind"] == "boot_recovery"]
        assert recovery[-1]["last_logged_step"] == 40
        assert recovery[-1]["resume_step"] == 20
        assert recovery[-1]["steps_lost"] == 20
    finally:
        daemon.cleanup()


def test_a_segments_last_step_is_found_behind_older_segments_steps():
    history = LossHistory()
    for step in range(1, 41):
        history.add(step, 5.0, 0.1, float(step), 1)
    for step in range(21, 26):  # the second start resumed from step 20
        history.add(step, 4.0, 0.1, 100.0 + step, 2)
    assert history.last_step == 40
    assert history.last_step_of(2) == 25
    assert history.last_step_of(2, above=20) == 25
    assert history.last_step_of(1) == 40
    assert history.last_step_of(3, above=25) is None
    assert history.last_step_of(3) is None
