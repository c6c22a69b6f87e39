"""Held-out evaluations under a real daemon: `.eval.json`, `status`, the telemetry topic,
`history` replies and /metrics carry them; a nan validation loss is reported, never a
divergence; they survive a daemon SIGKILL and a full disk.

The trainer is tests/scripted_trainer.py with `--eval-every`: its evaluation at step N is
`val_loss 5.2 - 0.001 N`, `val_docs` 0.1 below it and `val_code` 0.1 above.
"""

from __future__ import annotations

import math
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.supervisor.test_disk_full import Mounts, daemon_for, fill, small_run, write_fails
from tests.support import (
    PYTHON,
    journal,
    journal_kinds,
    make_run,
    refused_start,
    running_daemon,
    scripted_run,
    wait_for,
)
from trainwarden.supervisor.serve.metrics import start_metrics_server

pytestmark = pytest.mark.timeout(240)


def val_of(step: int) -> float:
    return 5.2 - 0.001 * step


def eval_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (run_dir / ".eval.json").read_bytes().splitlines()]


def newest_val(daemon: Any, at_least: int) -> dict[str, Any]:
    return wait_for(
        lambda: (s := daemon.status())["val"] and s["val"]["step"] >= at_least and s,
        60,
        what=f"an evaluation at step {at_least} or later",
    )


