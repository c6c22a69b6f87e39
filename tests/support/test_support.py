"""The shared scaffolding's own guarantees: the ownership check that guards every kill of a
recorded pid accepts the run's processes and nobody else's, and the waits report a miss."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support import WaitTimeout, belongs_to_run, make_run, pid_alive, poll, wait_for
from tests.support.procs import runs_reference_trainer

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def started(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **(env or {})})
    wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 10, 0.01, what="exec")
    return proc


def test_a_process_belongs_to_the_run_it_works_in_was_started_for_or_names(tmp_path: Path):
    run, other = tmp_path / "run", tmp_path / "run-2"
    run.mkdir()
    other.mkdir()
    procs = {
        "cwd": started(SLEEP, run),
        "env": started(SLEEP, other, {"TRAINWARDEN_RUN_DIR": str(run)}),
        "argv": started([*SLEEP, str(run / "checkpoints")], other),
        "stranger": started([*SLEEP, str(other)], other, {"TRAINWARDEN_RUN_DIR": str(other)}),
    }
    try:
        verdicts = {name: belongs_to_run(p.pid, run) for name, p in procs.items()}
        assert verdicts == {"cwd": True, "env": True, "argv": True, "stranger": False}
        # Working in the run is not enough when the reference trainer is asked for.
        assert not belongs_to_run(procs["cwd"].pid, run, reference_trainer=True)
    finally:
        for p in procs.values():
            p.kill()
            p.wait(10)
    assert not belongs_to_run(None, run)


def test_a_zombie_is_neither_alive_nor_anybodys(tmp_path: Path):
    proc = subprocess.Popen(["true"], cwd=tmp_path)
    wait_for(
        lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z",
        10,
        0.01,
        what="the child to exit (unreaped)",
    )
    try:
        assert not pid_alive(proc.pid)
        assert not belongs_to_run(proc.pid, tmp_path)
    finally:
        proc.wait(10)


def test_both_ways_of_starting_the_reference_trainer_are_recognised():
    assert runs_reference_trainer([b"/venv/bin/python", b"-m", b"trainwarden.trainer", b"--steps"])
    assert runs_reference_trainer([b"/venv/bin/python", b"/venv/bin/trainwarden-trainer"])
    assert runs_reference_trainer([b"/venv/bin/trainwarden-trainer", b"--steps", b"10"])
    assert not runs_reference_trainer([b"python", b"-m", b"trainer"])
    assert not runs_reference_trainer([b"python", b"tests/scripted_trainer.py", b"-m"])


def test_make_run_writes_exactly_the_tables_given(tmp_path: Path):
    import tomllib

    run = make_run(tmp_path / "run", ["python", "train.py"], restart={"backoff_initial_s": 0.0})
    assert tomllib.loads((run / "trainwarden.toml").read_text()) == {
        "trainer": {"command": ["python", "train.py"]},
        "restart": {"backoff_initial_s": 0.0},
    }


def test_wait_for_names_what_it_missed_and_poll_returns_none():
    t0 = time.monotonic()
    try:
        wait_for(lambda: False, 0.1, 0.01, what="the impossible")
    except WaitTimeout as exc:
        assert "the impossible" in str(exc)
    else:
        raise AssertionError("wait_for returned on a predicate that never held")
    assert poll(lambda: 0, 0.1, 0.01) is None
    assert poll(lambda: "yes", 0.1) == "yes"
    assert time.monotonic() - t0 < 5
