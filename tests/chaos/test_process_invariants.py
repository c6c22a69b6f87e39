"""The soak's process invariants and their witnesses, at the smallest scale: the judge's
verdicts on synthetic records, the watcher against real marked processes (no daemon), and
the forking wrapper's process tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import WRAPPER, trainer_command
from tests.chaos.judge import nothing_left_verdict, old_starts_verdict, two_trainers_verdict
from tests.chaos.test_chaos_soak import FAST, NO_SIGUSR1
from tests.chaos.watcher import run_processes
from tests.support import PYTHON, REPO, kill_quietly, wait_for
from tests.support.procs import runs_reference_trainer

pytestmark = pytest.mark.timeout(60)

SLEEPER = [PYTHON, "-c", "import time; time.sleep(600)"]
FAKE_TRAINER = [PYTHON, "-c", "import time; time.sleep(600)", "-m", "trainwarden.trainer"]
"""A process whose command line reads as the reference trainer's (`-m trainwarden.trainer`)."""


def proc(pid: int, marker: str, trainer: bool = False) -> dict[str, object]:
    return {"pid": pid, "marker": marker, "trainer": trainer, "cmdline": "x"}


# ----------------------------------------------------------------------------- the judge


def test_old_starts_verdict_flags_an_older_process_at_a_spawn():
    watch = [
        {"kind": "at_spawn", "t": 1.0, "record": "spawn", "seg": 2, "marker": "2-b", "older": [
            proc(10, "1-a")], "same": 0},
    ]  # fmt: skip
    records = [{"kind": "spawn", "marker": "2-b"}, {"kind": "leftover_processes", "processes": []}]
    verdict = old_starts_verdict(watch, records, wrapped=False)
    assert not verdict.ok
    assert "older starts" in verdict.detail["problems"][0]


def test_old_starts_verdict_flags_two_starts_alive_at_once():
    watch = [{"kind": "two_starts", "t": 1.0, "markers": {"1-a": [10], "2-b": [11]}, "procs": []}]
    assert not old_starts_verdict(watch, [], wrapped=False).ok


def test_old_starts_verdict_wants_checks_and_journaled_helpers():
    records = [{"kind": "spawn", "marker": "1-a"}]
    assert not old_starts_verdict([], records, wrapped=False).ok
    clean = [{"kind": "at_spawn", "t": 1.0, "record": "spawn", "seg": 1, "marker": "1-a",
              "older": [], "same": 0}]  # fmt: skip
    assert old_starts_verdict(clean, records, wrapped=False).ok
    # With the wrapper every start leaves a helper: none journaled as stopped is a failure.
    assert not old_starts_verdict(clean, records, wrapped=True).ok
    stopped = [*records, {"kind": "leftover_processes", "processes": [{"pid": 5}]}]
    assert old_starts_verdict(clean, stopped, wrapped=True).ok


def test_two_trainers_verdict():
    assert two_trainers_verdict([{"kind": "stats", "proc_scans": 3}]).ok
    assert not two_trainers_verdict([{"kind": "two_trainers", "t": 1.0, "pids": [1, 2]}]).ok
    both = [proc(1, "1-a", True), proc(2, "2-b", True)]
    assert not two_trainers_verdict([{"kind": "two_run_trainers", "t": 1.0, "procs": both}]).ok


def test_nothing_left_verdict():
    assert nothing_left_verdict([], None).ok
    assert not nothing_left_verdict([proc(7, "3-c")], [proc(7, "3-c")]).ok
    assert not nothing_left_verdict(None, None).ok


