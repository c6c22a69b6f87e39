"""What a command reaches: the run directory it names, that run's config, and its daemon's
control socket (with the uid the daemon must have), the same way for every command."""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path
from typing import Any

from trainwarden.supervisor.errors import DaemonNotRunning, UsageError


def run_dir_of(args: argparse.Namespace) -> Path:
    return Path(args.run_dir).expanduser().resolve()


def run_config(run_dir: Path) -> Any:
    """RUN's config, or None when it has none (a socket at the default place is tried)."""
    from trainwarden.supervisor.config import CONFIG_NAME, load_config

    if (run_dir / CONFIG_NAME).exists():
        return load_config(run_dir, check_plugins=False)
    return None


def daemon_target(args: argparse.Namespace) -> tuple[Path, int | None, Any]:
    """The socket to reach (--socket when given: a forwarded one needs no run directory;
    else RUN's), the uid the operator named as the daemon's (--daemon-user, else RUN's
    [control] daemon_user), and RUN's config when read."""
    from trainwarden.supervisor.client import daemon_uid_of
    from trainwarden.supervisor.store.lease import elsewhere
    from trainwarden.supervisor.store.rundir import RunFiles

    named = getattr(args, "daemon_user", None)
    if getattr(args, "socket", None):
        return Path(args.socket).expanduser(), daemon_uid_of(named), None
    run_dir = run_dir_of(args)
    command = getattr(args, "command", None) or "status"
    away = elsewhere(RunFiles(run_dir), socket.gethostname(), command, time.time())
    if away is not None:
        raise DaemonNotRunning(away)
    cfg = run_config(run_dir)
    if cfg is None:
        socket_path = run_dir / ".trainwarden" / "control.sock"
        if not os.path.lexists(socket_path):
            # Neither a config nor a daemon's socket: no run here to start a daemon for.
            raise UsageError(no_run_message(run_dir))
        return socket_path, daemon_uid_of(named), None
    return cfg.socket_path, daemon_uid_of(named or cfg.control.daemon_user), cfg


def no_run_message(run_dir: Path) -> str:
    from trainwarden.supervisor.config import CONFIG_NAME

    if not run_dir.is_dir():
        return f"no run at {run_dir} (no such directory): name a run directory"
    return (
        f"no run at {run_dir} (no {CONFIG_NAME} there): name a run directory, or make one"
        f" with `trainwarden init {run_dir}`"
    )


def client_for(args: argparse.Namespace, timeout: float | None = 30.0) -> Any:
    from trainwarden.supervisor.protocol import Client

    socket_path, daemon_uid, _ = daemon_target(args)
    return Client(socket_path, timeout=timeout, daemon_uid=daemon_uid)
