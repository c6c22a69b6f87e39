"""The daemon: one asyncio loop that owns the state, feeds events to the policy
(trainwarden.supervisor.core) and has the executor carry out the actions it returns.

The loop is the only place the state changes, and only to what `core.decide` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwarden.supervisor import __version__
from trainwarden.supervisor import registry as plugin_registry
from trainwarden.supervisor.config import Config
from trainwarden.supervisor.config_checks import slurm_signal
from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.inputs import signals, slurm_job
from trainwarden.supervisor.inputs.checkpoint_watch import CheckpointWatcher
from trainwarden.supervisor.inputs.gpu_events import GpuEventWatcher
from trainwarden.supervisor.protocol import (
    CheckpointsView,
    DumpResult,
    HistoryOfResult,
    HistoryResult,
    RelatedRun,
    StateView,
    StatusResult,
)
from trainwarden.supervisor.serve.notify import watchdog_pings
from trainwarden.supervisor.shell import config_watch, views
from trainwarden.supervisor.shell.alerts import Alerter
from trainwarden.supervisor.shell.boot import (
    journal_links,
    last_state_record,
    report_moved_links,
    rules_from,
    start_metrics,
    watched_paths,
    with_resolved_log,
)
from trainwarden.supervisor.shell.cgroups import StartCgroups
from trainwarden.supervisor.shell.config_watch import ConfigWatch
from trainwarden.supervisor.shell.containment import contain, reap_adopted, stop_leftovers
from trainwarden.supervisor.shell.executor import Executor
from trainwarden.supervisor.shell.gpu_watch import watch_gpus
from trainwarden.supervisor.shell.hangdump import dump_stacks
from trainwarden.supervisor.shell.hub import TelemetryHub
from trainwarden.supervisor.shell.job_signal import JobSignal
from trainwarden.supervisor.shell.pivot_files import archive_dir as archive_dir
from trainwarden.supervisor.shell.pivot_files import pivot_context
from trainwarden.supervisor.shell.slurm import JobWatch, keep_lease, requeue_last, take_run
from trainwarden.supervisor.shell.snapshots import Snapshots, fixed_file
from trainwarden.supervisor.shell.ticks import Ticks
from trainwarden.supervisor.shell.verdicts import CheckpointReports
from trainwarden.supervisor.store.appendfile import DiskSpace, no_space
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.lease import drop as drop_lease
from trainwarden.supervisor.store.lease import write_lease
from trainwarden.supervisor.store.rundir import RunFiles, acquire_lock, write_atomic

log = logging.getLogger("trainwarden.daemon")

BACKGROUND_GRACE_S = 10.0
"""How long a stopping daemon waits for its background file work (mirror prune and such)."""

DUMP_REQUEST_TIMEOUT_S = 10.0
"""How long an operator's `dump` may take where [restart] dump_timeout_s = 0 (no hang dumps)."""
REAP_INTERVAL_S = 1.0
DISK_RETRY_S = 1.0
"""How often the daemon tries again to write what a full disk refused."""
CONFIG_CHECK_S = 2.0
"""How often the config file is compared with what the daemon read (a stat; the state topic
is pushed when the answer changes)."""

if TYPE_CHECKING:
    from trainwarden.supervisor.core.records import PersistedState
    from trainwarden.supervisor.serve.metrics import MetricsServer


