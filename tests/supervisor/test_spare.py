"""The spare start (shell.spare): the next start's process, made ahead inside its cgroup,
becomes the trainer at a restart exactly as a spawned one would be, and never outlives
the daemon's need of it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import (
    PYTHON,
    DaemonProcess,
    journal,
    make_run,
    pid_alive,
    running_daemon,
    wait_for,
)
from trainwarden.supervisor.shell.cgroups import StartCgroups
from trainwarden.supervisor.shell.spare import is_spare

# Records what a start is as a process, then trains; the first start crashes at step 12
# (after 0.6 s, once its spare is ready), the others run until SIGTERM.
TRAINER = r"""
import json, os, signal, sys, time
from pathlib import Path

status = open("/proc/self/status").read()
facts = {
    "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "cwd": os.getcwd(),
    "marker": os.environ.get("TRAINWARDEN_START"), "stdin": os.readlink("/proc/self/fd/0"),
    "sigign": next(l for l in status.splitlines() if l.startswith("SigIgn:")).split()[1],
    "cgroup": open("/proc/self/cgroup").read().strip().split("::", 1)[1],
    "fds": sorted(os.listdir("/proc/self/fd")),
    "bytes": os.environb.get(b"TW_TEST_BYTES", b"").hex(),
}
Path(f"facts-{os.getpid()}.tmp").write_text(json.dumps(facts))
os.rename(f"facts-{os.getpid()}.tmp", f"facts-{os.getpid()}.json")  # read whole or not at all
print(f"hello from {os.getpid()}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
for step in range(1, 10**6):
    print(f"step: {step}, loss: 1.0", flush=True)
    if step == 12 and not Path("crashed").exists():
        Path("crashed").touch()
        sys.exit(3)
    time.sleep(0.05)
"""

NO_BACKOFF = {"backoff_initial_s": 0.0, "backoff_max_s": 0.0}


@pytest.fixture
def cgroups(tmp_path: Path) -> StartCgroups:
    found, why = StartCgroups.find(tmp_path / "run")
    if found is None:
        pytest.skip(f"no cgroup v2 the daemon may write here: {why}")
    return found


def _run(tmp_path: Path, restart: dict[str, Any], executable: bool = False) -> Path:
    script = tmp_path / "trainer.py"
    script.write_text(f"#!{PYTHON}\n{TRAINER}")
    command = [str(script)] if executable else [PYTHON, str(script)]
    if executable:
        script.chmod(0o755)
    return make_run(tmp_path / "run", command, restart=restart, trainer={"stop_timeout_s": 5.0})


def _spares(daemon_pid: int, cgroups: StartCgroups) -> list[int]:
    """The daemon's spares that are ready: in a cgroup of this run's."""
    children = psutil.Process(daemon_pid).children()
    return [c.pid for c in children if is_spare(c.pid) and _cgroup_of(c.pid, cgroups)]


def _cgroup_of(pid: int, cgroups: StartCgroups) -> str:
    """The name of the run's cgroup `pid` is in ("" if none, or it is gone)."""
    try:
        path = Path(f"/proc/{pid}/cgroup").read_text().strip().split("::", 1)[1]
    except (OSError, IndexError):
        return ""
    return Path(path).name if Path(path).name.startswith(cgroups.prefix) else ""


def _started(run_dir: Path, seg: int) -> dict[str, Any] | None:
    return next(
        (r for r in journal(run_dir) if r["kind"] == "trainer_started" and r["seg"] == seg), None
    )


def _facts(run_dir: Path, pid: int) -> dict[str, Any]:
    path = run_dir / f"facts-{pid}.json"
    return wait_for(lambda: path.exists() and json.loads(path.read_text()), 30, what="facts")


def _lasting_start_and_its_spare(daemon: DaemonProcess, cgroups: StartCgroups) -> tuple[int, int]:
    """Start the daemon; the pids of its second start (which runs on) and of the next
    start's spare, once ready."""
    daemon.start()
    trainer = wait_for(lambda: _started(daemon.run_dir, 2), 60, what="the start that lasts")
    (spare,) = wait_for(lambda: _spares(daemon.pid, cgroups), 30, what="the spare")
    return trainer["pid"], spare


def _run_cgroups(cgroups: StartCgroups) -> list[str]:
    return [n for n in os.listdir(cgroups.base) if n.startswith(cgroups.prefix)]


@pytest.mark.timeout(120)
def test_a_restart_runs_the_trainer_in_the_spare_as_a_spawn_would(
    tmp_path: Path, cgroups: StartCgroups
):
    run_dir = _run(tmp_path, NO_BACKOFF)
    # An environment variable that is no text reaches the trainer byte for byte.
    with running_daemon(run_dir, env={"TW_TEST_BYTES": "caf\udcff"}) as daemon:
        second = wait_for(lambda: _started(run_dir, 2), 60, what="the restart")
        first = _started(run_dir, 1)
        assert first is not None and "spare" not in first, "the first start is spawned"
        assert second["spare"] is True
        before, after = _facts(run_dir, first["pid"]), _facts(run_dir, second["pid"])
        # Its own session and group, in the cgroup named by its marker, with its marker.
        assert after["pid"] == after["pgid"] == after["sid"] == second["pid"]
        assert Path(after["cgroup"]).name == Path(second["cgroup"]).name
        assert Path(second["cgroup"]).name == cgroups.prefix + second["marker"]
        assert after["marker"] == second["marker"]
        # What a spawned start has: the working directory, stdin, the signals it ignores
        # (none that Python ignores), no descriptor of the daemon's or the spare's.
        for key in ("cwd", "stdin", "sigign", "fds", "bytes"):
            assert after[key] == before[key], key
        assert after["bytes"] == b"caf\xff".hex()
        assert after["stdin"] == "/dev/null"
        # Its output is the run log's, read as the start's own lines.
        log_path = run_dir / "training.log"
        wait_for(lambda: f"hello from {second['pid']}" in log_path.read_text(), 30, what="log")
        daemon.wait_state("running", timeout=30)
        assert daemon.status()["trainer_pid"] == second["pid"]
        # The next start's spare waits in its own cgroup.
        (spare,) = wait_for(lambda: _spares(daemon.pid, cgroups), 30, what="the next spare")
        assert _cgroup_of(spare, cgroups).startswith(cgroups.prefix + "3-")
        # A stopped run keeps no spare, nor its cgroup.
        assert daemon.request("stop", timeout=60)["state"] == "stopped"
        wait_for(lambda: not pid_alive(spare), 30, what="the spare ended")
        wait_for(lambda: not _run_cgroups(cgroups), 30, what="no cgroup left")
        assert not _spares(daemon.pid, cgroups)
        daemon.request("shutdown", timeout=60)


@pytest.mark.timeout(120)
def test_an_exec_that_fails_in_the_spare_fails_the_start_in_the_same_words(
    tmp_path: Path, cgroups: StartCgroups
):
    run_dir = _run(tmp_path, {"backoff_initial_s": 1.0, "backoff_max_s": 1.0}, executable=True)
    script = tmp_path / "trainer.py"
    with running_daemon(run_dir) as daemon:
        (spare,) = wait_for(lambda: _spares(daemon.pid, cgroups), 30, what="the spare")
        script.chmod(0o644)  # the first start crashes at step 12: its restart cannot exec
        failed = wait_for(
            lambda: [r for r in journal(run_dir) if "could not start the trainer" in str(r)],
            60,
            what="the failed start",
        )
        assert f"the program {script} is not executable" in str(failed[0])
        assert not pid_alive(spare)
        assert _started(run_dir, 2) is None
        script.chmod(0o755)
        second = wait_for(
            lambda: [r for r in journal(run_dir) if r["kind"] == "trainer_started"][1:],
            60,
            what="the retry",
        )[0]
        assert "spare" not in second, "spawned: the spare was used up"
        daemon.request("shutdown", timeout=60)
    assert not _run_cgroups(cgroups)


@pytest.mark.timeout(120)
def test_a_spare_that_died_is_replaced_by_a_spawn(tmp_path: Path, cgroups: StartCgroups):
    run_dir = _run(tmp_path, NO_BACKOFF)
    with running_daemon(run_dir) as daemon:
        (spare,) = wait_for(lambda: _spares(daemon.pid, cgroups), 30, what="the spare")
        os.kill(spare, signal.SIGKILL)
        second = wait_for(lambda: _started(run_dir, 2), 60, what="the restart")
        assert "spare" not in second and second["cgroup"], "spawned into its own cgroup"
        assert _facts(run_dir, second["pid"])["marker"] == second["marker"]
        daemon.request("shutdown", timeout=60)
    assert not _run_cgroups(cgroups)


@pytest.mark.timeout(120)
def test_a_spare_outliving_a_killed_daemon_is_ended_by_the_next_and_not_called_a_leftover(
    tmp_path: Path, cgroups: StartCgroups
):
    run_dir = _run(tmp_path, NO_BACKOFF)
    daemon = DaemonProcess(run_dir)
    spare = 0
    try:
        trainer, spare = _lasting_start_and_its_spare(daemon, cgroups)
        # Stopped, it cannot see its daemon go (a spare reads end-of-file and exits).
        os.kill(spare, signal.SIGSTOP)
        daemon.kill()  # the trainer lives on, and the stopped spare
        daemon.start()
        wait_for(lambda: not pid_alive(spare), 30, what="the spare ended")
        daemon.request("shutdown", timeout=60)
    finally:
        daemon.cleanup()
        if spare and pid_alive(spare):
            os.kill(spare, signal.SIGKILL)
    leftovers = [r for r in journal(run_dir) if r["kind"].startswith("leftover_trainer")]
    listed = {p if isinstance(p, int) else p["pid"] for r in leftovers for p in r["processes"]}
    assert trainer in listed, "the trainer is the leftover"
    assert spare not in listed
    assert not _run_cgroups(cgroups)


@pytest.mark.timeout(120)
def test_a_killed_daemons_spare_leaves_its_cgroup_removes_it_and_exits(
    tmp_path: Path, cgroups: StartCgroups
):
    run_dir = _run(tmp_path, NO_BACKOFF)
    daemon = DaemonProcess(run_dir)
    try:
        trainer, spare = _lasting_start_and_its_spare(daemon, cgroups)
        folder = cgroups.base / _cgroup_of(spare, cgroups)
        daemon.kill()
        wait_for(lambda: not pid_alive(spare), 30, what="the spare gone")
        wait_for(lambda: not folder.exists(), 30, what="its cgroup removed")
        assert pid_alive(trainer), "the trainer lives on, for the next daemon to find"
    finally:
        daemon.cleanup()
