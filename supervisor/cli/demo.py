"""`trainwarden demo`: from nothing to a supervised run in the TUI, in one command.

Creates (or reuses) a run directory for the reference trainer, starts the daemon in the
background unless one already supervises it, and opens the TUI. The demo run trains until
it is stopped, and within its first minute the trainer crashes, diverges (NaN) and hangs,
once each (the reference trainer's fault flags), so the daemon's restarts, rollback and
hang detection happen on screen. On quit the demo stops the run it started (asking first,
yes by default: the daemon too when the demo started it, else the trainer only) and leaves
alone a run it only attached to (asking first, no by default).
The run directory stays either way, for inspection; `--fresh` starts it over.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil

from trainwarden.supervisor.cli.detach import start_detached
from trainwarden.supervisor.cli.init import write_config
from trainwarden.supervisor.cli.output import describe_result, stop_status
from trainwarden.supervisor.cli.start_checks import load_for_start
from trainwarden.supervisor.config import CONFIG_NAME, Config
from trainwarden.supervisor.errors import CommandRefused, DaemonNotRunning, ProtocolError
from trainwarden.supervisor.protocol import Client
from trainwarden.supervisor.store.journal import read_records
from trainwarden.supervisor.store.rundir import RunFiles, read_pid

DEFAULT_DIR_NAME = "trainwarden-demo"
"""The demo's run directory when none is given: ./trainwarden-demo in the current directory."""
DEMO_PRESET = "tiny"
DEMO_STEPS = 100_000_000
"""The trainer's --steps, far more than anyone watches: the demo trains until it is stopped,
and its config names no total_steps (no percentage or ETA towards this number)."""
DEMO_SAVE_EVERY = 100
DEMO_FAULTS = {
    "--crash-at-step": 350,
    "--nan-at-step": 650,
    "--hang-at-step": 950,
    "--bad-data-at-step": 1250,
}
"""One crash, one divergence and one hang, each once per run directory, 300 steps apart
(about 10 s of a CPU core each: every caption stays a while); then 50 steps of garbage data
(a loss spike the daemon rolls back and skips)."""
DEMO_STALL_TIMEOUT_S = 15.0
"""Short, so the hang is detected within the demo's first minute; longer than the
trainer's start-up (importing torch) on a busy machine."""
DEMO_STOP_TIMEOUT_S = 5.0
"""The tiny model saves in milliseconds; a hung trainer is killed this soon after SIGTERM."""
DEMO_BACKOFF_S = 1.0
DEMO_HEADER = "# A `trainwarden demo` run: `trainwarden demo --fresh` may delete this directory.\n"
SHUTDOWN_WAIT_S = 120.0
RESUMABLE = ("stopped",)
QUIT_STOPS_OWN_RUN = "quit; the demo then stops the run it started (asks first, yes by default)"
QUIT_LEAVES_ATTACHED = "quit the TUI; the run goes on (the demo only attached to it)"


def say(message: str, out: TextIO | None = None) -> None:
    print(f"trainwarden demo: {message}", file=out or sys.stdout, flush=True)


def prepare(run_dir: Path) -> bool:
    """A config for the reference trainer in `run_dir`; True when it was written just now."""
    if (run_dir / CONFIG_NAME).exists():
        return False
    write_config(
        run_dir,
        preset=DEMO_PRESET,
        steps=DEMO_STEPS,
        save_every=DEMO_SAVE_EVERY,
        device="auto",
        extra_args=[str(arg) for pair in DEMO_FAULTS.items() for arg in pair],
        stall_timeout_s=DEMO_STALL_TIMEOUT_S,
        stop_timeout_s=DEMO_STOP_TIMEOUT_S,
        backoff_initial_s=DEMO_BACKOFF_S,
        header=DEMO_HEADER,
        endless=True,
    )
    return True


def made_by_demo(run_dir: Path) -> bool:
    """Whether `run_dir` holds a demo run (so --fresh may delete it): the demo's header, or
    the default name with the reference trainer (demo directories from before the header)."""
    try:
        text = (run_dir / CONFIG_NAME).read_text(encoding="utf-8")
    except OSError:
        return False
    if text.startswith(DEMO_HEADER):
        return True
    return run_dir.name == DEFAULT_DIR_NAME and '"trainwarden.trainer"' in text


def daemon_status(cfg: Config) -> dict | None:
    """The daemon's status, or None when no daemon answers."""
    try:
        with Client(cfg.socket_path, timeout=10.0) as client:
            return client.request("status")
    except (DaemonNotRunning, ProtocolError, OSError):
        return None


@dataclass(frozen=True)
class Started:
    """What this demo started, and so what its quit may stop."""

    daemon: bool
    """The demo started the daemon (no daemon answered)."""
    trainer: bool
    """The demo's start set the trainer going: its own daemon's first start, or `start`
    asked of a daemon that held the run stopped."""

    @property
    def own(self) -> bool:
        """The run is the demo's to stop on quit (asked, yes by default): it set it going,
        whether or not a daemon was up already."""
        return self.daemon or self.trainer

    @property
    def quit_means(self) -> str:
        return QUIT_STOPS_OWN_RUN if self.own else QUIT_LEAVES_ATTACHED


