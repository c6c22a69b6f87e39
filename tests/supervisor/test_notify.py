"""sd_notify over real datagram sockets bound by the test, as systemd would bind them."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainwarden.supervisor.serve.notify import NOTIFY_ENV_KEYS, Notifier


class Listener:
    def __init__(self, sock: socket.socket, env_value: str) -> None:
        self.sock = sock
        self.env_value = env_value

    def receive(self) -> str:
        return self.sock.recv(4096).decode()

    def nothing_waiting(self) -> bool:
        self.sock.setblocking(False)
        try:
            self.sock.recv(4096)
        except BlockingIOError:
            return True
        finally:
            self.sock.settimeout(5)
        return False


def bound(address: str | bytes, env_value: str) -> Iterator[Listener]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    try:
        yield Listener(sock, env_value)
    finally:
        sock.close()


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Listener]:
    if request.param == "path":
        path = tmp_path / "notify.sock"
        yield from bound(str(path), str(path))
    else:
        name = f"trainwarden-test-{uuid.uuid4().hex}"
        yield from bound(b"\0" + name.encode(), "@" + name)


def notifier_for(listener: Listener, **env: str) -> Notifier:
    return Notifier.from_env({"NOTIFY_SOCKET": listener.env_value, **env})


def test_ready_with_status(listener: Listener) -> None:
    assert notifier_for(listener).ready("supervising step 1200")

    assert listener.receive() == "READY=1\nSTATUS=supervising step 1200"


def test_ready_alone(listener: Listener) -> None:
    notifier_for(listener).ready()

    assert listener.receive() == "READY=1"


def test_status_stays_one_line(listener: Listener) -> None:
    notifier_for(listener).status("running: step 500\nloss 3.41")

    assert listener.receive() == "STATUS=running: step 500 loss 3.41"


def test_watchdog_ping(listener: Listener) -> None:
    notifier = notifier_for(listener, WATCHDOG_USEC="60000000", WATCHDOG_PID=str(os.getpid()))

    assert notifier.watchdog()

    assert listener.receive() == "WATCHDOG=1"


def test_stopping_and_extend_timeout(listener: Listener) -> None:
    notifier = notifier_for(listener)

    notifier.stopping("saving a checkpoint")
    notifier.extend_timeout(90)

    assert listener.receive() == "STOPPING=1\nSTATUS=saving a checkpoint"
    assert listener.receive() == "EXTEND_TIMEOUT_USEC=90000000"


def test_send_arbitrary_fields(listener: Listener) -> None:
    notifier_for(listener).send(STATUS="x", ERRNO=5, BUSERROR=None, READY=True)

    assert listener.receive() == "STATUS=x\nERRNO=5\nREADY=1"


@pytest.mark.parametrize(
    ("env", "interval_s"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "1500000", "WATCHDOG_PID": "<self>"}, 0.75),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "<other>"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "x"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_the_timeout(
    env: dict[str, str], interval_s: float | None
) -> None:
    pids = {"<self>": str(os.getpid()), "<other>": str(os.getpid() + 1)}
    environ = {"NOTIFY_SOCKET": "/run/systemd/notify"}
    environ.update({key: pids.get(value, value) for key, value in env.items()})

    notifier = Notifier.from_env(environ)

    assert notifier.watchdog_interval_s == interval_s


def test_watchdog_of_another_pid_sends_no_ping(listener: Listener) -> None:
    notifier = notifier_for(listener, WATCHDOG_USEC="60000000", WATCHDOG_PID=str(os.getpid() + 1))

    assert notifier.watchdog_interval_s is None
    assert notifier.watchdog() is False
    assert listener.nothing_waiting()


def test_pid_argument_decides_ownership() -> None:
    env = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "4242"}

    assert Notifier.from_env(env, pid=4242).watchdog_interval_s == 5.0
    assert Notifier.from_env(env, pid=4243).watchdog_interval_s is None


def test_without_notify_socket_everything_is_a_no_op(listener: Listener) -> None:
    notifier = Notifier.from_env({"WATCHDOG_USEC": "60000000"})

    assert notifier.enabled is False
    assert notifier.watchdog_interval_s is None
    assert not any(
        [notifier.ready("x"), notifier.status("x"), notifier.watchdog(), notifier.stopping()]
    )
    assert listener.nothing_waiting()


def test_abstract_address_gets_a_leading_nul() -> None:
    assert Notifier.from_env({"NOTIFY_SOCKET": "@sd-notify"}).address == b"\0sd-notify"
    assert Notifier.from_env({"NOTIFY_SOCKET": "/run/x"}).address == "/run/x"


def test_unsupported_address_turns_notifications_off(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trainwarden.supervisor.serve.notify"):
        notifier = Notifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"})

    assert notifier.enabled is False
    assert "vsock:2:1234" in caplog.text


def test_send_errors_are_logged_once_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})

    with caplog.at_level(logging.WARNING, logger="trainwarden.supervisor.serve.notify"):
        results = [notifier.status(f"step {i}") for i in range(5)]

    assert results == [False] * 5
    assert len([r for r in caplog.records if "cannot notify systemd" in r.getMessage()]) == 1


def test_environment_keys_for_the_trainer_to_drop() -> None:
    assert set(NOTIFY_ENV_KEYS) == {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}
