"""The TUI started on a daemon's socket: `trainwarden tui` and the demo call `main`.

A daemon that does not answer is said in one line before the screen is taken over.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from trainwarden.supervisor.errors import DaemonNotRunning, ProtocolError
from trainwarden.supervisor.protocol import Client, encode
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.sanitize import clean
from trainwarden.tui.screens.help import QUIT_LEAVES_RUN
from trainwarden.tui.source import DaemonSource, describe_failure

STARTUP_WAIT_S = 1.0


def daemon_unreachable(
    socket_path: Path, wait_s: float = STARTUP_WAIT_S, daemon_uid: int | None = None
) -> str | None:
    """Why nobody answers on `socket_path` (None: a daemon does), trying for `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with Client(socket_path, timeout=5.0, daemon_uid=daemon_uid) as client:
                client.sock.sendall(encode({"id": 1, "cmd": "hello"}))
                message = client.read_message()
            if message.get("ok"):
                return None
            error = message.get("error") or {}
            why = clean(error.get("message", "the daemon refused the connection"), 300)
            return f"{socket_path}: {why}"
        except DaemonNotRunning as exc:
            problem = str(exc)
        except (ProtocolError, OSError) as exc:
            problem = f"{socket_path}: {describe_failure(exc)}"
        if time.monotonic() >= deadline:
            return problem
        time.sleep(0.1)


def main(
    socket_path: Path,
    read_only: bool = False,
    log_path: Path | None = None,
    quit_means: str = QUIT_LEAVES_RUN,
    compare: str | None = None,
    daemon_uid: int | None = None,
) -> int:
    """Run the TUI on the daemon at `socket_path`; the exit status.

    `log_path` is the run's training.log when the caller knows it (a local run
    directory); without it the log screen is offered only when the socket lies inside
    the run directory the daemon reports. `compare`: another run to overlay on the loss
    chart, as the daemon finds it (an absolute path, or a folder beside the run).
    `daemon_uid`: the daemon's user when not ours or root (see client._check_server).
    """
    problem = daemon_unreachable(socket_path, daemon_uid=daemon_uid)
    if problem is not None:
        print(f"trainwarden tui: {problem}", file=sys.stderr)
        return 1
    app = TrainwardenApp(
        DaemonSource(socket_path, log_path, daemon_uid),
        read_only=read_only,
        quit_means=quit_means,
        compare=compare,
    )
    app.run()
    return app.return_code or 0
