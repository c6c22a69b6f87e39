"""A trainer whose lines the configured parser never matches: the daemon says so, in the
journal and in status, well before it kills the trainer as hung, and the hang names it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import PYTHON, journal, make_run, running_daemon, wait_for

pytestmark = pytest.mark.timeout(180)

NANOGPT_LINES = """\
import time
print("number of parameters: 0.01M", flush=True)
for it in range(1, 100000):
    time.sleep(0.2)
    print(f"iter {it}: loss {3.0 - it / 1000:.4f}, time 200.00ms, mfu 1.00%", flush=True)
"""
"""nanoGPT's own step lines, which the default step-line parser does not read."""

MATCHES_ONCE_TOLD = """\
import pathlib, time
journal = pathlib.Path(".trainwarden/journal.jsonl")
while b"parser_no_match" not in journal.read_bytes():
    print("loading data...", flush=True)
    time.sleep(0.2)
for step in range(1, 100000):
    print(f"step: {step}, loss: 3.0, dt: 0.2", flush=True)
    time.sleep(0.2)
"""
"""Unmatched lines until the daemon has journaled parser_no_match, then step lines."""


def run_of(tmp_path: Path, script: str, stall_timeout_s: float) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.py").write_text(script)
    return make_run(
        run_dir,
        [PYTHON, "train.py"],
        trainer={"stop_timeout_s": 5.0},
        restart={
            "backoff_initial_s": 0.0,
            "backoff_max_s": 1.0,
            "max_restarts_without_progress": 1,
            "stall_timeout_s": stall_timeout_s,
        },
    )


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


def cli_status(run_dir: Path, *flags: str) -> str:
    result = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "status", str(run_dir), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_lines_no_parser_matches_are_reported_and_the_hang_names_it(tmp_path: Path):
    # The bound is stall_timeout_s / 2 = 3 s: reported before the hang at 6 s.
    run_dir = run_of(tmp_path, NANOGPT_LINES, 6.0)
    with running_daemon(run_dir):
        (notice,) = wait_for(lambda: records(run_dir, "parser_no_match"), 60, 0.1)
        assert notice["parser"] == "step-line" and notice["seg"] == 1
        assert notice["sample"].startswith("iter ") and "loss" in notice["sample"]
        status = json.loads(cli_status(run_dir, "--json"))
        shown = status["parser_no_match"]
        assert shown is not None and shown["parser"] == "step-line"
        assert shown["hint"].startswith("no line matched parser step-line; sample: iter ")
        assert shown["hint"].endswith("; set [telemetry] parser")
        assert "hint      no line matched parser step-line; sample: iter " in cli_status(run_dir)

        stall = wait_for(lambda: records(run_dir, "stall"), 60, 0.1)[0]
        assert stall["parser_no_match"]["parser"] == "step-line"
        crash = wait_for(lambda: records(run_dir, "crash"), 60, 0.1)[0]
        assert "no line matched parser step-line" in crash["cause"]
        kinds = [r["kind"] for r in journal(run_dir)]
        assert kinds.index("parser_no_match") < kinds.index("stall")
        # Once per start: the first start's one record, whatever else it printed.
        assert [r["seg"] for r in records(run_dir, "parser_no_match")].count(1) == 1


def test_a_matching_line_clears_it(tmp_path: Path):
    run_dir = run_of(tmp_path, MATCHES_ONCE_TOLD, 20.0)
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: records(run_dir, "parser_no_match"), 60, 0.1)
        status = wait_for(
            lambda: (
                (s := daemon.status())["step"] is not None and s["parser_no_match"] is None and s
            ),
            60,
            0.1,
        )
        assert status["state"] == "running"
        assert "hint" not in cli_status(run_dir)
        assert not records(run_dir, "stall")
