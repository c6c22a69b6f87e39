"""A trainer's save reports through the real daemon: the newest save's stall and write time
in status, in the metrics endpoint and in `trainwarden status`; kept across a trainer
start, forgotten by a daemon restart, never taken from stray output."""

from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import PYTHON, journal, running_daemon, scripted_run, wait_for
from trainwarden.supervisor.cli.output import save_text

pytestmark = pytest.mark.timeout(180)

# Read with a pattern of the test's own, not the contract's parser.
REPORT = re.compile(r"^checkpoint: (step_\d+\.bin) saved \(.*stall ([\d.]+) s, write ([\d.]+) s\)$")


def reported(run_dir: Path) -> list[tuple[str, float, float]]:
    """The save reports in the trainer's log, oldest first."""
    lines = (run_dir / "training.log").read_text().splitlines()
    return [(m[1], float(m[2]), float(m[3])) for line in lines if (m := REPORT.match(line))]


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def cli_status(run_dir: Path) -> str:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "status", str(run_dir)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
    }


def saved(status: dict[str, Any]) -> tuple[Any, Any, Any]:
    return status["last_save_name"], status["last_save_stall_s"], status["last_save_write_s"]


def reporting_run(run_dir: Path) -> Path:
    return scripted_run(
        run_dir, "--steps", "30", "--save-every", "10", "--dt", "0.02", "--save-report",
        metrics={"listen": "127.0.0.1:0"},
    )  # fmt: skip


def test_the_newest_save_report_reaches_status_metrics_and_the_cli(tmp_path: Path):
    run_dir = reporting_run(tmp_path / "run")
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished")
        reports = reported(run_dir)
        assert [name for name, _, _ in reports] == [
            "step_000010.bin", "step_000020.bin", "step_000030.bin"
        ]  # fmt: skip
        name, stall, write = reports[-1]
        status = daemon.status()
        assert saved(status) == (name, stall, write)
        assert status["last_save_age_s"] is not None
        (listening,) = records(run_dir, "metrics_listening")
        samples = scrape(listening["url"])
        assert samples["trainwarden_checkpoint_stall_seconds"] == stall
        assert samples["trainwarden_checkpoint_write_seconds"] == write
        # The scripted trainer saves synchronously: one figure, the stall.
        assert f"last save ({name}) stall {stall:.2f} s" in cli_status(run_dir)
        assert "in the background" not in cli_status(run_dir)
        # A new start that saves nothing: the figures are still the newest save's.
        daemon.request("start")
        wait_for(lambda: len(records(run_dir, "spawn")) == 2, 60, what="the second start")
        daemon.wait_state("finished")
        assert saved(daemon.status()) == (name, stall, write)
    with running_daemon(run_dir) as daemon:
        # Not journaled: a daemon restart knows no save until the trainer reports one.
        status = daemon.status()
        assert saved(status) == (None, None, None) and status["last_save_age_s"] is None
        listening = wait_for(lambda: records(run_dir, "metrics_listening")[1:], 60, what="metrics")[
            -1
        ]
        samples = scrape(listening["url"])
        assert "trainwarden_checkpoint_stall_seconds" not in samples
        assert "trainwarden_checkpoint_write_seconds" not in samples
        assert "last save" not in cli_status(run_dir)


def test_a_report_after_the_start_ended_is_stray_output_not_a_save(tmp_path: Path):
    run_dir = reporting_run(tmp_path / "run")
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished")
        newest = saved(daemon.status())
        assert newest[0] == "step_000030.bin"
        # What a leftover helper of the finished start would print.
        with open(run_dir / "training.log", "a") as log:
            log.write("checkpoint: step_000099.bin saved (scheduled, 1.0 MB, stall 7.0 s)\n")
        (stray,) = wait_for(lambda: records(run_dir, "stray_output"), 60, what="stray_output")
        assert stray["first"].startswith("checkpoint: step_000099.bin")
        assert saved(daemon.status()) == newest


@pytest.mark.parametrize(
    ("stall", "write", "text"),
    [
        (0.058, 3.214, "last save (step_000600.bin) stall 0.06 s (write 3.21 s in the background)"),
        (3.3, 3.214, "last save (step_000600.bin) stall 3.30 s"),
        (3.0, 3.214, "last save (step_000600.bin) stall 3.00 s"),
        (0.058, None, "last save (step_000600.bin) stall 0.06 s"),
        (None, 3.214, "last save (step_000600.bin) write 3.21 s"),
        (None, None, ""),
    ],
)
def test_the_status_text_says_stall_and_a_background_write_only_when_there_was_one(
    stall: float | None, write: float | None, text: str
):
    status: Any = {
        "last_save_name": "step_000600.bin", "last_save_stall_s": stall, "last_save_write_s": write
    }  # fmt: skip
    assert save_text(status) == text


def test_the_status_text_cleans_the_name_the_trainer_gave():
    status: Any = {
        "last_save_name": "\x1b]0;owned\x07step_1.bin\x1b[2J", "last_save_stall_s": 0.5,
        "last_save_write_s": None,
    }  # fmt: skip
    assert save_text(status) == "last save (step_1.bin) stall 0.50 s"