# ----------------------------------------------------------------------------- the watcher


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the test started; at the end they and every process marked as one of a
    run under tmp_path (a wrapper's helper) are killed, each by its pid."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        kill_quietly(p.pid, group=False)
        p.wait(10)
    for left in run_processes(str(tmp_path)):
        kill_quietly(int(left["pid"]), group=False)  # type: ignore[call-overload]


def marked(run_dir: Path, marker: str, argv: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TRAINWARDEN_RUN_DIR": str(run_dir), "TRAINWARDEN_START": marker}
    return subprocess.Popen(argv, cwd=run_dir, env=env)


def watch(run_dir: Path, out: Path) -> subprocess.Popen[bytes]:
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    return subprocess.Popen(
        [PYTHON, "-m", "tests.chaos.watcher", "--checkpoints", str(run_dir / "checkpoints"),
         "--run-dir", str(run_dir), "--out", str(out)],
        cwd=REPO,
    )  # fmt: skip


def rows(out: Path) -> list[dict[str, object]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line]


def stop(watcher: subprocess.Popen[bytes], out: Path) -> list[dict[str, object]]:
    watcher.send_signal(signal.SIGTERM)
    watcher.wait(20)
    return rows(out)


def test_the_watcher_sees_an_old_start_alive_at_a_spawn_and_two_trainers(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
):
    run_dir = tmp_path / "run"
    (run_dir / ".trainwarden").mkdir(parents=True)
    journal = run_dir / ".trainwarden" / "journal.jsonl"
    journal.write_text("")
    started.append(marked(run_dir, "1-aaa", FAKE_TRAINER))
    started.append(marked(run_dir, "1-aaa", SLEEPER))
    out = tmp_path / "watch.jsonl"
    watcher = watch(run_dir, out)
    started.append(watcher)
    wait_for(lambda: len(run_processes(str(run_dir))) == 2, 10, what="two marked processes")
    with open(journal, "a") as f:
        f.write(json.dumps({"kind": "spawn", "t": time.time(), "seg": 2, "marker": "2-bbb"}))
        f.write("\n")
    started.append(marked(run_dir, "2-bbb", FAKE_TRAINER))
    wait_for(
        lambda: {"at_spawn", "two_starts", "two_run_trainers"} <= {r["kind"] for r in rows(out)},
        20,
        what="the watcher's records",
    )
    found = stop(watcher, out)
    at_spawn = next(r for r in found if r["kind"] == "at_spawn")
    assert at_spawn["marker"] == "2-bbb"
    assert {p["pid"] for p in at_spawn["older"]} == {started[0].pid, started[1].pid}  # type: ignore[index, union-attr]
    two = next(r for r in found if r["kind"] == "two_starts")
    assert set(two["markers"]) == {"1-aaa", "2-bbb"}  # type: ignore[arg-type]
    assert not old_starts_verdict(found, [], wrapped=False).ok
    assert not two_trainers_verdict(found).ok


def test_the_watcher_is_quiet_for_one_start(tmp_path: Path, started: list[subprocess.Popen[bytes]]):
    run_dir = tmp_path / "run"
    (run_dir / ".trainwarden").mkdir(parents=True)
    journal = run_dir / ".trainwarden" / "journal.jsonl"
    journal.write_text(json.dumps({"kind": "spawn", "t": 0, "seg": 1, "marker": "1-aaa"}) + "\n")
    started.append(marked(run_dir, "1-aaa", FAKE_TRAINER))
    started.append(marked(run_dir, "1-aaa", SLEEPER))
    # Another run's start, and a process of no start: neither is this run's.
    started.append(marked(tmp_path, "9-zzz", FAKE_TRAINER))
    started.append(subprocess.Popen(SLEEPER, cwd=tmp_path))
    out = tmp_path / "watch.jsonl"
    watcher = watch(run_dir, out)
    started.append(watcher)
    wait_for(lambda: any(r["kind"] == "at_spawn" for r in rows(out)), 10, what="a spawn check")
    time.sleep(0.5)
    found = stop(watcher, out)
    assert old_starts_verdict(found, [], wrapped=False).ok, found
    assert two_trainers_verdict(found).ok, found
    stats = next(r for r in found if r["kind"] == "stats")
    assert stats["starts_seen"] == 1


# ----------------------------------------------------------------------------- the wrapper


def helper_of(run_dir: Path, marker: str, main: int) -> dict[str, object]:
    def found() -> dict[str, object] | None:
        return next(
            (
                p
                for p in run_processes(str(run_dir))
                if p["pid"] != main and "time.sleep(3600)" in str(p["cmdline"])
            ),
            None,
        )

    return wait_for(found, 10, what=f"the helper of {marker}")


def sig_bits(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(field)


@pytest.mark.parametrize("stubborn", [False, True])
def test_the_wrapper_execs_the_command_and_leaves_a_helper_in_its_own_session(
    tmp_path: Path, started: list[subprocess.Popen[bytes]], stubborn: bool
):
    run_dir = tmp_path
    env_args = ["--stubborn-every", "1"] if stubborn else []
    main = marked(run_dir, "1-aaa", [PYTHON, str(WRAPPER), *env_args, "--", *FAKE_TRAINER])
    started.append(main)
    helper = helper_of(run_dir, "1-aaa", main.pid)
    hpid = int(helper["pid"])  # type: ignore[call-overload]
    wait_for(
        lambda: any(p["pid"] == main.pid and p["trainer"] for p in run_processes(str(run_dir))),
        10,
        what="the exec",
    )
    assert os.getsid(hpid) not in (os.getsid(main.pid), os.getsid(0))
    term = 1 << (signal.SIGTERM - 1)
    if stubborn:
        wait_for(lambda: sig_bits(hpid, "SigIgn") & term, 10, what="SIGTERM ignored")
    else:
        time.sleep(0.3)
        assert not sig_bits(hpid, "SigIgn") & term


def test_the_staying_wrapper_ignores_sigusr1_and_passes_sigterm_on(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
):
    child_code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
        "signal.signal(signal.SIGUSR1, lambda *_: print('saved', flush=True))\n"
        "time.sleep(600)\n"
    )
    main = marked(
        tmp_path, "1-aaa", [PYTHON, str(WRAPPER), "--stay", "--no-helper", "--", PYTHON, "-c",
                            child_code, "-m", "trainwarden.trainer"]
    )  # fmt: skip
    started.append(main)
    wait_for(lambda: any(p["trainer"] for p in run_processes(str(tmp_path))), 10, what="the child")
    usr1 = 1 << (signal.SIGUSR1 - 1)
    wait_for(lambda: sig_bits(main.pid, "SigIgn") & usr1, 10, what="SIGUSR1 ignored")
    assert not sig_bits(main.pid, "SigCgt") & usr1
    assert sig_bits(main.pid, "SigCgt") & (1 << (signal.SIGTERM - 1))
    os.kill(main.pid, signal.SIGUSR1)
    time.sleep(0.2)
    assert main.poll() is None
    main.send_signal(signal.SIGTERM)
    assert main.wait(10) == 3


def test_the_soaks_wrapped_command_does_not_read_as_a_trainer_before_it_execs():
    """The wrapper and its forks (before the helper's exec) carry the wrapper's command
    line: were it to name `-m trainwarden.trainer`, every start would look like two
    trainers for a moment."""
    for plan in (FAST, NO_SIGUSR1):
        command = trainer_command(plan, "--nan-at-step", "7")
        assert command[1] == str(WRAPPER)
        assert not runs_reference_trainer([a.encode() for a in command])
        i = command.index("--python-module")
        unwrapped = [PYTHON, "-m", command[i + 1], *command[command.index("--") + 1 :]]
        assert runs_reference_trainer([a.encode() for a in unwrapped])
