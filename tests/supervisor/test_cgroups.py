"""A start's own cgroup (where the daemon may make one) finds what the marker cannot: a
helper that wiped its environment and left the trainer's tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import PYTHON, journal, make_run, pid_alive, running_daemon, wait_for
from trainwarden.supervisor.shell.cgroups import StartCgroups

# Forks a helper that leaves the trainer's session and tree and runs with an empty
# environment (no start marker), then trains until told to stop or it crashes.
TRAINER = r"""
import os, signal, sys, time
from pathlib import Path

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        Path("helper.pid").write_text(str(os.getpid()))
        os.execve("/bin/sleep", ["sleep", "1000"], {})
    os._exit(0)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
for step in range(1, 10**6):
    print(f"step: {step}, loss: 1.0", flush=True)
    if step == int(sys.argv[1]):
        sys.exit(3)
    time.sleep(0.05)
"""


@pytest.fixture
def cgroups(tmp_path: Path) -> StartCgroups:
    found, why = StartCgroups.find(tmp_path)
    if found is None:
        pytest.skip(f"no cgroup v2 the daemon may write here: {why}")
    return found


@pytest.mark.timeout(120)
def test_a_helper_without_the_marker_is_ended_through_the_start_s_cgroup(
    tmp_path: Path, cgroups: StartCgroups
):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, str(script), "20"],
        trainer={"stop_timeout_s": 2.0},
        restart={"backoff_initial_s": 60.0},
    )
    with running_daemon(run_dir) as daemon:
        helper = wait_for(
            lambda: (
                (run_dir / "helper.pid").exists() and int((run_dir / "helper.pid").read_text() or 0)
            ),
            30,
            what="the helper",
        )
        # It writes its pid file just before its exec drops the environment.
        wait_for(
            lambda: Path(f"/proc/{helper}/cmdline").read_bytes().startswith(b"sleep"),
            30,
            what="the helper's exec",
        )
        assert b"TRAINWARDEN_START" not in Path(f"/proc/{helper}/environ").read_bytes()
        daemon.wait_state("backoff", timeout=60)  # it crashed at step 20
        wait_for(lambda: not pid_alive(helper), 30, what="the helper ended with its start")
        started = next(r for r in journal(run_dir) if r["kind"] == "trainer_started")
        folder = Path(started["cgroup"])
        assert folder.parent == cgroups.base
        leftover = wait_for(
            lambda: next((r for r in journal(run_dir) if r["kind"] == "leftover_processes"), None),
            30,
            what="the leftover record",
        )
        assert helper in [p["pid"] for p in leftover["processes"]]
        wait_for(lambda: not folder.exists(), 30, what="the start's cgroup removed")
        daemon.request("shutdown", timeout=60)
        daemon.wait_exit(60)
    assert not any(n.startswith(folder.name[:25]) for n in os.listdir(folder.parent))


@pytest.mark.timeout(120)
def test_a_helper_forked_in_the_trainers_first_instructions_is_inside_its_cgroup(
    tmp_path: Path, cgroups: StartCgroups
):
    # The shell forks the helper within a millisecond of its exec, before a daemon that
    # moved the trainer after starting it could have done so.
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.replace("if os.fork() == 0:", "if False:", 1))
    command = f"setsid env -i /bin/sleep 1000 & echo $! > helper.pid; exec {PYTHON} {script} 20"
    run_dir = make_run(
        tmp_path / "run",
        ["/bin/sh", "-c", command],
        trainer={"stop_timeout_s": 2.0},
        restart={"backoff_initial_s": 60.0},
    )
    with running_daemon(run_dir) as daemon:
        helper = wait_for(
            lambda: (
                (run_dir / "helper.pid").exists() and int((run_dir / "helper.pid").read_text() or 0)
            ),
            30,
            what="the helper",
        )
        started = next(r for r in journal(run_dir) if r["kind"] == "trainer_started")
        cgroup = Path(f"/proc/{helper}/cgroup").read_text().strip().split("::", 1)[1]
        assert Path(started["cgroup"]).name == Path(cgroup).name, "the helper escaped"
        daemon.wait_state("backoff", timeout=60)  # it crashed at step 20
        wait_for(lambda: not pid_alive(helper), 30, what="the helper ended with its start")
        daemon.request("shutdown", timeout=60)
