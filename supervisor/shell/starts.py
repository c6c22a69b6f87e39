"""The trainer's starts: each made, awaited to its exit, and what it left behind stopped.

A start: the checkpoint it resumes from checked against its digest, the last start's
processes gone and their lines read, the in-place trainer's fixed file prepared, the intent
journaled (durable before the fork), the trainer spawned in its own cgroup, its identity
recorded (trainer.pid). Its exit: its last lines and commits read, then reported to the
policy, then everything left of it stopped (containment) before any next start. Outcomes
(TrainerSpawned, SpawnFailed, ResumeRefused) go to `outcomes`, which the daemon's loop
takes before its queue. The executor (shell.executor) hands each Spawn action here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import psutil

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.inputs.resume_read import ResumeReadWatch
from trainwarden.supervisor.shell.cgroups import StartCgroups
from trainwarden.supervisor.shell.containment import new_marker, start_processes, stop_processes
from trainwarden.supervisor.shell.hub import TelemetryHub
from trainwarden.supervisor.shell.process import (
    TrainerIdentity,
    end_partial_line,
    spawn,
    spawn_failure,
)
from trainwarden.supervisor.shell.snapshots import Snapshots
from trainwarden.supervisor.shell.spare import Spare, SpareGone, Spares
from trainwarden.supervisor.shell.spawning import resume_path, trainer_argv, trainer_env
from trainwarden.supervisor.store.appendfile import no_space
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.digest import digest_checkpoint
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.rundir import RunFiles

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import Spawn as SpawnRecord
    from trainwarden.supervisor.core.records import StartCgroup

NO_SPACE_WORDS = ("No space left on device", "ENOSPC", "Disk quota exceeded")
"""What a trainer's last line says when it died on a full disk (strerror, errno names)."""

log = logging.getLogger("trainwarden.daemon")


async def _nothing() -> None:
    return None


def signal_name(returncode: int) -> str | None:
    """SIGKILL for -9; None for an exit status or a number no signal has."""
    try:
        return signal.Signals(-returncode).name if returncode < 0 else None
    except ValueError:
        return None


