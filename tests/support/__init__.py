"""What the tests, the chaos soak and bench/ share: one daemon driver, one run factory, one
process-ownership check and one wait helper. No pytest in here: bench runs without it.

    daemon  DaemonProcess, running_daemon, refused_start (a config the daemon must refuse)
    runs    make_run (reference_run, scripted_run), trainer argv, journal/checkpoint readers
    procs   belongs_to_run (guards every kill of a recorded pid), pid_alive, kill_quietly
    wait    wait_for (raises), poll (returns None), wait_for_async (for pilots)
    clients Crowd: misbehaving control-socket clients on threads (import it from there)
    longrun a trainer that logs fast, a daemon with frequent loss-cache rebuilds (likewise)
"""

from tests.support.daemon import DaemonProcess, refused_start, running_daemon
from tests.support.procs import belongs_to_run, kill_quietly, pid_alive
from tests.support.runs import (
    PYTHON,
    REFERENCE_TRAINER,
    REPO,
    SCRIPTED_TRAINER,
    checkpoints,
    journal,
    journal_kinds,
    make_run,
    reference_run,
    scripted_argv,
    scripted_run,
    started_trainer_pids,
    trainer_argv,
    trainer_pid,
)
from tests.support.wait import WaitTimeout, poll, wait_for, wait_for_async

__all__ = [
    "PYTHON",
    "REFERENCE_TRAINER",
    "REPO",
    "SCRIPTED_TRAINER",
    "DaemonProcess",
    "WaitTimeout",
    "belongs_to_run",
    "checkpoints",
    "journal",
    "journal_kinds",
    "kill_quietly",
    "make_run",
    "pid_alive",
    "poll",
    "reference_run",
    "refused_start",
    "running_daemon",
    "scripted_argv",
    "scripted_run",
    "started_trainer_pids",
    "trainer_argv",
    "trainer_pid",
    "wait_for",
    "wait_for_async",
]