def ensure_daemon(cfg: Config, out: TextIO) -> Started:
    """A daemon supervises the run and its trainer is going; what the demo started for it."""
    status = daemon_status(cfg)
    started_daemon = status is None
    if status is None:
        say("starting the daemon in the background…", out)
        pid = start_detached(cfg)
        say(f"daemon started (pid {pid}); its log: {RunFiles(cfg.run_dir).daemon_log}", out)
        status = daemon_status(cfg)
    elif status.get("state") in RESUMABLE:
        say(f"a daemon already supervises this run (pid {status.get('daemon_pid')})", out)
    else:
        say(
            f"a daemon already supervises this run (pid {status.get('daemon_pid')}); "
            "attaching (quitting leaves it running)",
            out,
        )
    started_trainer = started_daemon
    if status is not None and status.get("state") in RESUMABLE:
        # A previous demo stopped it; a demo is for watching a run, so carry on training.
        with Client(cfg.socket_path, timeout=30.0) as client:
            client.request("start")
        say("the trainer was stopped; started it again from its newest checkpoint", out)
        started_trainer = True
    return Started(daemon=started_daemon, trainer=started_trainer)


# -------------------------------------------------------------- finished runs, --fresh


def finished_at(run_dir: Path) -> int | None:
    """The step a finished run ended at (its journal's newest trainer event says it
    finished), or None when it has not finished."""
    journal = RunFiles(run_dir).journal
    last: dict | None = None
    try:
        for record in read_records(journal):
            if record.get("kind") in ("spawn", "trainer_finished"):
                last = record
    except OSError:
        return None
    if last is None or last.get("kind") != "trainer_finished":
        return None
    step = last.get("last_step")
    return step if isinstance(step, int) else -1


