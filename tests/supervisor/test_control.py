"""The control socket and the CLI against a real daemon supervising the scripted trainer
(an endless run that saves on SIGUSR1 and on SIGTERM: what the commands need, in 0.1 s a
start; the reference trainer is the point elsewhere)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import (
    PYTHON,
    DaemonProcess,
    checkpoints,
    journal,
    pid_alive,
    running_daemon,
    scripted_run,
    wait_for,
)
from trainwarden.supervisor.errors import CommandRefused
from trainwarden.supervisor.protocol import Client

pytestmark = pytest.mark.timeout(300)


def endless_run(run_dir: Path) -> Path:
    """An endless scripted run saving every 1,000 steps and on SIGUSR1, keep_last 3 (no spike
    handling: saves a few steps apart keep no checkpoint for a rollback, see test_spikes)."""
    return scripted_run(
        run_dir, "--steps", "100000000", "--save-every", "1000", "--dt", "0.02", "--usr1", "save",
        checkpoints={"keep_last": 3}, divergence={"spikes": False},
    )  # fmt: skip


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    run_dir = endless_run(tmp_path_factory.mktemp("control") / "run")
    with running_daemon(run_dir) as d:
        d.wait_state("running", timeout=60)
        yield d


def raw(daemon: DaemonProcess, payload: bytes, timeout: float = 10.0) -> list[dict]:
    """Send raw bytes; the reply lines until the daemon has answered each request."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(daemon.run_dir / ".trainwarden" / "control.sock"))
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon hung up on us: what it said before that is still readable
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------ commands


def test_hello_and_status(daemon: DaemonProcess):
    hello = daemon.request("hello")
    assert hello["protocol"] == 1 and hello["run_dir"] == str(daemon.run_dir)
    assert hello["log"] == str(daemon.run_dir / "training.log")
    status = daemon.status()
    assert status["state"] == "running"
    assert pid_alive(status["trainer_pid"])
    for key in (
        "step",
        "restarts",
        "checkpoints",
        "loss",
        "loss_ema",
        "tokens_per_s",
        "mfu",
        "mfu_avg",
        "steps_per_min",
        "eta_s",
        "gpu",
    ):
        assert key in status
    wait_for(lambda: (daemon.status().get("tokens_per_s") or 0) > 0, 30, what="tokens/s")
    status = daemon.status()
    assert status["mfu"] is None and "no NVIDIA GPU" in status["mfu_unknown_reason"]
    assert status["gpu"] is None


def test_save_wait_commits_a_checkpoint_and_pin_protects_it(daemon: DaemonProcess):
    result = daemon.request("save", wait=True)
    step = result["step"]
    assert step in checkpoints(daemon.run_dir)
    assert daemon.request("pin", step=step) == {"step": step, "pinned": True}
    for _ in range(4):
        daemon.request("save", wait=True)
    assert step in checkpoints(daemon.run_dir)
    listed = daemon.request("checkpoints")["checkpoints"]
    assert [c["step"] for c in listed if c["pinned"]] == [step]
    assert len([c for c in listed if not c["pinned"]]) == 3
    assert daemon.request("unpin", step=step)["pinned"] is False
    wait_for(lambda: step not in checkpoints(daemon.run_dir), 10, what="retention after unpin")


def test_state_errors(daemon: DaemonProcess):
    with pytest.raises(CommandRefused) as err:
        daemon.request("start")
    assert err.value.code == "wrong_state" and "running" in str(err.value)
    with pytest.raises(CommandRefused) as err:
        daemon.request("pin", step=999_999_999)
    assert err.value.code == "bad_argument"
    with pytest.raises(CommandRefused) as err:
        daemon.request("unpin", step=5)
    assert err.value.code == "bad_argument"
    with pytest.raises(CommandRefused) as err:
        daemon.request("pin", step="ten")
    assert err.value.code == "bad_argument"
    with pytest.raises(CommandRefused) as err:
        daemon.request("subscribe", topics=["nope"])
    assert err.value.code == "bad_argument"
    with pytest.raises(CommandRefused) as err:
        daemon.request("history", points=0)
    assert err.value.code == "bad_argument"


def test_history_and_events(daemon: DaemonProcess):
    wait_for(lambda: (daemon.status().get("step") or 0) >= 10, 60, what="steps")
    history = daemon.request("history", points=5)
    assert 1 <= len(history["step"]) <= 5
    assert all(
        lo <= mean <= hi
        for lo, mean, hi in zip(history["min"], history["mean"], history["max"], strict=True)
    )
    assert history["first_step"] == 1
    events = daemon.request("events", n=5)["events"]
    assert 1 <= len(events) <= 5 and all("kind" in e and "ts" in e for e in events)