class Starts:
    """The run's trainer starts, one at a time: the live one's process and what is pending
    of the last one (its identity to save, its containment)."""

    def __init__(
        self,
        cfg: Config,
        files: RunFiles,
        store: CheckpointStore,
        journal: Journal,
        hub: TelemetryHub,
        report: Callable[[core.Event], None],
        on_trainer_exit: Callable[[], None],
    ) -> None:
        self.cfg = cfg
        self.files = files
        self.store = store
        self.journal = journal
        self.hub = hub
        self.report = report
        """Queue an event for the policy."""
        self.on_trainer_exit = on_trainer_exit
        self.proc: asyncio.subprocess.Process | None = None
        """The live (or last) trainer process."""
        self.outcomes: deque[core.Event] = deque()
        """A start's outcome (TrainerSpawned, SpawnFailed, ResumeRefused): the daemon's loop
        takes these before its queue, so the outcome is decided before anything queued
        while the start was being made (a stop or shutdown that came in meanwhile must
        find the trainer it is to stop)."""
        self.cgroups: StartCgroups | None = None
        """Each start's cgroup, where the daemon may make them (see shell.cgroups)."""
        self.spares: Spares | None = None
        """The next start's process, made ahead in its cgroup where there are cgroups."""
        self.identity_unsaved: TrainerIdentity | None = None
        """The live trainer's identity the disk had no space for (trainer.pid), to save."""
        self.settle_commits: Callable[[], Awaitable[None]] = _nothing
        """Have every commit made so far reported (the watcher's settle)."""
        self.containing: asyncio.Task[None] | None = None
        """The ended start's remaining processes being stopped: awaited before any spawn."""
        self.snapshots: Snapshots | None = None
        """An in-place trainer's fixed file: set up for each start (see shell.snapshots)."""
        self.resume_read: ResumeReadWatch | None = None
        """Opens of the checkpoint the live start was given (see inputs.resume_read)."""

    async def _resume_refusal(self, ckpt: core.Ckpt) -> str | None:
        """Why the checkpoint a start would resume from may not be used: its files no
        longer match the digest taken at its commit (None: they do)."""
        if not ckpt.digest:
            return None
        try:
            digest = await asyncio.to_thread(digest_checkpoint, self.store.files_of(ckpt.name))
        except FileNotFoundError as exc:
            return f"{exc.filename or ckpt.name} vanished after its commit"
        except (OSError, ValueError) as exc:
            return f"cannot read it: {getattr(exc, 'strerror', None) or exc}"
        if digest.hex != ckpt.digest:
            return f"its files read as digest {digest.hex}, {ckpt.digest} at commit"
        return None

    async def spawn(self, action: core.Spawn) -> None:
        if action.resume is not None:
            refusal = await self._resume_refusal(action.resume)
            if refusal is not None:
                step, name = action.resume.step, action.resume.name
                self.outcomes.append(core.ResumeRefused(time.monotonic(), step, name, refusal))
                return
        # Nothing of the previous start may run beside the new one, nor its lines count as
        # the new start's: its last processes are gone and their lines read (as stray) first.
        await self.finish_containment()
        await self.hub.drain_log()
        if self.snapshots is not None:
            # Only now, with nothing of the last start left to write it: the fixed file.
            refused = await self.snapshots.prepare(action.resume, action.leftover)
            if isinstance(refused, core.FixedFileLeftover):
                self.outcomes.append(refused)  # the policy says what becomes of it
                return
            if refused is not None:
                self.outcomes.append(core.SpawnFailed(time.monotonic(), refused))
                return
        if self.spares is None and self.cgroups is not None:
            self.spares = Spares(self.cgroups, new_marker)
        spare = self.spares.take(action.seg) if self.spares is not None else None
        marker = spare.marker if spare is not None else new_marker(action.seg)
        argv = trainer_argv(self.cfg, self.store.dir, action)
        env = trainer_env(self.cfg, self.store.dir, action, marker)
        # The intent, durable before the fork: a daemon killed at any instant after it finds
        # this start's processes by the marker even if it never learned the trainer's pid.
        self.journal.append(spawn_intent(action, argv, marker), sync=True)
        resume_file = resume_path(self.cfg, self.store.dir, action)
        self.hub.begin_segment(
            action.seg,
            action.resume.step if action.resume else None,
            pivot=action.pivot,
            timeline=action.timeline,
            resume_names=(action.resume.name, str(resume_file)) if action.resume else (),
        )
        # Made after our own reads of the checkpoint: what opens it from here is the start.
        self.resume_read = ResumeReadWatch(resume_file) if resume_file is not None else None
        # The new trainer may print (a NaN, even) before the spawn returns: its lines are
        # queued and reach the policy after the spawn's outcome, which the daemon's loop
        # takes before its queue.
        try:
            proc, in_cgroup = await self._start_process(argv, env, marker, spare)
        except OSError as exc:
            self._close_resume_read()
            failure = spawn_failure(argv, self.cfg.trainer_cwd, env, exc)
            if self.cgroups is not None:
                with contextlib.suppress(OSError):
                    self.cgroups.path(marker).rmdir()  # made for a start that never ran
            self.outcomes.append(core.SpawnFailed(time.monotonic(), failure))
            return
        self.proc = proc
        self.journal.append(
            {
                "kind": "trainer_started",
                "pid": proc.pid,
                "seg": action.seg,
                "marker": marker,
                **in_cgroup,
            }
        )
        if self.spares is not None:
            self.spares.plan(action.seg + 1, proc)
        self.outcomes.append(core.TrainerSpawned(time.monotonic(), proc.pid))
        asyncio.get_running_loop().create_task(self._await_exit(proc, marker))
        await self._record_identity(proc.pid, marker)

    async def _start_process(
        self, argv: list[str], env: dict[str, str], marker: str, spare: Spare | None
    ) -> tuple[asyncio.subprocess.Process, StartCgroup]:
        """The trainer's process, run in the spare or spawned into its cgroup, and what its
        `trainer_started` record says of its cgroup. OSError as a spawn raises it."""
        cwd, log_path = self.cfg.trainer_cwd, self.cfg.log_path
        if spare is not None:
            try:
                proc = await spawn(argv, cwd, env, log_path, spare=spare)
                return proc, {"cgroup": str(spare.cgroups.path(marker)), "spare": True}
            except SpareGone as gone:
                log.warning("the spare start was gone (%s): spawning the trainer", gone)
                await spare.end()  # what is left of it, and its cgroup, made again below
            except OSError:
                await spare.end()  # its exec failed: it exits, its cgroup is removed
                raise
        procs_fd, no_procs_fd = (
            self.cgroups.open_for_child(marker) if self.cgroups is not None else (None, None)
        )
        try:
            proc = await spawn(argv, cwd, env, log_path, procs_fd)
        finally:
            if procs_fd is not None:
                os.close(procs_fd)
        if self.cgroups is None:
            return proc, {}
        # The child joined before its exec; checked (and done) again here for a child
        # whose own write was refused: the error says why.
        refused = self.cgroups.join(marker, proc.pid) if no_procs_fd is None else no_procs_fd
        if refused is not None:
            return proc, {"cgroup": None, "cgroup_error": refused}
        return proc, {"cgroup": str(self.cgroups.path(marker))}

    def drop_spare(self) -> None:
        """The run halted, or the daemon shuts down: no start is coming soon, so no spare
        waits for one."""
        if self.spares is not None:
            self.spares.drop()

    async def end_spare(self) -> None:
        """The daemon exits: its spare (and any being made) gone first."""
        if self.spares is not None:
            await self.spares.end()

    async def _record_identity(self, pid: int, marker: str) -> None:
        """Write trainer.pid for a trainer just started (a daemon killed later finds it)."""
        try:
            # In a thread: while the child is still inside execve its cmdline reads empty,
            # and TrainerIdentity.of waits (sleeping) for it.
            identity = await asyncio.to_thread(TrainerIdentity.of, pid, marker)
        except Exception as exc:  # it may already have died; its exit is reported anyway
            # A trainer that died at once is no news (its crash is journaled): said once
            # per crash, this line would flood the daemon's log in a fast crash loop.
            gone = isinstance(exc, psutil.NoSuchProcess)  # a zombie too
            (log.debug if gone else log.warning)("could not record the trainer's identity: %s", exc)
            return
        self.identity_unsaved = identity
        await self.save_identity()

    async def save_identity(self) -> None:
        """Write trainer.pid for the live trainer; on a full disk, again on the next retry
        (a daemon killed meanwhile still finds the trainer by its start marker)."""
        identity, path = self.identity_unsaved, self.files.trainer_pid
        if identity is None:
            return
        try:
            await asyncio.to_thread(identity.save, path)
        except OSError as exc:
            if not no_space(exc):
                self.identity_unsaved = None
                log.warning("could not record the trainer's identity: %s", exc)
                return
            self.journal.space.filled(path, exc, "the trainer is found by its start marker")
            return
        self.identity_unsaved = None
        self.journal.space.emptied(path, "the trainer's identity")

    async def _await_exit(self, proc: asyncio.subprocess.Process, marker: str) -> None:
        returncode = await proc.wait()
        if self.identity_unsaved is not None and self.identity_unsaved.pid == proc.pid:
            self.identity_unsaved = None  # nothing left to record
            self.journal.space.forget(self.files.trainer_pid)
        # The trainer's last lines (its final checkpoint, its last steps) are in the log
        # before its exit, and its last commits in the watcher's queue: read them first so
        # the policy sees them in order. A line it was killed in the middle of is its own.
        end_partial_line(self.cfg.log_path)
        await self.hub.drain_log()
        read_resume = self._close_resume_read() or self.hub.resume_mentioned
        last_line = self.hub.start_last_line
        self.hub.end_segment()
        await self.settle_commits()
        if self.snapshots is not None:
            # Its last write of the fixed file, snapshotted (or rejected) and the snapshot's
            # commit queued, before the exit is decided on: a restart resumes from it.
            await self.snapshots.settle()
            await self.settle_commits()
        self.report(
            core.TrainerExited(
                time.monotonic(),
                proc.pid,
                returncode,
                signal_name(returncode),
                contained=False,
                read_resume=read_resume,
                last_line=last_line,
                disk_full=self._disk_full(last_line),
            )
        )
        # Created before the policy can act on the exit: a spawn or a shutdown awaits it.
        self.containing = asyncio.get_running_loop().create_task(self._contain(marker))
        self.on_trainer_exit()

    def _disk_full(self, last_line: str | None) -> bool:
        """Whether the disk had no room when the trainer died: its last line says so, the
        daemon's own writes are failing, or the checkpoint folder has no byte free."""
        if last_line is not None and any(word in last_line for word in NO_SPACE_WORDS):
            return True
        if self.journal.space.full:
            return True
        try:
            return os.statvfs(self.store.dir).f_bavail == 0
        except OSError:
            return False

    def _close_resume_read(self) -> bool:
        """Whether the start opened its checkpoint; the watch is closed."""
        watch, self.resume_read = self.resume_read, None
        if watch is None:
            return False
        opened = watch.opened()
        watch.close()
        return opened

    async def _contain(self, marker: str) -> None:
        """Stop whatever the ended start left running, journal what that was, and report it
        (after its last commits, so they are verified before anything new starts)."""
        try:
            await self._stop_start(marker)
        finally:
            await self.settle_commits()
            self.report(core.StartContained(time.monotonic()))

    async def _stop_start(self, marker: str) -> None:
        run_dir = str(self.cfg.run_dir)
        cgroups = self.cgroups

        def find() -> list[int]:
            found = set(start_processes(marker, run_dir))
            if cgroups is not None:
                found.update(cgroups.procs(marker))  # whatever they did to their environment
            return sorted(found)

        try:
            ended = await asyncio.to_thread(stop_processes, find, self.cfg.trainer.stop_timeout_s)
            if cgroups is not None:
                killed = await asyncio.to_thread(cgroups.end, marker)
                ended += [{"pid": pid, "ended": "cgroup.kill"} for pid in killed]
        except Exception as exc:  # never fatal to the loop: the next daemon looks again
            self.journal.append(
                {"kind": "containment_failed", "marker": marker, "error": repr(exc)}
            )
            log.exception("could not stop the processes of start %s", marker)
            return
        if ended:
            self.journal.append(
                {"kind": "leftover_processes", "marker": marker, "processes": ended}
            )
            log.warning("stopped %d leftover processes of start %s", len(ended), marker)

    def live_pids(self) -> set[int]:
        """The live trainer's pid (its exit status is asyncio's to collect), or none."""
        proc = self.proc
        return {proc.pid} if proc is not None and proc.returncode is None else set()

    async def finish_containment(self) -> None:
        if self.containing is not None:
            await self.containing
            self.containing = None


def spawn_intent(action: core.Spawn, argv: list[str], marker: str) -> SpawnRecord:
    """The `spawn` record: what a start is to be, journaled before its fork."""
    intent: SpawnRecord = {
        "kind": "spawn",
        "seg": action.seg,
        "resume": core.ckpt_json(action.resume),
        "pivot": action.pivot,
        "argv": argv,
        "marker": marker,
    }
    if action.rollback_from is not None:
        intent["rollback_from"] = action.rollback_from
    if action.skip_data:
        intent["skip_data"] = [list(w) for w in action.skip_data]
    if action.lr_scale != 1.0:
        intent["lr_scale"] = action.lr_scale
    return intent
