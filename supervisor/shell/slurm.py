"""The Slurm job a daemon runs in: its limit read once, the pre-timeout signal and the end
time watched, and each turned into the policy's RequeueRequested (see core.requeue); and
the run's lease, which keeps daemons on other machines (other jobs) off the run.

The signal is the one [slurm] signal names (sbatch --signal=B:USR1@SECONDS sends it to
the batch shell, which `exec` made the daemon). The daemon catches it from the start of
its run and hands it here (`signalled`) once the start is queued; outside a job it is
journaled as ignored. Without the signal, the daemon acts [slurm] act_before_end_s before
the end time scontrol reported, after asking scontrol again: an operator's `scontrol
update TimeLimit=` may have moved the end, and the timer follows it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable

from trainwarden.supervisor.config_schema import SlurmConfig
from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.errors import LockHeld
from trainwarden.supervisor.inputs import slurm_job
from trainwarden.supervisor.inputs.slurm_job import JobLimit, Segment, SlurmJob
from trainwarden.supervisor.protocol import SlurmJobRecord, SlurmJobView
from trainwarden.supervisor.shell import views
from trainwarden.supervisor.store import lease
from trainwarden.supervisor.store.appendfile import DiskSpace
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.rundir import RunFiles

log = logging.getLogger("trainwarden")


class JobWatch:
    """One daemon's job segment: what it journals and shows, and when it asks to leave."""

    def __init__(
        self,
        job: SlurmJob,
        segment: Segment,
        cfg: SlurmConfig,
        report: Callable[[core.Event], None],
    ) -> None:
        self.job = job
        self.segment = segment
        self.cfg = cfg
        self.report = report
        self.limit: JobLimit | None = None
        """The job's time limit, once scontrol has answered."""
        self._timer: asyncio.TimerHandle | None = None
        self._checking: asyncio.Task[None] | None = None
        """The end time being asked again (held: the loop keeps only weak references)."""

    def record(self) -> SlurmJobRecord:
        return views.slurm_record(self.job, self.limit, self.segment)

    def view(self, wall: float) -> SlurmJobView | None:
        return views.slurm_view(self.job, self.limit, self.segment, wall)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    async def read_limit(self, journal: Journal, changed: Callable[[], None]) -> None:
        """Ask scontrol for the job's time limit (in a thread: it may take seconds), journal
        the segment (`slurm_job`), show it, and arm the end-time timer. Whatever scontrol
        does, the limit is at worst unknown."""
        self.limit = await asyncio.to_thread(slurm_job.read_limit, self.job.job_id)
        journal.append({"kind": "slurm_job", **self.record()}, sync=True)
        if self.cfg.requeue and self.limit.requeue is False:
            # Said now: at the limit the save is made, and the job then ends for good.
            journal.append({"kind": "slurm_not_requeueable", "job_id": self.job.job_id})
            log.warning(
                "Slurm will refuse to requeue job %s (scontrol shows Requeue=0: submitted with"
                " --no-requeue, or the cluster's JobRequeue=0): at its time limit the trainer"
                " saves and the run stops there; submit it with `#SBATCH --requeue`",
                self.job.job_id,
            )
        truncated = slurm_job.output_truncated(os.environ)
        if truncated is not None:
            # Said now, while there is time to fix the script before the next segment.
            journal.append({"kind": "slurm_output_truncates", "path": truncated})
            log.warning(
                "the job's output %s is truncated when the job starts again: add"
                " `#SBATCH --open-mode=append` to the batch script so a requeue keeps it",
                truncated,
            )
        changed()
        self._arm(asyncio.get_running_loop())

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        at = slurm_job.act_at(
            self.limit.end_time if self.limit else None, self.cfg.act_before_end_s
        )
        if at is None:
            return
        self._timer = loop.call_later(max(at - time.time(), 0.0), self._end_near, loop)

    def _end_near(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._checking = loop.create_task(self._check_end(loop))

    async def _check_end(self, loop: asyncio.AbstractEventLoop) -> None:
        """The end time as scontrol says it now: moved later, wait for it; else leave, by
        the end it says now (an operator may have moved it earlier too)."""
        before = self.limit
        now = await asyncio.to_thread(slurm_job.read_limit, self.job.job_id)
        if now.end_time is not None:
            later = before is None or before.end_time is None or now.end_time > before.end_time + 1
            self.limit = now
            if later:
                self._arm(loop)
                return
        self._ask("end_time")

    def signalled(self, name: str) -> None:
        """The job's pre-timeout signal, `name`d (the daemon catches it, see shell.job_signal)."""
        self._ask(name)

    def _ask(self, why: str) -> None:
        end = self.limit.end_time if self.limit is not None else None
        left = slurm_job.seconds_left(end, time.time())
        t = time.monotonic()
        self.report(core.RequeueRequested(t, why, t + left, self.cfg.requeue))


async def take_run(files: RunFiles, job: SlurmJob | None, started: float) -> lease.Lease:
    """This daemon's lease on the run, unless another daemon's still holds it: then
    LockHeld, in one line naming its job and node (see store.lease). Asking Slurm may take
    seconds: in a thread."""
    me = lease.Lease(
        host=socket.gethostname(),
        pid=os.getpid(),
        started=started,
        job_id=job.job_id if job is not None else None,
        node=job.node if job is not None else None,
    )
    held, touched = lease.read_lease(files)
    if held is not None and held != me:
        why = await asyncio.to_thread(
            lease.verdict, held, touched, me, slurm_job.job_state, time.time()
        )
        if why is not None:
            raise LockHeld(lease.refusal(files.run_dir, why, held))
    return me


async def keep_lease(files: RunFiles, me: lease.Lease) -> None:
    """Touch the lease every BEAT_S while the daemon runs (a chore)."""
    while True:
        await asyncio.sleep(lease.BEAT_S)
        await asyncio.to_thread(lease.touch, files, me)


async def requeue_last(files: RunFiles, space: DiskSpace, job_id: str, code: int | None) -> None:
    """`scontrol requeue`, the daemon's last act: everything is closed and journaled, the
    lease and the lock let go. Slurm kills the job's processes as soon as it takes the
    requeue; when it refuses, the refusal is journaled after the exit record, and the exit
    record again after it."""
    error = await asyncio.to_thread(slurm_job.requeue, job_id)
    if error is None:
        return
    log.error("Slurm did not requeue job %s: %s", job_id, error)
    journal = Journal(files.journal, space)
    journal.append({"kind": "slurm_requeue_failed", "job_id": job_id, "error": error})
    journal.append({"kind": "daemon_exit", "code": code})
    journal.close()