def test_bad_input_never_hurts_the_daemon(daemon: DaemonProcess):
    replies = raw(
        daemon,
        b'not json\n[1,2]\n{"id": 1}\n{"id": 2, "cmd": "frob"}\n{"id": 3, "cmd": "pin", "step": true}\n'
        b'{"id": [1], "cmd": "status"}\n\n{"id": 4, "cmd": "hello"}\n',
    )
    codes = [r.get("error", {}).get("code") for r in replies]
    assert codes == [
        "bad_request",
        "bad_request",
        "bad_request",
        "unknown_command",
        "bad_argument",
        "bad_request",
        None,
    ]
    assert replies[-1]["ok"] and replies[-1]["id"] == 4
    # A 10 MB line: refused and the connection closed.
    big = raw(daemon, b'{"id": 5, "cmd": "' + b"a" * 10_000_000 + b'"}\n')
    assert big and big[0]["error"]["code"] == "too_large"
    # Half a line, then the client hangs (kept open) while others carry on.
    hanging = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hanging.connect(str(daemon.run_dir / ".trainwarden" / "control.sock"))
    hanging.sendall(b'{"id": 6, "cmd": "sta')
    # 200 connections at once, each asking for status and disconnecting mid-reply.
    socks = []
    for _ in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(daemon.run_dir / ".trainwarden" / "control.sock"))
        s.sendall(b'{"id": 1, "cmd": "status"}\n')
        socks.append(s)
    for s in socks:
        s.close()
    status = daemon.status()
    assert status["state"] == "running" and pid_alive(status["trainer_pid"])
    hanging.close()


def test_fuzzed_messages_leave_the_daemon_supervising(daemon: DaemonProcess):
    """A live smoke of the property tests in test_request_parsing.py: 300 fuzzed lines
    over three connections, then the daemon still answers and its trainer still runs."""
    sock_path = str(daemon.run_dir / ".trainwarden" / "control.sock")
    json_values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**63 - 1)
        | st.floats(allow_nan=False)
        | st.text(max_size=20),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=10,
    )
    # Read-only or harmless commands only: the fuzz must not stop the run on purpose.
    commands = st.sampled_from(
        ["status", "hello", "history", "events", "checkpoints", "pin", "unpin", "frob", "subscribe"]
    )
    messages = st.one_of(
        st.builds(
            lambda cmd, args, rid: orjson.dumps({"id": rid, "cmd": cmd, **args}),
            commands,
            st.dictionaries(
                st.sampled_from(["step", "n", "points", "start", "end", "topics", "x"]),
                json_values,
                max_size=3,
            ),
            json_values,
        ),
        json_values.map(orjson.dumps),
        st.binary(max_size=200).map(lambda b: b.replace(b"\n", b"")),
    )
    answered = []

    @settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(messages, min_size=100, max_size=100))
    def send_batch(batch: list[bytes]) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(sock_path)
        s.sendall(b"\n".join(batch) + b"\n")
        s.shutdown(socket.SHUT_WR)
        got = b""
        try:
            while chunk := s.recv(1 << 20):
                got += chunk
        except TimeoutError:
            pass
        s.close()
        answered.append(len(got.splitlines()))

    send_batch()
    assert len(answered) == 3 and all(n > 0 for n in answered), answered
    status = daemon.status()
    assert status["state"] == "running" and pid_alive(status["trainer_pid"])