def offset_past(run_dir: Path, text: str) -> bool:
    """The daemon's saved log offset is past the line that holds `text`."""
    log = (run_dir / "training.log").read_bytes()
    try:
        offset = int((run_dir / ".trainwarden" / "log.offset").read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    at = log.find(text.encode())
    return at >= 0 and offset > at


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_evaluations_reach_the_eval_file_status_history_and_metrics(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--dt", "0.03", "--eval-every", "10",
        metrics={"listen": "127.0.0.1:0"},
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        listening = next(r for r in journal(run_dir) if r["kind"] == "metrics_listening")
        before = scrape(listening["url"])
        # Read after the scrape: with no evaluation in the file now, none was there then.
        evaluated_before = (run_dir / ".eval.json").exists() and bool(
            (run_dir / ".eval.json").read_bytes().strip()
        )
        status = newest_val(daemon, 50)
        metrics = scrape(listening["url"])
        history = daemon.request("history", points=1000)
        ranged = daemon.request("history", start=20, end=40, points=1000)
        thinned = daemon.request("history", points=3)

    assert evaluated_before or not [
        name for name, _ in before if name.startswith("trainwarden_val")
    ], "no validation figure before the first evaluation"
    val = status["val"]
    step = val["step"]
    assert step % 10 == 0
    assert val["loss"] == pytest.approx(val_of(step))
    assert val["extras"] == {
        "val_docs": pytest.approx(val_of(step) - 0.1),
        "val_code": pytest.approx(val_of(step) + 0.1),
    }
    assert val["seg"] == 1 and val["age_s"] is not None and val["age_s"] >= 0
    assert (status["val_step"], status["val_loss"]) == (step, val["loss"])
    # Evaluations move neither the step count nor the training loss.
    assert status["step"] >= step and status["loss"] == pytest.approx(5 - 0.001 * status["step"])

    written = eval_lines(run_dir)
    assert [r["step"] for r in written] == list(range(10, 10 * len(written) + 1, 10))
    assert all(r["seg"] == 1 and r["loss"] == pytest.approx(val_of(r["step"])) for r in written)

    series = history["val"]
    assert series["step"][: step // 10] == list(range(10, step + 1, 10))
    assert series["loss"] == [pytest.approx(val_of(s)) for s in series["step"]]
    assert ranged["val"]["step"] == [20, 30, 40]
    assert len(thinned["val"]["step"]) == 3
    assert thinned["val"]["step"][0] == 10 and thinned["val"]["step"][-1] >= step

    assert metrics[("trainwarden_val_step", ())] >= step
    val_step = metrics[("trainwarden_val_step", ())]
    assert metrics[("trainwarden_val_loss", ())] == pytest.approx(val_of(val_step))
    assert metrics[("trainwarden_val_arm_loss", (("arm", "docs"),))] == pytest.approx(
        val_of(val_step) - 0.1
    )
    assert metrics[("trainwarden_val_arm_loss", (("arm", "code"),))] == pytest.approx(
        val_of(val_step) + 0.1
    )


def test_a_nan_validation_loss_is_reported_and_the_trainer_trains_on(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "45", "--dt", "0.02", "--eval-every", "10",
        "--val-nan-at", "40", "--save-every", "5",
        trainer={"stop_timeout_s": 10.0, "total_steps": 45},
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("finished", timeout=120)
        said = subprocess.run(
            [PYTHON, "-m", "trainwarden.supervisor", "status", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert status["step"] == 45 and status["restarts"] == 0
    assert status["val"]["step"] == 40 and status["val"]["loss"] == "nan"
    assert status["val"]["extras"] == {"val_docs": "nan", "val_code": "nan"}
    assert status["val_loss"] == "nan"
    records = journal(run_dir)
    kinds = [r["kind"] for r in records]
    nans = [(r["step"], r["seg"]) for r in records if r["kind"] == "val_nan"]
    assert nans == [(40, 1)], "journaled once"
    assert "divergence" not in kinds and kinds.count("trainer_started") == 1
    assert not (run_dir / "checkpoints" / "quarantine").exists() or not list(
        (run_dir / "checkpoints" / "quarantine").iterdir()
    ), "a nan evaluation quarantines nothing"
    assert said.returncode == 0, said.stderr
    line = next(x for x in said.stdout.splitlines() if x.startswith("val "))
    assert "nan at step 40" in line and "not a training divergence" in line
    assert math.isnan(float(eval_lines(run_dir)[-1]["loss"]))


def test_evaluations_survive_a_daemon_sigkill_and_restart(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--dt", "0.01", "--eval-every", "10"
    )
    with running_daemon(run_dir) as daemon:
        newest_val(daemon, 30)
        # Killed once the saved log offset is past the first evaluations: the next daemon
        # does not read them from the log again, only from .eval.json.
        wait_for(lambda: offset_past(run_dir, "eval: step 30,"), 60, what="the offset saved")
        before = daemon.status()["val"]
        daemon.kill()
        daemon.start()
        # Read back from .eval.json at start, before the trainer logs another evaluation.
        after = daemon.status()["val"]
        assert after is not None and after["step"] >= before["step"]
        newest_val(daemon, after["step"] + 20)
        history = daemon.request("history", points=1000)
    steps = history["val"]["step"]
    assert steps == list(range(10, steps[-1] + 1, 10)), "each evaluation once, none lost"
    assert steps[-1] >= before["step"] + 20


def test_a_full_disk_holds_evaluations_and_writes_them_when_space_returns(
    tmp_path: Path, mounts: Mounts
):
    run_dir = small_run(
        tmp_path, mounts, "--steps", "700", "--dt", "0.02", "--save-every", "100000",
        "--eval-every", "10",
    )  # fmt: skip
    daemon = daemon_for(run_dir, tmp_path)
    try:
        daemon.start()
        newest_val(daemon, 40)
        fill(run_dir / "filler")
        assert write_fails(run_dir)
        full = wait_for(
            lambda: (
                (s := daemon.status())
                and ".eval.json" in {Path(f).name for f in s.get("disk_full_files") or []}
                and s
            ),
            60,
            interval=0.2,
            what=".eval.json full",
        )
        assert full["val"]["step"] < 700
        # The trainer finishes on the full disk: no evaluation comes to carry the held ones
        # out; the daemon's retry has to.
        daemon.wait_state("finished", timeout=120)
        assert write_fails(run_dir)
        (run_dir / "filler").unlink()
        wait_for(lambda: daemon.status().get("disk_full") is False, 30, what="disk_full false")
        data = (run_dir / ".eval.json").read_bytes()
        assert daemon.alive
    finally:
        daemon.cleanup()
    assert data.endswith(b"\n"), "whole lines only"
    steps = [orjson.loads(line)["step"] for line in data.splitlines()]
    assert sorted(steps) == list(range(10, 701, 10)), "every evaluation once, none lost"
    recovered = [r for r in journal(run_dir) if r["kind"] == "disk_recovered"]
    assert {r["lost_records"] for r in recovered if r["file"].endswith(".eval.json")} == {0}


def test_metrics_carry_the_newest_evaluation_and_leave_it_out_before_one():
    snapshots: list[dict[str, Any]] = [
        {"state": "running", "val": None},
        {
            "state": "running",
            "val": {"step": 600, "loss": "nan", "extras": {"val_web": 3.5, "ppl": 20.0}},
        },
    ]
    server = start_metrics_server("127.0.0.1:0", lambda: snapshots[0])
    try:
        empty = scrape(server.url)
        snapshots.pop(0)
        nan = scrape(server.url)
    finally:
        server.close()
    assert not [name for name, _ in empty if name.startswith("trainwarden_val")]
    assert math.isnan(nan[("trainwarden_val_loss", ())])
    assert nan[("trainwarden_val_step", ())] == 600.0
    arms = {k[1]: v for k, v in nan.items() if k[0] == "trainwarden_val_arm_loss"}
    assert arms == {(("arm", "web"),): 3.5}, "only val_ARM extras are arms"


def test_an_evaluation_moves_neither_the_step_count_nor_the_policy(tmp_path: Path):
    # An evaluation far ahead of the training steps, and a nan one: were either read as a
    # step, the count would jump (an implausible step) or the run would diverge.
    lines = [
        "step: 1, loss: 5.0, dt: 0.01",
        "eval: step 900000, val_loss 2.0",
        "step: 2, loss: 4.9, dt: 0.01",
        "eval: step 2, val_loss nan",
        "step: 3, loss: 4.8, dt: 0.01",
    ]
    script = "import time\nfor line in %r:\n    print(line, flush=True)\n    time.sleep(0.05)\n"
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "-c", script % (lines,)],
        restart={"backoff_initial_s": 0.0, "max_restarts_without_progress": 1},
    )
    with running_daemon(run_dir) as daemon:
        status = daemon.wait_state("finished", timeout=60)
    assert status["step"] == 3 and status["loss"] == pytest.approx(4.8)
    assert (status["val"]["step"], status["val"]["loss"]) == (2, "nan")
    losses = [orjson.loads(x) for x in (run_dir / ".loss.json").read_bytes().splitlines()]
    assert [r["step"] for r in losses] == [1, 2, 3]
    assert [r["step"] for r in eval_lines(run_dir)] == [900000, 2]
    kinds = journal_kinds(run_dir)
    assert "divergence" not in kinds and "val_nan" in kinds


def test_a_run_log_naming_the_validation_history_is_refused(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "10", run={"log": ".eval.json"})
    line = refused_start(run_dir)
    assert "'run.log' = '.eval.json'" in line and "names the validation history" in line