class Daemon:
    def __init__(self, cfg: Config, notifier: Any = None) -> None:
        self.cfg = cfg
        # Right after load_config read it: what this daemon runs, to tell an edit by.
        self.config = ConfigWatch(cfg.path, cfg.run_dir, time.time())
        self.files = RunFiles(cfg.run_dir)
        self.slurm_job = slurm_job.job_from_env(os.environ, socket.gethostname())
        """The Slurm job this daemon runs in (None: none)."""
        self.rules = dataclasses.replace(
            rules_from(cfg),
            exit_when_ended=self.slurm_job is not None and cfg.slurm.exit_when_ended,
        )
        self.fmt = plugin_registry.checkpoint_format(
            cfg.checkpoints.format, dict(cfg.checkpoints.options)
        )
        self.store = CheckpointStore(cfg.checkpoint_dir, self.fmt)
        self.fixed = fixed_file(cfg, self.store)
        """An in-place trainer's fixed file, snapshotted (see shell.snapshots)."""
        self.snapshots: Snapshots | None = None
        # Resolved once, here: a link that changes target later is reported, not followed.
        self.watched = watched_paths(cfg, self.store)
        self.cfg = cfg = with_resolved_log(cfg, self.watched)
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.ticks = Ticks(self.queue.put_nowait)
        self.state = core.State()
        self.persisted: PersistedState | None = None
        self.journal: Journal | None = None
        self.lock_fd: int | None = None
        self.notifier = notifier
        self.hub: TelemetryHub | None = None
        self.executor: Executor | None = None
        self.reports: CheckpointReports | None = None
        self.server: Any = None
        self.request_ids = iter(range(1, 1 << 62))
        self.started_t = time.time()
        self.ready_sent = False
        self.metrics: MetricsServer | None = None
        self.watcher: CheckpointWatcher | None = None
        self.cgroups: StartCgroups | None = None
        self.space = DiskSpace()
        """The daemon's files the disk had no space for (status `disk_full`)."""
        self.alerter: Alerter | None = None
        self.gpu_events: GpuEventWatcher | None = None
        self._gpu_events_task: asyncio.Task[None] | None = None
        self.slurm: JobWatch | None = None
        """The Slurm job this daemon runs in (None: none), once the journal is read."""
        self.job_signal = JobSignal(self.slurm_job is not None)
        """[slurm] signal: the job's pre-timeout signal, or one ignored outside a job."""

    @property
    def exit_code(self) -> int | None:
        return self.executor.exit_code if self.executor is not None else None

    # ------------------------------------------------------------------ life cycle

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        # Caught from here on: the job's pre-timeout signal may come while the start still
        # asks Slurm or scans the checkpoints, and outside a job a stray one (USR1 by
        # default) would end the daemon by its default action.
        job_signal = slurm_signal(self.cfg.slurm.signal) or signal.SIGUSR1
        loop.add_signal_handler(job_signal, self.job_signal.caught, job_signal)
        # The command held them until now (cli.commands.cmd_daemon): one that came is
        # taken by the handler; USR1, when another signal is the job's, goes back to its
        # default action. Before any child is started, which would inherit the mask.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {job_signal, signal.SIGUSR1})
        try:
            return await self._run_holding(loop)
        finally:
            loop.remove_signal_handler(job_signal)
            self.job_signal.close()

    async def _run_holding(self, loop: asyncio.AbstractEventLoop) -> int:
        """The run, with this daemon's lease and lock on it; the job's requeue last."""
        me = await take_run(self.files, self.slurm_job, self.started_t)
        self.lock_fd = acquire_lock(self.files)
        try:
            unwritten = write_lease(self.files, me)
            if unwritten is not None:
                # A full disk is said once, by the journal's own warning.
                log.log(
                    logging.INFO if no_space(unwritten) else logging.WARNING,
                    "cannot write the run's lease (%s): daemons on other machines cannot"
                    " see this one",
                    unwritten.strerror or unwritten,
                )
            lease_kept = loop.create_task(keep_lease(self.files, me))
            try:
                await self._run(loop)
            finally:
                lease_kept.cancel()
                drop_lease(self.files, me)
                # Only now: a SIGTERM while the daemon closes (Slurm's, right after a
                # requeue) must not cut its last records short with the default action.
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
                if self.slurm is not None:
                    self.slurm.close()
        finally:
            os.close(self.lock_fd)
        requeue = self.executor.requeue if self.executor is not None else None
        if requeue is not None and requeue.scontrol and self.slurm_job is not None:
            await requeue_last(self.files, self.space, self.slurm_job.job_id, self.exit_code)
        return self.exit_code or 0

    async def _run(self, loop: asyncio.AbstractEventLoop) -> int:
        self._write_pid_file()
        restored, clean, spawned_seg, refused, segments = last_state_record(
            self.files.journal, self.store.quarantine_notes
        )
        journal = self._open_journal(loop, clean)
        slurm_read = None
        if self.slurm_job is not None:
            segment = slurm_job.next_segment(
                segments.n, segments.lost_s, segments.last_t, self.started_t
            )
            self.slurm = JobWatch(self.slurm_job, segment, self.cfg.slurm, self.queue.put_nowait)
            self.job_signal.watch = self.slurm
            # Started now: scontrol answers while the rest of the start-up goes on.
            slurm_read = loop.create_task(
                self.slurm.read_limit(journal, lambda: self._publish_state())
            )
        self.cgroups = contain(self.cfg.run_dir, journal)
        # Decided but not journaled: this is the state the journal already holds.
        event = core.Restored(time.monotonic(), restored, frozenset(self.cfg.checkpoints.pinned))
        self.state, _ = core.decide(self.state, event, self.rules)
        self.persisted = core.persisted(self.state)
        hub, executor = self._assemble(loop, journal, spawned_seg)
        scanned = await self._settle_files(journal, hub)
        watcher = await self._start_inputs(loop, hub, executor)
        self.queue.put_nowait(
            core.Startup(
                time.monotonic(),
                last_logged_step=hub.runs.history.last_step,
                unclean=not clean,
                scanned=scanned,
                diverged=hub.caught_up_divergence,
                refused=tuple(
                    (name, note["reason"], note["cause"], note.get("cause_step"))
                    for name, note in refused.items()
                ),
            )
        )
        self.job_signal.started()
        # What start-up built (modules, config, plugins, the loss history's index) lives
        # as long as the daemon: out of the collector's sight, a full collection scans
        # only what came since, and no longer holds a step decision off for tens of ms.
        gc.collect()
        gc.freeze()
        chores = [
            loop.create_task(chore)
            for chore in (
                watchdog_pings(self.notifier),
                report_moved_links(self.watched, journal),
                reap_adopted(executor.starts.live_pids, REAP_INTERVAL_S),
                self._retry_writes(),
                config_watch.watch(
                    self.config,
                    journal,
                    CONFIG_CHECK_S,
                    lambda: hub.publish_state(self.state_view()),
                ),
            )
        ]
        if slurm_read is not None:
            chores.append(slurm_read)
        try:
            await self._event_loop()
        finally:
            for task in chores:
                task.cancel()
            await self._close(loop, journal, hub, executor, watcher)
        return self.exit_code or 0

    def _open_journal(self, loop: asyncio.AbstractEventLoop, clean: bool) -> Journal:
        """The journal, its alerts, and this daemon's first records."""
        journal = self.journal = self.job_signal.journal = Journal(self.files.journal, self.space)
        if self.cfg.alerts.urls or self.cfg.alerts.command:
            # Installed first: the start's own records (an unclean exit's) are alerted too.
            self.alerter = Alerter(
                self.cfg, journal, loop, lambda: self.hub.last_step if self.hub else None
            )
        journal.append(
            {
                "kind": "daemon_start",
                "pid": os.getpid(),
                "version": __version__,
                "previous_exit_clean": clean,
            },
        )
        journal_links(journal, self.watched)
        return journal

    def _publish_state(self) -> None:
        if self.hub is not None:
            self.hub.publish_state(self.state_view())

    def _assemble(
        self, loop: asyncio.AbstractEventLoop, journal: Journal, spawned_seg: int
    ) -> tuple[TelemetryHub, Executor]:
        """The hub (following the log from where the last daemon left it), the commit
        reports and the executor, wired to this daemon's queue."""
        hub = self.hub = TelemetryHub(
            self.cfg,
            self.files,
            journal,
            loop,
            self._on_step,
            lambda: self.state.trainer_pid,
            on_no_match=self._on_parser_no_match,
            phase=lambda: self.state.phase,
        )
        journal.fold_repeats(quiet=lambda: hub.start_steps == 0)
        reports = self.reports = CheckpointReports(self.store, hub, self.queue.put_nowait)
        executor = self.executor = Executor(
            self.cfg,
            self.files,
            self.store,
            journal,
            hub,
            report=self.queue.put_nowait,
            trainer_pid=lambda: self.state.trainer_pid,
            forget_commit=reports.forget,
            on_trainer_exit=self._trainer_exited,
        )
        executor.starts.cgroups = self.cgroups
        if self.fixed is not None:
            snapshots = self.snapshots = Snapshots(self.fixed, self.store, journal)
            executor.starts.snapshots = snapshots
            hub.snapshot_failing = lambda: snapshots.failing
        hub.load_history(seg=spawned_seg)
        hub.start_follower()
        return hub, executor

    async def _settle_files(self, journal: Journal, hub: TelemetryHub) -> tuple[core.Scanned, ...]:
        """Before the first decision: what an earlier daemon left running is stopped, the
        checkpoint folder's leftovers cleared and its commits scanned (returned)."""
        assert self.reports is not None
        stopped = await stop_leftovers(
            self.files.trainer_pid,
            str(self.cfg.run_dir),
            self.cgroups,
            self.cfg.trainer.stop_timeout_s,
            journal,
        )
        if stopped:
            await hub.drain_log()  # their last lines, before the first start's
        # No start runs yet: lines the log gains until the first one are nobody's.
        hub.end_segment()
        with contextlib.suppress(FileNotFoundError):
            self.files.trainer_pid.unlink()
        self.store.ensure()
        stale = self.store.remove_stale_in_flight()
        if stale:
            journal.append({"kind": "stale_tmp_removed", "names": stale})
        if self.snapshots is not None:
            # What the trainer last wrote there, before the scan: resumed from if it verifies.
            await self.snapshots.boot()
        return await self.reports.scan()

    async def _start_inputs(
        self, loop: asyncio.AbstractEventLoop, hub: TelemetryHub, executor: Executor
    ) -> CheckpointWatcher:
        """The checkpoint watcher, signals, the control socket, samplers, GPU events, the
        mirror and /metrics: from here on events come in."""
        assert self.reports is not None and self.journal is not None
        reports = self.reports
        watcher = self.watcher = CheckpointWatcher(
            self.store,
            loop,
            on_committed=reports.committed,
            on_writing=self._on_writing,
            on_touched=reports.touched,
            on_verified=reports.verified,
            on_unrecognised=hub.checkpoints.unrecognised_name,
            on_resolved=hub.checkpoints.resolved,
            fixed=self.cfg.checkpoints.fixed,
            on_fixed=self.snapshots.written if self.snapshots is not None else None,
            fixed_commit_file=self.cfg.checkpoints.fixed_commit_file,
        )
        watcher.start()
        executor.starts.settle_commits = watcher.settle
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        from trainwarden.supervisor.serve.control import ControlServer

        self.server = ControlServer(self)
        await self.server.start()
        hub.sinks.append(self.server.publish)
        hub.listening = self.server.listening
        hub.start_samplers()
        self.gpu_events, self._gpu_events_task = watch_gpus(
            loop, self.queue.put_nowait, self.journal
        )
        self._start_mirror()
        self.metrics = start_metrics(self.cfg, self.journal, self.metrics_snapshot, loop)
        return watcher

    async def _close(
        self,
        loop: asyncio.AbstractEventLoop,
        journal: Journal,
        hub: TelemetryHub,
        executor: Executor,
        watcher: CheckpointWatcher,
    ) -> None:
        """Everything started, ended in order; the journal's last record says the exit."""
        # The trainer's helpers and orphaned workers end with the start, before the daemon.
        await executor.starts.finish_containment()
        await executor.starts.end_spare()
        if self.notifier is not None and not self.state.shutdown:
            self.notifier.stopping()
        watcher.stop()
        if self._gpu_events_task is not None:
            self._gpu_events_task.cancel()
        if self.gpu_events is not None:
            await asyncio.to_thread(self.gpu_events.stop)
        close_format = getattr(self.fmt, "close", None)
        if close_format is not None:
            close_format()  # a format's verifier process (torch-pt) ends with the daemon
        if executor.mirror is not None:
            executor.mirror.close()  # interrupts a copy in progress; latest.json stays
        # A prune decided before the stop still runs (a slow mirror cannot hold us long).
        await executor.settle_background(BACKGROUND_GRACE_S)
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)
        await self.server.close()
        hub.close()
        with contextlib.suppress(FileNotFoundError):
            self.files.trainer_pid.unlink()
        if self.alerter is not None:
            await asyncio.to_thread(self.alerter.drain)
            self.alerter.close(grace=0.0)  # drained: journals on the loop, as all do
        if executor.requeue is not None:
            # Written before Slurm is asked: once it takes the requeue it kills the job's
            # processes at once. The next segment's restart_count says it happened.
            by = "scontrol" if executor.requeue.scontrol else "the batch script"
            job_id = self.slurm_job.job_id if self.slurm_job is not None else None
            journal.append({"kind": "slurm_requeue", "job_id": job_id, "by": by})
        journal.append({"kind": "daemon_exit", "code": self.exit_code})
        journal.close()
        with contextlib.suppress(FileNotFoundError):
            self.files.daemon_pid.unlink()

    def _write_pid_file(self) -> None:
        path = self.files.daemon_pid
        try:
            write_atomic(path, f"{os.getpid()}\n".encode(), mode=0o644)
        except OSError as exc:
            if not no_space(exc):
                raise
            self.space.filled(path, exc, "the journal and loss history are held in memory")
        else:
            self.space.emptied(path, "the pid file")

    async def _retry_writes(self) -> None:
        """While the disk is full, write what was held every DISK_RETRY_S (each new record
        tries too): the journal first, so the loss history's recovery record follows it."""
        assert self.journal is not None and self.hub is not None
        while True:
            await asyncio.sleep(DISK_RETRY_S)
            if not self.space.full:
                continue
            if str(self.files.daemon_pid) in self.space.full_files:
                self._write_pid_file()
            self.journal.retry()
            self.hub.retry_writes()
            if self.executor is not None:
                await self.executor.starts.save_identity()

    async def _event_loop(self) -> None:
        assert self.executor is not None
        outcomes = self.executor.starts.outcomes
        while self.exit_code is None:
            if outcomes:
                # A start's outcome is decided before any request queued while the start
                # was being made: a shutdown decided without the new trainer's pid would
                # exit and leave that trainer running. (Taken here, not nested in the
                # decision that asked for the start: a start that fails at once, backoff 0,
                # asks for the next one, as many times as the restart budget allows.)
                event = outcomes.popleft()
            elif self.queue.empty():
                self.ticks.arm(core.deadline(self.state, self.rules))
                event = await self.queue.get()
            else:
                event = self.queue.get_nowait()
            await self.handle(event)

    async def handle(self, event: core.Event) -> None:
        before = self.state
        actions = self._decide(event)
        await self._carry_out(before, actions)

    def _decide(self, event: core.Event) -> list[core.Action]:
        """The policy's decision on one event, its state journaled; the actions to run."""
        assert self.journal is not None
        before = self.state
        self.state, actions = core.decide(self.state, event, self.rules)
        now_persisted = core.persisted(self.state)
        if now_persisted != self.persisted:
            # A pivot's stage must survive a power cut before the stage's effects start.
            was = self.persisted.get("pivot") if self.persisted is not None else None
            pivot_moved = now_persisted.get("pivot") != was
            self.persisted = now_persisted
            self.journal.append({"kind": "state", "state": now_persisted}, sync=pivot_moved)
        if self.state.shutdown and not before.shutdown and self.notifier is not None:
            self.notifier.stopping(f"stopping: {self.state.phase}")
        return actions

    async def _carry_out(self, before: core.State, actions: list[core.Action]) -> None:
        assert self.executor is not None
        for action in actions:
            await self.executor.execute(action)
        if self.state.phase in core.HALTED or self.state.shutdown:
            self.executor.starts.drop_spare()
        self._announce(before)

    def _announce(self, before: core.State) -> None:
        """Tell subscribers (and systemd) what changed since `before`."""
        assert self.hub is not None
        if self.state.phase != before.phase or self.state.trainer_pid != before.trainer_pid:
            self.hub.publish_state(self.state_view())
            self._notify_status()
        if before.checkpoints != self.state.checkpoints or before.pinned != self.state.pinned:
            self.hub.publish("checkpoints", self.checkpoints_view())

    # ------------------------------------------------------------------ inputs from others

    def _on_writing(self) -> None:
        self.queue.put_nowait(core.CheckpointWriting(time.monotonic()))

    def _on_parser_no_match(self, notice: dict[str, Any]) -> None:
        self.queue.put_nowait(
            core.ParserNoMatch(time.monotonic(), notice["seg"], notice["parser"], notice["sample"])
        )

    def _on_signal(self, sig: int) -> None:
        self.queue.put_nowait(core.ShutdownRequested(time.monotonic(), signal.Signals(sig).name))

    def _on_step(self, step: int, loss: float, grad_norm: float | None = None) -> None:
        """A step line, queued as every event is: the one path from a line to `decide`.
        (Lines a new trainer prints before its spawn returns are decided after the spawn's
        outcome, which the loop takes before its queue.)"""
        self.queue.put_nowait(core.StepLogged(time.monotonic(), step, loss, grad_norm))

    def _trainer_exited(self) -> None:
        if not self.ready_sent:
            self._send_ready()

    # ------------------------------------------------------------------ the control server

    async def operator(
        self,
        command: core.Command,
        uid: int | None,
        progress: Callable[[str], None] | None = None,
    ) -> core.Reply:
        """Queue an operator command and wait for the policy's reply; `progress` gets the
        policy's progress lines meanwhile. Cancelled (its client gone): the policy is told,
        so that nothing waits on the reply any more. A start's or stop's reply, refusals
        included, also says when the config file changed since the daemon read it."""
        assert self.executor is not None
        context = None
        if isinstance(command, core.Pivot):
            context = await asyncio.to_thread(pivot_context, self.files, command)
        handles = None
        pid = self.state.trainer_pid
        if pid is not None and isinstance(
            command, core.Save | core.Stop | core.Shutdown | core.Pivot
        ):
            # Right before deciding: a trainer installs its handlers once, early.
            target = self.cfg.trainer.signal_target
            handles = await asyncio.to_thread(signals.handled, pid, target)
        if self.watcher is not None:
            self.watcher.drain()  # commits made before the request are decided with it
        request_id = next(self.request_ids)
        future: asyncio.Future[core.Reply] = asyncio.get_running_loop().create_future()
        self.executor.replies[request_id] = future
        if progress is not None:
            self.executor.progress[request_id] = progress
        self.queue.put_nowait(
            core.Operator(
                time.monotonic(), request_id, command, uid, pivot=context, handles=handles
            )
        )
        try:
            reply = await future
        except asyncio.CancelledError:
            # Cancelling this call cancels the future too; a reply given pops it.
            if request_id in self.executor.replies:
                self.queue.put_nowait(core.RequestAbandoned(time.monotonic(), request_id))
            raise
        finally:
            self.executor.replies.pop(request_id, None)
            self.executor.progress.pop(request_id, None)
        notice = self.config.notice() if isinstance(command, core.Start | core.Stop) else None
        if notice is None:
            return reply
        # A start or stop is when the operator expects the file's settings to apply.
        if not reply.ok:
            return dataclasses.replace(reply, message=f"{reply.message}; {notice}")
        return dataclasses.replace(reply, result={**(reply.result or {}), "config_notice": notice})

    def add_journal_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        assert self.journal is not None
        self.journal.listeners.append(listener)

    async def history_query(self, start: int | None, end: int | None, points: int) -> HistoryResult:
        assert self.hub is not None
        return await self.hub.history_query(start, end, points)

    async def history_of_query(
        self, run: str, start: int | None, end: int | None, points: int, peer: int | None = None
    ) -> HistoryOfResult:
        assert self.hub is not None
        return await self.hub.runs.query_other(run, start, end, points, peer)

    async def related_runs(self) -> list[RelatedRun]:
        assert self.hub is not None
        return await self.hub.runs.related_runs()

    async def dump_stacks(self) -> DumpResult | None:
        pid = self.state.trainer_pid
        if pid is None or self.journal is None:
            return None
        timeout_s = self.cfg.restart.dump_timeout_s or DUMP_REQUEST_TIMEOUT_S
        return await dump_stacks(
            self.cfg, self.files, self.journal, pid, self.state.last_step, timeout_s, "request"
        )

    def snapshot(self, topic: str) -> Any:
        assert self.hub is not None
        return self.hub.snapshot(topic)

    # ------------------------------------------------------------------ mirror, metrics

    def _start_mirror(self) -> None:
        assert self.executor is not None
        if self.cfg.mirror.path is None:
            return
        from trainwarden.supervisor.store.mirror import Mirror

        self.executor.mirror = Mirror(
            Path(self.cfg.mirror.path).expanduser(),
            run_dir=self.cfg.run_dir,
            format_name=self.cfg.checkpoints.format,
            checkpoint_dir=self.cfg.checkpoints.dir,
        )

    def metrics_snapshot(self) -> dict[str, Any]:
        """The figures /metrics exports; runs on the event loop (see serve.metrics)."""
        assert self.hub is not None
        return {
            "run": self.cfg.run.name,
            **self.state_view(),
            **self.hub.telemetry(),
            "gpu": self.hub.latest.get("gpu"),
            "val": self.hub.validation.status(time.time()),
        }

    # ------------------------------------------------------------------ views, systemd

    def _send_ready(self) -> None:
        self.ready_sent = True
        if self.notifier is not None:
            self.notifier.ready()
            self._notify_status()

    def _notify_status(self) -> None:
        if self.notifier is None:
            return
        step = self.hub.last_step if self.hub else None
        self.notifier.status(f"{self.state.phase}, step {step if step is not None else '-'}")
        if not self.ready_sent and (self.state.trainer_alive or self.state.phase in core.HALTED):
            self._send_ready()

    def state_view(self) -> StateView:
        slurm = self.slurm.view(time.time()) if self.slurm is not None else None
        return views.state_view(self.state, time.monotonic(), self.config, slurm)

    def checkpoints_view(self) -> CheckpointsView:
        return views.checkpoints_view(self.state, self.rules, self.store)

    def status_view(self) -> StatusResult:
        assert self.hub is not None
        pid = self.state.trainer_pid
        # A file read per status: cheap, and a trainer's handlers may come after its start.
        handles = signals.handled(pid, self.cfg.trainer.signal_target) if pid else None
        return views.status_view(
            self.cfg, self.started_t, self.state_view(), self.checkpoints_view(), self.hub, handles
        )