def daemon_holding(files: RunFiles) -> int | None:
    """The pid of the daemon that holds the run's lock, or None when no daemon holds it."""
    try:
        fd = os.open(files.lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_pid(files.daemon_pid) or -1
    finally:
        os.close(fd)  # closing drops the lock if we took it
    return None


def _process(pid: int | None) -> psutil.Process | None:
    """The daemon's process, taken before it is asked to exit (its pid may be reused after)."""
    try:
        return psutil.Process(pid) if pid is not None and pid > 0 else None
    except psutil.Error:
        return None


def _running(daemon: psutil.Process | None) -> bool:
    """Whether the daemon still runs (a zombie has ended; its parent reaps it)."""
    try:
        return (
            daemon is not None and daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def stop_daemon(run_dir: Path, out: TextIO) -> bool:
    """SIGTERM the daemon that supervises `run_dir` (its pid file names it; it stops the
    trainer, which saves, then exits) and wait for its lock and its exit; True once it has
    exited and none holds the lock."""
    files = RunFiles(run_dir)
    pid = daemon_holding(files)
    if pid is None:
        return True
    if pid < 0:
        say(f"a daemon holds {files.lock} but {files.daemon_pid} names none; stop it first", out)
        return False
    say(f"stopping the daemon that supervises it (pid {pid})…", out)
    daemon = _process(pid)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    # It lets go of the lock before its interpreter ends: "exited" only once it has.
    while daemon_holding(files) is not None or _running(daemon):
        if time.monotonic() > deadline:
            say(f"the daemon (pid {pid}) has not exited after {SHUTDOWN_WAIT_S:.0f} s", out)
            return False
        time.sleep(0.1)
    say("the daemon has exited", out)
    return True


def start_over(run_dir: Path, out: TextIO) -> bool:
    """Empty a demo run directory (after stopping its daemon); False, saying why, when it
    is not a demo's or its daemon does not stop."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return True
    if not made_by_demo(run_dir):
        say(
            f"{run_dir} is not a demo run directory (its {CONFIG_NAME} was not written by "
            "`trainwarden demo`); refusing to delete it. Give the demo another directory.",
            out,
        )
        return False
    if not stop_daemon(run_dir, out):
        return False
    for entry in run_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    say(f"cleared {run_dir} for a fresh demo run", out)
    return True


def offer_fresh(run_dir: Path, step: int, stdin: TextIO, out: TextIO) -> bool:
    """Say the run has finished; True when the operator wants a fresh one."""
    at = f" at step {step:,}" if step >= 0 else ""
    say(f"the demo run in {run_dir} has finished{at}: there is nothing more to watch", out)
    command = f"trainwarden demo --fresh {run_dir}"
    if not stdin.isatty():
        say(f"to start it over, run `{command}`", out)
        return False
    try:
        out.write("Start a fresh demo run there (deletes the finished one)? [y/N] ")
        out.flush()
        answer = stdin.readline()
    except KeyboardInterrupt:
        out.write("\n")
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    say(f"left as it is; `{command}` starts it over", out)
    return False


# -------------------------------------------------------------- quitting


def ask_to_stop(stdin: TextIO, out: TextIO, own: bool = True, daemon_stays: bool = False) -> bool:
    """Whether to stop the run: yes by default for the demo's own run, no for a run it only
    attached to (`daemon_stays`: the demo started the trainer of a run whose daemon was up,
    so only the trainer stops). Without a terminal the default, without a prompt."""
    default = own
    if not stdin.isatty():
        if own:
            say("stdin is not a terminal: stopping the demo's run (the default)", out)
        else:
            say("stdin is not a terminal: leaving the run going (the default)", out)
        return default
    if own and daemon_stays:
        question = (
            "Stop the demo's run (this demo started its trainer; the daemon, up before, stays)?"
            " The directory is kept. [Y/n] "
        )
    elif own:
        question = "Stop the demo's run (this demo started it)? The directory is kept. [Y/n] "
    else:
        question = "The demo attached to a run that was already going. Stop it? [y/N] "
    try:
        out.write(question)
        out.flush()
        answer = stdin.readline()
    except KeyboardInterrupt:
        out.write("\n")
        return False
    answer = answer.strip().lower()
    if not answer:  # Enter, or end of input
        return default
    return answer in ("y", "yes") if not own else answer not in ("n", "no")


def shutdown(cfg: Config, out: TextIO) -> bool:
    """Stop the trainer (it saves first) and the daemon; True once the daemon has exited."""
    say("stopping the trainer (it saves a checkpoint first) and the daemon…", out)
    daemon = _process(read_pid(RunFiles(cfg.run_dir).daemon_pid))
    done, result = _ask_to_stop(cfg, "shutdown", "daemon", out)
    if done is not None:
        return done
    ckpt = (result or {}).get("checkpoint")
    if ckpt:
        say(f"newest checkpoint: step {ckpt.get('step')}", out)
    pid_file = RunFiles(cfg.run_dir).daemon_pid
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    while pid_file.exists() or daemon_status(cfg) is not None or _running(daemon):
        if time.monotonic() > deadline:
            say(f"the daemon has not exited after {SHUTDOWN_WAIT_S:.0f} s; see its log", out)
            return False
        time.sleep(0.1)
    say("the daemon has exited", out)
    return True


def stop_trainer(cfg: Config, out: TextIO) -> bool:
    """Stop the trainer (it saves first) and leave the daemon up, as the demo found it;
    True when nothing logged was lost."""
    say("stopping the trainer (it saves a checkpoint first); the daemon stays up…", out)
    done, result = _ask_to_stop(cfg, "stop", "trainer", out)
    if done is not None:
        return done
    say(describe_result("stop", result), out)
    return stop_status(result) == 0


def _ask_to_stop(cfg: Config, cmd: str, what: str, out: TextIO) -> tuple[bool | None, Any]:
    """`cmd` (stop or shutdown) sent to the run's daemon: (True, None) when it had already
    exited, (False, None) when `what` did not stop, else (None, the reply's result)."""
    try:
        with Client(cfg.socket_path, timeout=None) as client:
            return None, client.request(cmd)
    except DaemonNotRunning:
        say("the daemon had already exited", out)
        return True, None
    except (CommandRefused, ProtocolError) as exc:
        say(f"the {what} did not stop: {exc}; try `trainwarden {cmd} {cfg.run_dir}`", out)
        return False, None


def run_demo(
    run_dir: Path | None = None,
    stdin: TextIO | None = None,
    out: TextIO | None = None,
    fresh: bool = False,
) -> int:
    """The whole demo; the exit status."""
    stdin = stdin or sys.stdin
    out = out or sys.stdout
    run_dir = (run_dir or Path.cwd() / DEFAULT_DIR_NAME).expanduser().resolve()
    finished = None if fresh else finished_at(run_dir)
    if finished is not None:
        fresh = offer_fresh(run_dir, finished, stdin, out)
        if not fresh:
            return 1
    if fresh and not start_over(run_dir, out):
        return 1
    created = prepare(run_dir)
    say(f"{'created' if created else 'reusing'} the run directory {run_dir}", out)
    cfg = load_for_start(run_dir)
    started = ensure_daemon(cfg, out)

    from trainwarden.tui.launch import main as tui_main

    status = tui_main(cfg.socket_path, log_path=cfg.log_path, quit_means=started.quit_means)
    if status != 0:
        return status
    if ask_to_stop(stdin, out, started.own, daemon_stays=not started.daemon):
        stopped = shutdown(cfg, out) if started.daemon else stop_trainer(cfg, out)
    else:
        say(
            f"the run goes on; watch it with `trainwarden tui {run_dir}`, "
            f"stop it with `trainwarden shutdown {run_dir}`",
            out,
        )
        stopped = True
    say(f"the run directory is kept for inspection: {run_dir}", out)
    return 0 if stopped else 1
