"""What systemd does to the daemon, reproduced without systemd: notify, stop, power cut.
The trainer is the scripted one (it saves on SIGTERM): the daemon's side is the point."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import (
    PYTHON,
    DaemonProcess,
    checkpoints,
    journal,
    kill_quietly,
    pid_alive,
    scripted_run,
    trainer_pid,
    wait_for,
)
from trainwarden.plugins.formats.andrea_bin import checkpoint_name
from trainwarden.supervisor.cli import units

pytestmark = pytest.mark.timeout(240)


def endless_run(run_dir: Path, save_every: int = 1000) -> Path:
    return scripted_run(
        run_dir, "--steps", "100000000", "--save-every", str(save_every), "--dt", "0.02"
    )  # fmt: skip


def datagrams(sock: socket.socket, seconds: float) -> list[tuple[float, str]]:
    sock.settimeout(0.05)
    got = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            got.append((time.monotonic(), sock.recv(4096).decode()))
        except TimeoutError:
            continue
    return got


def test_sd_notify_ready_status_watchdog_stopping(tmp_path: Path):
    run_dir = endless_run(tmp_path / "run")
    notify_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    daemon = DaemonProcess(
        run_dir, env={"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "200000"}
    )
    daemon.start(wait=False)
    try:
        ready_at = None
        seen: list[tuple[float, str]] = []
        deadline = time.monotonic() + 60
        while ready_at is None and time.monotonic() < deadline:
            for t, message in datagrams(sock, 0.2):
                seen.append((t, message))
                if "READY=1" in message.split("\n"):
                    ready_at = t
                    break
        assert ready_at is not None, seen
        # READY only once the socket answers and the trainer has been started.
        status = daemon.status()
        assert status["trainer_pid"] is not None
        later = datagrams(sock, 2.0)
        pings = [t for t, m in later if m == "WATCHDOG=1"]
        assert 5 <= len(pings) <= 25, f"{len(pings)} watchdog pings in 2 s at a 0.1 s interval"
        statuses = [m for _, m in seen + later if m.startswith("STATUS=")]
        assert statuses and any("running" in m or "starting" in m for m in statuses)
        # The trainer must not inherit the daemon's notify socket.
        tp = trainer_pid(run_dir)
        assert tp is not None
        environ = Path(f"/proc/{tp}/environ").read_bytes().split(b"\0")
        assert not any(e.startswith(b"NOTIFY_SOCKET=") for e in environ)
        os.kill(daemon.pid, signal.SIGTERM)
        after = datagrams(sock, 1.0)
        assert any(m.startswith("STOPPING=1") for _, m in after)
        assert daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
        sock.close()


def test_abstract_notify_socket(tmp_path: Path):
    run_dir = endless_run(tmp_path / "run")
    name = f"trainwarden-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    daemon = DaemonProcess(run_dir, env={"NOTIFY_SOCKET": "@" + name})
    daemon.start(wait=False)
    try:
        wait_for(lambda: any("READY=1" in m for _, m in datagrams(sock, 0.2)), 60, what="READY=1")
    finally:
        daemon.cleanup()
        sock.close()


def test_systemctl_stop_semantics(tmp_path: Path):
    """KillMode=mixed: SIGTERM to the daemon only, SIGKILL to what is left after TimeoutStopSec."""
    run_dir = endless_run(tmp_path / "run")
    daemon = DaemonProcess(run_dir).start()
    try:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 5, 60, what="steps")
        trainer = daemon.status()["trainer_pid"]
        timeout_stop_s = float(
            units.parse_unit(units.template_unit("system"))["Service"]["TimeoutStopSec"]
        )
        start = time.monotonic()
        os.kill(daemon.pid, signal.SIGTERM)
        try:
            code = daemon.wait_exit(timeout_stop_s)
        except subprocess.TimeoutExpired:
            code = None
        # Whatever is left after TimeoutStopSec gets SIGKILL, as systemd would.
        kill_quietly(daemon.pid, group=False)
        kill_quietly(trainer)
        assert code == 0 and time.monotonic() - start < timeout_stop_s
        stopped = next(r for r in journal(run_dir) if r["kind"] == "trainer_stopped")
        assert stopped["returncode"] == 0
        assert checkpoints(run_dir)[-1] == stopped["last_step"]
        assert not pid_alive(trainer)
    finally:
        daemon.cleanup()


def test_a_daemon_stopped_by_sigterm_resumes_the_run_at_its_next_start(tmp_path: Path):
    """A clean reboot: systemd's SIGTERM stops the daemon (the trainer saves and exits); the
    next daemon resumes the run from that save. Only the operator's stop leaves it stopped."""
    run_dir = endless_run(tmp_path / "run")
    daemon = DaemonProcess(run_dir).start()
    try:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 5, 60, what="steps")
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait_exit(60) == 0
        states = [r for r in journal(run_dir) if r["kind"] == "state"]
        last = states[-1]["state"]
        assert last["phase"] == "stopped" and last["resumes_after"] == "SIGTERM", last
        assert "stopped by SIGTERM" in last["halt_reason"]
        saved = checkpoints(run_dir)[-1]
        daemon.start()
        status = daemon.wait_state("running", timeout=60)
        spawn = [r for r in journal(run_dir) if r["kind"] == "spawn"][-1]
        assert spawn["resume"]["step"] == saved, spawn
        assert any(r["kind"] == "resumed_after_signal" for r in journal(run_dir))
        # The operator's stop, then SIGTERM: the run stays stopped.
        daemon.request("stop", wait=True)
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait_exit(60) == 0
        daemon.start()
        status = daemon.wait_state("stopped", timeout=60)
        assert status["detail"]["reason"] == "stopped by operator", status
        assert status["trainer_pid"] is None
    finally:
        daemon.cleanup()


