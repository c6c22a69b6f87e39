"""Which processes are ours: the one check that guards every kill of a recorded pid, and
the few process-table reads around it (liveness, the reference trainer's command line).

Pids are recycled, so a pid read from a journal or a pid file is killed only after
`belongs_to_run` says the process there now is one of the run's.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

REFERENCE_TRAINER_MODULE = b"trainwarden.trainer"
REFERENCE_TRAINER_SCRIPT = b"trainwarden-trainer"


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def is_zombie(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(b") ", 1)[-1][:1] == b"Z"


def pid_alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie waiting for its parent is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not is_zombie(pid)


def argv_of(pid: int) -> list[bytes]:
    raw = _read(f"/proc/{pid}/cmdline")
    return raw.rstrip(b"\0").split(b"\0") if raw else []


def runs_reference_trainer(argv: list[bytes]) -> bool:
    """`python -m trainwarden.trainer ...` or the `trainwarden-trainer` script."""
    if any(
        a == b"-m" and b == REFERENCE_TRAINER_MODULE for a, b in zip(argv, argv[1:], strict=False)
    ):
        return True
    return any(os.path.basename(a) == REFERENCE_TRAINER_SCRIPT for a in argv[:2])


def runs_scripted_trainer(argv: list[bytes]) -> bool:
    """`python tests/scripted_trainer.py ...`."""
    return len(argv) > 1 and os.path.basename(argv[1]) == b"scripted_trainer.py"


def runs_a_trainer(argv: list[bytes]) -> bool:
    """The reference trainer or the scripted one."""
    return runs_reference_trainer(argv) or runs_scripted_trainer(argv)


def _inside(path: str, run: str) -> bool:
    return path == run or path.startswith(run + "/")


def belongs_to_run(pid: int | None, run_dir: Path, *, reference_trainer: bool = False) -> bool:
    """Whether `pid` is a live process of this run: it works in the run directory (or below),
    its daemon started it (TRAINWARDEN_RUN_DIR names the directory), or its command line
    names a path inside it. With `reference_trainer`, it must also be the reference trainer.
    """
    if not pid:
        return False
    argv = argv_of(pid)
    if reference_trainer and not runs_reference_trainer(argv):
        return False
    if not pid_alive(pid):
        return False
    run = str(run_dir.resolve())
    with contextlib.suppress(OSError):
        if _inside(os.readlink(f"/proc/{pid}/cwd"), run):
            return True
    environ = _read(f"/proc/{pid}/environ") or b""
    for entry in environ.split(b"\0"):
        if entry.startswith(b"TRAINWARDEN_RUN_DIR=") and _inside(
            entry[len(b"TRAINWARDEN_RUN_DIR=") :].decode(errors="replace"), run
        ):
            return True
    named = run.encode()
    return any(a == named or named + b"/" in a for a in argv)


def kill_quietly(pid: int | None, group: bool = True) -> None:
    """SIGKILL pid (its whole process group by default); gone already is fine."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
