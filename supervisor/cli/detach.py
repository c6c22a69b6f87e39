"""`trainwarden daemon --detach`: start the daemon in its own session and wait until it answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.errors import (
    CommandRefused,
    DaemonNotRunning,
    ProtocolError,
    TrainwardenError,
)
from trainwarden.supervisor.protocol import Client
from trainwarden.supervisor.store.rundir import RunFiles, open_for_append


def _tail(path: os.PathLike[str], lines: int = 1) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            text = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def start_detached(cfg: Config, timeout_s: float = 60.0) -> int:
    files = RunFiles(cfg.run_dir)
    files.make_state_dir()
    log_fd = open_for_append(files.daemon_log, os.O_WRONLY, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainwarden.supervisor", "daemon", str(cfg.run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            cwd=cfg.run_dir,
        )
    finally:
        os.close(log_fd)
    deadline = time.monotonic() + timeout_s
    other: int | None = None
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            if other is not None:
                # The new daemon's own line says the same: one message, not one inside another.
                raise TrainwardenError(
                    f"a daemon already runs for {cfg.run_dir} (pid {other}); stop it with"
                    f" `trainwarden shutdown {cfg.run_dir}` first"
                )
            reason = _tail(files.daemon_log).removeprefix("trainwarden: ")
            raise TrainwardenError(
                f"the daemon exited with status {code}: {reason} (full log: {files.daemon_log})"
            )
        try:
            with Client(cfg.socket_path, timeout=2.0) as client:
                hello = client.request("hello")
        except (DaemonNotRunning, ProtocolError, CommandRefused, OSError):
            time.sleep(0.05)
            continue
        if hello.get("pid") == proc.pid:
            return proc.pid
        # Another daemon answers (it holds the run's lock): ours is about to fail; say why.
        other = hello.get("pid")
        time.sleep(0.05)
    raise TrainwardenError(
        f"the daemon (pid {proc.pid}) did not answer within {timeout_s:.0f} s; see {files.daemon_log}"
    )
