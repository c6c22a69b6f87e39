"""Which daemon supervises a run, for daemons on other machines: `.trainwarden/lease.json`.

The run's lock (rundir.acquire_lock, an flock) keeps two daemons on one machine apart. A
run directory on shared storage (NFS, Lustre) is seen by several machines, where file locks
may not hold at all; the lease does what they cannot. A daemon writes it when it starts:
its host, its Slurm job and node when it runs in one, its pid, when it started. It touches
the file every BEAT_S while it runs and removes it when it exits.

A daemon that finds a lease decides from it (`verdict`) whether its holder still runs:

- the lease is its own job's (a requeued job keeps its id): the previous segment, which
  Slurm ended before starting this one;
- another job's: Slurm is asked (`scontrol show job`); a job that no longer runs (ended,
  requeued and pending, or forgotten by Slurm) holds nothing;
- when Slurm cannot say, or the holder is in no job: a holder on this machine is left to
  the run's lock to judge (it names the holder's pid); another machine's holder is alive
  while its lease is touched, and gone once it is STALE_S old.

The one-line refusal names the job, the node and how to end it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from trainwarden.supervisor.store.rundir import RunFiles, write_atomic

BEAT_S = 30.0
"""How often a live daemon touches its lease."""
STALE_S = 5 * BEAT_S
"""A lease untouched this long belongs to a daemon that is gone (or whose machine is)."""

STILL_RUNS = frozenset(
    {
        "RUNNING",
        "COMPLETING",
        "CONFIGURING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "RESIZING",
        "STAGE_OUT",
    }
)
"""Slurm job states in which the job's processes may still run (squeue's long names)."""


@dataclass(frozen=True)
class Lease:
    host: str
    pid: int
    started: float
    """time.time() at the daemon's start."""
    job_id: str | None = None
    node: str | None = None

    def where(self) -> str:
        """The holder in words: "Slurm job 4242 on node07 (daemon pid 812)"."""
        node = self.node or self.host
        if self.job_id is not None:
            return f"Slurm job {self.job_id} on {node} (daemon pid {self.pid})"
        return f"the daemon with pid {self.pid} on {node}"


def lease_path(files: RunFiles) -> Path:
    return files.state_dir / "lease.json"


def read_lease(files: RunFiles) -> tuple[Lease | None, float | None]:
    """The lease and when it was last touched (time.time()); (None, None) when there is
    none or it cannot be read as one."""
    path = lease_path(files)
    try:
        # Not through a link, and never blocking on a FIFO in its place: a lease is a small
        # regular file the daemon wrote, anything else is none.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None, None
            touched = info.st_mtime
            data = json.loads(f.read(4096))
        lease = Lease(
            host=str(data["host"]),
            pid=int(data["pid"]),
            started=float(data["started"]),
            job_id=None if data.get("job_id") is None else str(data["job_id"]),
            node=None if data.get("node") is None else str(data["node"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    return lease, touched


def write_lease(files: RunFiles, lease: Lease) -> OSError | None:
    """Write the lease; the error when it could not be written (a full disk: the daemon
    supervises all the same, and the run's lock still keeps this machine's daemons apart)."""
    try:
        write_atomic(lease_path(files), json.dumps(asdict(lease)).encode() + b"\n")
    except OSError as exc:
        return exc
    return None


def touch(files: RunFiles, lease: Lease) -> None:
    """Say the holder still runs (its mtime); a lease someone else took over is left alone."""
    held, _ = read_lease(files)
    if held == lease:
        with contextlib.suppress(OSError):
            os.utime(lease_path(files))


def drop(files: RunFiles, lease: Lease) -> None:
    """Remove the lease at a clean exit, if it is still this daemon's."""
    held, _ = read_lease(files)
    if held == lease:
        with contextlib.suppress(FileNotFoundError):
            lease_path(files).unlink()


def verdict(
    held: Lease | None,
    touched: float | None,
    me: Lease,
    job_state: Callable[[str], str | None],
    now: float,
) -> str | None:
    """None when this daemon (`me`) may take the run; else why not, in words. `job_state`
    asks Slurm for a job's state (None: Slurm could not say; "" : no such job)."""
    if held is None or held == me:
        return None
    if held.job_id is not None and held.job_id == me.job_id:
        return None  # this job's previous segment: Slurm ended it before starting this one
    if held.job_id is not None:
        state = job_state(held.job_id)
        if state is not None:
            return None if state not in STILL_RUNS else f"{held.where()}, {state.lower()}"
    if held.host == me.host:
        return None  # the run's lock knows better, and says so
    if touched is None or now - touched >= STALE_S:
        return None
    return f"{held.where()}, its lease touched {max(now - touched, 0.0):.0f} s ago"


def refusal(run_dir: Path, why: str, held: Lease) -> str:
    """The one line a refused daemon prints."""
    if held.job_id is not None:
        end = f"it is taken over once that job ends (`scancel {held.job_id}` ends it)"
    else:
        end = f"stop it with `trainwarden shutdown {run_dir}` on {held.node or held.host}"
    return f"{run_dir} is already supervised by {why}; {end}"


def elsewhere(files: RunFiles, this_host: str, command: str, now: float) -> str | None:
    """Where to go when the run's daemon runs on another machine (its lease names another
    host and is fresh): a control socket answers only on its own machine. None: not so."""
    held, touched = read_lease(files)
    if held is None or held.host == this_host or touched is None or now - touched >= STALE_S:
        return None
    node = held.node or held.host
    ssh = "ssh -t" if command == "tui" else "ssh"
    return (
        f"the daemon of {files.run_dir} runs on {node} ({held.where()}), not on this machine"
        f" ({this_host}), and its socket answers only there: `{ssh} {node} trainwarden"
        f" {command} {files.run_dir}`"
    )