def test_connection_from_another_uid_is_refused(daemon: DaemonProcess, tmp_path: Path):
    if os.getuid() != 0:
        pytest.skip("needs root to drop to another uid")
    sock_path = daemon.run_dir / ".trainwarden" / "control.sock"
    state_dir = sock_path.parent
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(sock_path.stat().st_mode) == 0o600
    # Open the filesystem permissions so only SO_PEERCRED stands in the way.
    os.chmod(state_dir, 0o711)
    os.chmod(sock_path, 0o666)
    for parent in sock_path.parents:
        if parent == Path("/"):
            break
        os.chmod(parent, os.stat(parent).st_mode | 0o001)
    try:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become nobody, connect, report what came back
            try:
                os.close(read_fd)
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(10)
                s.connect(str(sock_path))
                try:
                    s.sendall(b'{"id": 1, "cmd": "status"}\n')
                except BrokenPipeError:
                    pass  # refused before it could ask: the refusal is still readable
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
                os.write(write_fd, data or b"<closed>")
            except BaseException as exc:
                os.write(write_fd, f"error {exc!r}".encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as f:
            answer = f.read()
        os.waitpid(pid, 0)
    finally:
        os.chmod(state_dir, 0o700)
        os.chmod(sock_path, 0o600)
    assert answer.startswith(b"{"), answer
    reply = orjson.loads(answer.splitlines()[0])
    assert reply["ok"] is False and reply["error"]["code"] == "forbidden"
    assert "65534" in reply["error"]["message"]
    assert any(r["kind"] == "state" for r in journal(daemon.run_dir))
    assert daemon.status()["state"] == "running"


def test_stuck_subscriber_does_not_starve_another(daemon: DaemonProcess):
    stuck = Client(daemon.run_dir / ".trainwarden" / "control.sock")
    stuck.sock.sendall(
        b'{"id": 1, "cmd": "subscribe", "topics": ["telemetry", "events", "checkpoints", "state", "gpu", "host", "bandit", "samples"]}\n'
    )
    with daemon.client(timeout=30) as live:
        live.request("subscribe", topics=["events"])
        seen: list[int] = []
        latencies = []
        for _ in range(4):
            t0 = time.monotonic()
            step = daemon.request("save", wait=True)["step"]
            latencies.append(time.monotonic() - t0)
            while step not in seen:
                message = live.read_message()
                if message.get("topic") == "events" and message["data"]["kind"] == "checkpoint":
                    seen.append(message["data"]["step"])
        t0 = time.monotonic()
        daemon.status()
        status_latency = time.monotonic() - t0
    stuck.close()
    assert len(seen) == 4
    # Generous bound: a stuck client must not make the daemon wait on it.
    assert status_latency < 2.0


# ------------------------------------------------------------------ CLI


def test_cli_commands(daemon: DaemonProcess):
    run = str(daemon.run_dir)
    status = cli("status", run)
    assert status.returncode == 0 and "state     running" in status.stdout
    as_json = orjson.loads(cli("status", run, "--json").stdout)
    assert as_json["state"] == "running"
    saved = cli("save", run, "--wait")
    assert saved.returncode == 0 and "checkpoint committed at step" in saved.stdout
    step = int(saved.stdout.split("step ")[1].split()[0])
    assert cli("pin", str(step), run).returncode == 0
    listing = cli("checkpoints", run)
    assert f"{step:>10}" in listing.stdout and "pinned" in listing.stdout
    assert cli("unpin", run, str(step)).returncode == 0
    refused = cli("start", run)
    assert refused.returncode == 1 and "refused (wrong_state)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    events = cli("events", run, "-n", "3", "--json")
    assert len(events.stdout.strip().splitlines()) == 3
    bad = cli("pin", run, "notanumber")
    assert bad.returncode == 2


def test_cli_without_a_daemon(tmp_path: Path):
    # A run directory whose daemon is not running (a folder that is no run: test_cli_commands).
    result = cli("status", str(endless_run(tmp_path / "run")))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "no trainwarden daemon" in lines[0] and "trainwarden daemon" in lines[0]
    )


def test_stop_start_shutdown_and_detach(tmp_path: Path):
    run_dir = endless_run(tmp_path / ("x" * 60) / ("y" * 60) / "run")
    assert len(str(run_dir / ".trainwarden" / "control.sock")) > 107
    started = cli("daemon", "--detach", str(run_dir))
    assert started.returncode == 0, started.stderr
    daemon = DaemonProcess(run_dir)
    try:
        daemon.wait_state("running", timeout=60)
        wait_for(lambda: (daemon.status().get("step") or 0) >= 3, 60, what="steps")
        stopped = cli("stop", str(run_dir))
        assert stopped.returncode == 0 and "trainer stopped" in stopped.stdout
        status = daemon.status()
        assert status["state"] == "stopped" and status["trainer_pid"] is None
        assert checkpoints(run_dir)
        with pytest.raises(CommandRefused):
            daemon.request("save")
        assert cli("start", str(run_dir)).returncode == 0
        daemon.wait_state("running", timeout=60)
        daemon_pid = daemon.status()["daemon_pid"]
        done = cli("shutdown", str(run_dir))
        assert done.returncode == 0 and "daemon is exiting" in done.stdout
        wait_for(lambda: not pid_alive(daemon_pid), 30, what="daemon exit")
    finally:
        daemon.cleanup()


def test_detach_beside_a_running_daemon_exits_1_naming_it(tmp_path: Path):
    """The old daemon answers hello, but it is not the child just started: no success."""
    run_dir = endless_run(tmp_path / "run")
    with running_daemon(run_dir) as daemon:
        again = cli("daemon", "--detach", str(run_dir))
        assert again.returncode == 1, again.stdout
        assert "started" not in again.stdout
        assert again.stderr.strip() == (
            f"trainwarden: a daemon already runs for {run_dir} (pid {daemon.pid}); stop it with"
            f" `trainwarden shutdown {run_dir}` first"
        )  # one message: not the new daemon's own line nested inside it
        assert daemon.alive


def test_events_follow_streams_new_events(daemon: DaemonProcess):
    follower = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "trainwarden.supervisor",
            "events",
            str(daemon.run_dir),
            "-n",
            "1",
            "--follow",
            "--json",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        follower.stdout.readline()  # the newest existing event
        step = daemon.request("save", wait=True)["step"]
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            record = orjson.loads(follower.stdout.readline())
            seen.append(record)
            if record["kind"] == "checkpoint" and record["step"] == step:
                break
        assert any(r["kind"] == "checkpoint" and r["step"] == step for r in seen)
    finally:
        follower.kill()
        follower.wait(10)
