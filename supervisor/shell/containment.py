"""Containment: every process a trainer start begins is found, and none outlives the start.

Each start's processes carry its marker (`TRAINWARDEN_START=<seg>-<random>`) in their
environment, inherited through every fork, setsid and exec that does not wipe it. The
daemon is a child subreaper, so a process of the trainer's tree whose parent dies is
re-parented to the daemon rather than to init: the start's tree stays below the daemon.
A start's processes are then the daemon's descendants with its marker (and whatever runs
below them), plus, for a daemon without the subreaper or after a daemon restart, every
process on the machine with the marker.

The daemon's own helpers (a format's verifier process) carry no marker and are never
touched. Adopted orphans that exit become the daemon's zombies, which asyncio's child
watcher (it waits only for the pids it started) would never reap: `Reaper` reaps them,
each by its own pid, so the trainer's exit status stays asyncio's to collect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from trainwarden.libc import LibcUnavailable, set_child_subreaper
from trainwarden.supervisor.inputs.proctree import (
    descendants,
    is_exited,
    marked_processes,
    session_of,
    start_marker_of,
    zombie_children,
)
from trainwarden.supervisor.shell.cgroups import StartCgroups
from trainwarden.supervisor.shell.process import TrainerIdentity
from trainwarden.supervisor.shell.spare import spare_pids
from trainwarden.supervisor.store.journal import Journal

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import Containment, StoppedProcess

log = logging.getLogger("trainwarden.daemon")

RESCAN_S = 0.5
KILL_WAIT_S = 10.0
"""How long a SIGKILLed process may take to go (one in uninterruptible sleep can take long)."""


def new_marker(seg: int) -> str:
    return f"{seg}-{secrets.token_hex(6)}"


def become_subreaper() -> str | None:
    """Make this process a child subreaper; why not, if it could not (None: it is one)."""
    if not sys.platform.startswith("linux"):
        return f"prctl(PR_SET_CHILD_SUBREAPER) is Linux only, not {sys.platform}"
    try:
        set_child_subreaper()
    except LibcUnavailable as exc:
        return f"prctl unavailable: {exc}"
    except OSError as exc:
        return f"prctl(PR_SET_CHILD_SUBREAPER): {exc.strerror}"
    return None


def start_processes(marker: str, run_dir: str) -> list[int]:
    """The live processes of one start (see the module's docstring), never this one."""
    me = os.getpid()
    found = {pid for pid in descendants(me) if start_marker_of(pid) == marker}
    found.update(pid for pid in marked_processes(run_dir) if start_marker_of(pid) == marker)
    for pid in list(found):
        # A process may exec with an environment of its own: what runs below a member is one.
        found.update(descendants(pid))
    found.discard(me)
    return sorted(pid for pid in found if not is_exited(pid))


def _reap(pid: int) -> str | None:
    """Reap `pid` if it is an exited child of ours: how it ended (None: not ours, or running)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done == 0:
        return None
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited {os.WEXITSTATUS(status)}"


def stop_processes(find: Callable[[], list[int]], timeout_s: float) -> list[StoppedProcess]:
    """SIGTERM every process `find` names (again each round: newcomers too), SIGKILL those
    left after `timeout_s`; blocking. One record per process: pid, cmdline, the last signal
    sent and how it ended (its exit status where it was our child)."""
    records: dict[int, StoppedProcess] = {}
    handles: dict[int, psutil.Process] = {}
    sig = signal.SIGTERM
    term_deadline = time.monotonic() + timeout_s
    kill_deadline: float | None = None

    def signal_one(pid: int, handle: psutil.Process) -> None:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            handle.send_signal(sig)
            records[pid]["signal"] = sig.name

    found_t = 0.0
    while True:
        # A full scan of the process table is not cheap: newcomers are looked for twice a
        # second, the ones already found are watched every 50 ms.
        fresh = time.monotonic() - found_t >= RESCAN_S
        for pid in find() if fresh else []:
            if pid in handles:
                continue
            try:
                handle = psutil.Process(pid)
                cmdline = handle.cmdline()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            handles[pid] = handle
            records[pid] = {"pid": pid, "cmdline": cmdline, "signal": None, "ended": None}
            signal_one(pid, handle)
        if fresh:
            found_t = time.monotonic()
        alive = []
        for pid, handle in handles.items():
            if records[pid]["ended"] is not None:
                continue
            how = _reap(pid)
            if how is not None:
                records[pid]["ended"] = how
            elif not handle.is_running() or is_exited(pid):
                records[pid]["ended"] = "gone"  # not our child: its status is its parent's
            else:
                alive.append(pid)
        now = time.monotonic()
        if not alive and fresh:
            break
        if not alive:
            found_t = 0.0  # one more scan for newcomers before calling it done
            continue
        if sig == signal.SIGTERM and now >= term_deadline:
            sig = signal.SIGKILL
            kill_deadline = now + KILL_WAIT_S
            for pid in alive:
                signal_one(pid, handles[pid])
        elif kill_deadline is not None and now >= kill_deadline:
            for pid in alive:
                records[pid]["ended"] = "still running after SIGKILL"
            break
        time.sleep(0.05)
    return list(records.values())


class Reaper:
    """Reaps the daemon's adopted orphans: zombies of its children that belonged to a start.

    A child counts as adopted if it was seen alive with a start marker, or shares a session
    with one that was (a zombie's environment reads empty, but its session id stays).
    `keep` names the pids another waiter (asyncio's child watcher) collects itself.
    """

    def __init__(self, keep: Callable[[], set[int]]) -> None:
        self.keep = keep
        self.members: dict[int, int] = {}
        """pid -> session id of each start process seen below the daemon."""

    def sweep(self) -> list[int]:
        me = os.getpid()
        for pid in descendants(me):
            if pid not in self.members and start_marker_of(pid) is not None:
                sid = session_of(pid)
                if sid is not None:
                    self.members[pid] = sid
        sessions = set(self.members.values())
        keep = self.keep()
        reaped = []
        for pid, sid in zombie_children(me):
            if pid in keep or (pid not in self.members and sid not in sessions):
                continue
            if _reap(pid) is not None:
                reaped.append(pid)
        for pid in list(self.members):
            if pid in reaped or not os.path.exists(f"/proc/{pid}"):
                del self.members[pid]
        return reaped


async def stop_leftovers(
    trainer_pid_file: Path,
    run_dir: str,
    cgroups: StartCgroups | None,
    stop_timeout_s: float,
    journal: Journal,
) -> bool:
    """Stop what an earlier daemon left running: the trainer `trainer_pid_file` names and
    every process of any start of this run, found by marker (and, where the daemon makes
    them, in the starts' cgroups), so also a trainer whose pid the old daemon never
    recorded (it was killed between the fork and the pid file). Whether any was found."""
    identity = TrainerIdentity.load(trainer_pid_file)
    main = identity if identity is not None and identity.alive() else None
    old_starts = cgroups.markers() if cgroups is not None else []
    spares: set[int] = set()
    # The old daemon's spare (see shell.spare) is no start's: ended with its cgroup, unlisted.

    def find() -> list[int]:
        found = set(marked_processes(run_dir))
        if main is not None and main.alive():
            found.add(main.pid)
            found.update(descendants(main.pid))
        if cgroups is not None:
            for marker in old_starts:
                in_cgroup = cgroups.procs(marker)
                spares.update(spare_pids(in_cgroup))
                found.update(in_cgroup)
        return sorted(found - spares)

    leftovers = await asyncio.to_thread(find)
    if not leftovers:
        if cgroups is not None:
            for marker in old_starts:
                await asyncio.to_thread(cgroups.end, marker)
        return False
    pid = main.pid if main is not None else None
    journal.append(
        {"kind": "leftover_trainer", "pid": pid, "processes": leftovers, "action": "stopping"}
    )
    ended = await asyncio.to_thread(stop_processes, find, stop_timeout_s)
    if cgroups is not None:
        for marker in old_starts:
            killed = await asyncio.to_thread(cgroups.end, marker)
            ended += [{"pid": p, "ended": "cgroup.kill"} for p in killed if p not in spares]
    journal.append({"kind": "leftover_trainer_stopped", "pid": pid, "processes": ended})
    return True


async def reap_adopted(trainer: Callable[[], set[int]], interval_s: float) -> None:
    """Reap the orphans the subreaper adopted once they exit (see Reaper), every
    `interval_s`; `trainer`: the live trainer's pid, which is asyncio's to reap."""
    reaper = Reaper(trainer)
    while True:
        await asyncio.sleep(interval_s)
        reaper.sweep()


def contain(run_dir: Path, journal: Journal) -> StartCgroups | None:
    """Become the trainers' subreaper and find where each start's cgroup goes (None: no
    cgroups here); journal what could be had (`containment`)."""
    not_subreaper = become_subreaper()
    cgroups, no_cgroups = StartCgroups.find(run_dir)
    containment: Containment = {
        "kind": "containment",
        "subreaper": not_subreaper is None,
        "cgroups": str(cgroups.base) if cgroups is not None else None,
    }
    if not_subreaper is not None:
        # Orphans of the trainer's tree then go to init: still found by their marker.
        containment["subreaper_error"] = not_subreaper
        log.warning("not a child subreaper: %s", not_subreaper)
    if cgroups is None:
        containment["cgroups_error"] = no_cgroups
    journal.append(containment)
    return cgroups