def test_power_cut_recovery(tmp_path: Path):
    run_dir = endless_run(tmp_path / "run", 10)
    daemon = DaemonProcess(run_dir).start()
    try:
        wait_for(
            lambda: len(checkpoints(run_dir)) >= 2 and (daemon.status().get("step") or 0) % 10 >= 3,
            90,
            0.02,
            what="two checkpoints and a few steps past one",
        )
        trainer = trainer_pid(run_dir)
        # The power goes: everything dies at once, mid-write.
        daemon.kill()
        kill_quietly(trainer)
        newest = checkpoints(run_dir)[-1]
        # Steps the trainer logged, including any after the daemon died (read from the log).
        last_logged = max(
            int(line.split(",")[0].split(":")[1])
            for line in (run_dir / "training.log").read_text().splitlines()
            if line.startswith("step: ")
        )
        half = run_dir / "checkpoints" / (checkpoint_name(newest + 10) + ".tmp")
        half.write_bytes(b"\0" * 5000)
        daemon = DaemonProcess(run_dir).start()
        daemon.wait_state("running", "starting", timeout=60)
        assert not half.exists()
        records = journal(run_dir)
        recovery = next(r for r in records if r["kind"] == "boot_recovery")
        assert recovery["resume_step"] == newest
        assert recovery["steps_lost"] == last_logged - newest
        started = max(i for i, r in enumerate(records) if r["kind"] == "daemon_start")
        spawns = wait_for(
            lambda: [r for r in journal(run_dir)[started:] if r["kind"] == "spawn"],
            60,
            what="the trainer started again",
        )
        assert spawns[-1]["resume"]["step"] == newest
    finally:
        daemon.cleanup()


def test_install_unit_dry_run_and_refusal(tmp_path: Path):
    run_dir = endless_run(tmp_path / "run", 10)
    dry = subprocess.run(
        [
            PYTHON,
            "-m",
            "trainwarden.supervisor",
            "install-unit",
            str(run_dir),
            "--system",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0
    assert f"ExecStart={Path(PYTHON).parent / 'trainwarden'} daemon {run_dir}" in dry.stdout
    assert not units.missing_keys(dry.stdout)
    assert not units.unit_install_path("system", units.unit_name(run_dir)).exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "install-unit", str(empty), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "no config file" in refused.stderr
