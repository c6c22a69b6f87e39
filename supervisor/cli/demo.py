"""`trainwarden demo`: from nothing to a supervised run in the TUI, in one command.

Creates (or reuses) a run directory for the reference trainer, starts the daemon in the
background unless one already supervises it, opens the TUI, and on quit asks whether to
stop the run. The run directory stays either way, for inspection.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from trainwarden.supervisor.cli.detach import start_detached
from trainwarden.supervisor.cli.init import write_config
from trainwarden.supervisor.config import CONFIG_NAME, Config, load_config
from trainwarden.supervisor.errors import CommandRefused, DaemonNotRunning, ProtocolError
from trainwarden.supervisor.protocol import Client
from trainwarden.supervisor.store.rundir import RunFiles

DEFAULT_DIR_NAME = "trainwarden-demo"
DEMO_PRESET = "tiny"
DEMO_STEPS = 5000
DEMO_SAVE_EVERY = 100
SHUTDOWN_WAIT_S = 120.0
RESUMABLE = ("stopped",)


def say(message: str, out: TextIO | None = None) -> None:
    print(f"trainwarden demo: {message}", file=out or sys.stdout, flush=True)


def prepare(run_dir: Path) -> bool:
    """A config for the reference trainer in `run_dir`; True when it was written just now."""
    if (run_dir / CONFIG_NAME).exists():
        return False
    write_config(
        run_dir, preset=DEMO_PRESET, steps=DEMO_STEPS, save_every=DEMO_SAVE_EVERY, device="auto"
    )
    return True


def daemon_status(cfg: Config) -> dict | None:
    """The daemon's status, or None when no daemon answers."""
    try:
        with Client(cfg.socket_path, timeout=10.0) as client:
            return client.request("status")
    except (DaemonNotRunning, ProtocolError, OSError):
        return None


def ensure_daemon(cfg: Config) -> None:
    status = daemon_status(cfg)
    if status is None:
        say("starting the daemon in the background…")
        pid = start_detached(cfg)
        say(f"daemon started (pid {pid}); its log: {RunFiles(cfg.run_dir).daemon_log}")
        status = daemon_status(cfg)
    else:
        say(f"a daemon already supervises this run (pid {status.get('daemon_pid')}); attaching")
    if status is not None and status.get("state") in RESUMABLE:
        # A previous demo stopped it; a demo is for watching a run, so carry on training.
        with Client(cfg.socket_path, timeout=30.0) as client:
            client.request("start")
        say("the trainer was stopped; started it again from its newest checkpoint")


def ask_to_stop(stdin: TextIO, out: TextIO) -> bool:
    """Whether to stop the run; yes unless the operator says no. No prompt without a terminal."""
    if not stdin.isatty():
        say("stdin is not a terminal: stopping the run (the default)", out)
        return True
    try:
        out.write("Stop the training run? The run directory is kept either way. [Y/n] ")
        out.flush()
        answer = stdin.readline()
    except KeyboardInterrupt:
        out.write("\n")
        return False
    if not answer:  # end of input
        return True
    return answer.strip().lower() not in ("n", "no")


def shutdown(cfg: Config, out: TextIO) -> bool:
    """Stop the trainer (it saves first) and the daemon; True once the daemon has exited."""
    say("stopping the trainer (it saves a checkpoint first) and the daemon…", out)
    try:
        with Client(cfg.socket_path, timeout=None) as client:
            result = client.request("shutdown")
    except DaemonNotRunning:
        say("the daemon had already exited", out)
        return True
    except (CommandRefused, ProtocolError) as exc:
        say(f"the daemon did not stop: {exc}; try `trainwarden shutdown {cfg.run_dir}`", out)
        return False
    ckpt = (result or {}).get("checkpoint")
    if ckpt:
        say(f"newest checkpoint: step {ckpt.get('step')}", out)
    pid_file = RunFiles(cfg.run_dir).daemon_pid
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    while pid_file.exists() or daemon_status(cfg) is not None:
        if time.monotonic() > deadline:
            say(f"the daemon has not exited after {SHUTDOWN_WAIT_S:.0f} s; see its log", out)
            return False
        time.sleep(0.1)
    say("the daemon has exited", out)
    return True


def run_demo(
    run_dir: Path | None = None, stdin: TextIO | None = None, out: TextIO | None = None
) -> int:
    """The whole demo; the exit status."""
    stdin = stdin or sys.stdin
    out = out or sys.stdout
    run_dir = (run_dir or Path.cwd() / DEFAULT_DIR_NAME).expanduser().resolve()
    created = prepare(run_dir)
    say(f"{'created' if created else 'reusing'} the run directory {run_dir}", out)
    cfg = load_config(run_dir)
    ensure_daemon(cfg)

    from trainwarden.tui.app import main as tui_main

    status = tui_main(cfg.socket_path, log_path=cfg.log_path)
    if status != 0:
        return status
    if ask_to_stop(stdin, out):
        stopped = shutdown(cfg, out)
    else:
        say(
            f"the run goes on; watch it with `trainwarden tui {run_dir}`, "
            f"stop it with `trainwarden shutdown {run_dir}`",
            out,
        )
        stopped = True
    say(f"the run directory is kept for inspection: {run_dir}", out)
    return 0 if stopped else 1
