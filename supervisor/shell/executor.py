"""The executor: does exactly what each of the policy's actions says, and reports what
came of it (a spawned trainer, its exit, a pivot stage's file work, a mirror copy) back
to the daemon's queue as events. It decides nothing. A start, from its spawn to its
leftovers stopped, is `starts`'s."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core import policy as core
from trainwarden.supervisor.inputs.gpu import shared_nvml
from trainwarden.supervisor.shell import gpu_recovery, pivot_files
from trainwarden.supervisor.shell.hangdump import dump_stacks
from trainwarden.supervisor.shell.hub import TelemetryHub
from trainwarden.supervisor.shell.process import (
    send_signal,
)
from trainwarden.supervisor.shell.starts import Starts
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.mirror import Mirror
from trainwarden.supervisor.store.quarantine import note_of
from trainwarden.supervisor.store.rundir import RunFiles

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import FileOpFailure
    from trainwarden.supervisor.core.records import Quarantine as QuarantineRecord

log = logging.getLogger("trainwarden.daemon")

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGUSR1": signal.SIGUSR1, "SIGKILL": signal.SIGKILL}


class Executor:
    def __init__(
        self,
        cfg: Config,
        files: RunFiles,
        store: CheckpointStore,
        journal: Journal,
        hub: TelemetryHub,
        report: Callable[[core.Event], None],
        trainer_pid: Callable[[], int | None],
        forget_commit: Callable[[str], None],
        on_trainer_exit: Callable[[], None],
    ) -> None:
        self.cfg = cfg
        self.files = files
        self.store = store
        self.journal = journal
        self.hub = hub
        self.report = report
        """Queue an event for the policy."""
        self.trainer_pid = trainer_pid
        self.forget_commit = forget_commit
        """Drop a name from the registry of commits once its files are gone from the directory."""
        self.on_trainer_exit = on_trainer_exit
        self.replies: dict[int, asyncio.Future[core.Reply]] = {}
        self.progress: dict[int, Callable[[str], None]] = {}
        """Where a request still in progress has its progress lines sent (its client)."""
        self.exit_code: int | None = None
        self.mirror: Mirror | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.starts = Starts(cfg, files, store, journal, hub, report, on_trainer_exit)
        """The trainer's starts: each made, awaited and contained (see shell.starts)."""
        self.requeue: core.Requeue | None = None
        """The job's requeue the policy asked for, done once the daemon has closed."""

    async def execute(self, action: core.Action) -> None:
        journal = self.journal
        if isinstance(action, core.Record):
            journal.append(action.entry)
        elif isinstance(action, core.Spawn):
            await self.starts.spawn(action)
        elif isinstance(action, core.SignalTrainer):
            proc = self.starts.proc
            pid = self.trainer_pid() or (proc.pid if proc else None)
            journal.append(
                {"kind": "signal", "signal": action.signal, "pid": pid, "reason": action.reason}
            )
            self.hub.cadence.signalled(action.signal)
            if pid is not None:
                send_signal(pid, SIGNALS[action.signal], self.cfg.trainer.signal_target)
        elif isinstance(action, core.DumpStacks):
            self.in_background(self._dump_stacks(action))
        elif isinstance(action, core.Delete):
            journal.append(
                {
                    "kind": "delete",
                    "step": action.step,
                    "name": action.name,
                    "reason": action.reason,
                }
            )
            await self._file_op(self.store.delete, action.name, "delete_failed")
            self.forget_commit(action.name)
        elif isinstance(action, core.Quarantine):
            quarantine: QuarantineRecord = {
                "kind": "quarantine",
                "step": action.step,
                "name": action.name,
                "reason": action.reason,
                "cause": action.cause,
                "cause_step": action.cause_step,
            }
            journal.append(quarantine)
            self.store.quarantine_notes[action.name] = note_of(quarantine)
            await self._file_op(self.store.quarantine, action.name, "quarantine_failed")
            self.forget_commit(action.name)
            if action.retract_mirror and self.mirror is not None and action.step is not None:
                self.in_background(self._retract(self.mirror, action.step))
        elif isinstance(action, core.Reply):
            future = self.replies.pop(action.request_id, None)
            if future is not None and not future.done():
                future.set_result(action)
        elif isinstance(action, core.Progress):
            tell = self.progress.get(action.request_id)
            if tell is not None:
                tell(action.message)
        elif isinstance(action, core.Exit):
            self.exit_code = action.code
        elif isinstance(action, core.Requeue):
            # The daemon's very last act (Daemon.requeue_last): Slurm kills the job's
            # processes milliseconds after it takes a requeue.
            self.requeue = action
        elif isinstance(action, core.Archive):
            error = await asyncio.to_thread(
                pivot_files.archive, self.files, self.cfg.run_dir, action
            )
            self.report(core.PivotProgress(time.monotonic(), "archived", error))
        elif isinstance(action, core.WritePolicy):
            error = await asyncio.to_thread(pivot_files.write_policy, self.files, action.policy)
            self.report(core.PivotProgress(time.monotonic(), "policy_written", error))
        elif isinstance(action, core.ReadMirrorPointer | core.MirrorCopy | core.PruneMirror):
            self.in_background(self._mirror_work(action))
        elif isinstance(action, core.AwaitGpuIdle):
            self.in_background(self._await_gpu_idle(action))
        elif isinstance(action, core.ResetGpu):
            self.in_background(self._reset_gpu(action))

    async def _await_gpu_idle(self, action: core.AwaitGpuIdle) -> None:
        holders, waited = await asyncio.to_thread(
            gpu_recovery.wait_until_free, shared_nvml(), action.gpu, action.timeout_s
        )
        self.report(core.GpuIdle(time.monotonic(), action.gpu, holders, waited))

    async def _reset_gpu(self, action: core.ResetGpu) -> None:
        self.journal.append({"kind": "gpu_resetting", "gpu": action.gpu})
        error = await asyncio.to_thread(gpu_recovery.reset_gpu, action.gpu)
        self.report(core.GpuResetDone(time.monotonic(), action.gpu, error is None, error))

    def in_background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle_background(self, timeout_s: float) -> None:
        """Let background work in flight (a mirror prune, a retraction, a copy being
        interrupted) end before the daemon does, for at most `timeout_s`."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)

    async def _file_op(
        self,
        operation: Any,
        name: str,
        failure_kind: Literal["delete_failed", "quarantine_failed"],
    ) -> None:
        """Move or delete checkpoint files; a failure is journaled, never fatal to the loop."""
        try:
            await asyncio.to_thread(operation, name)
        except (OSError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
            failure: FileOpFailure = {"name": name, "error": reason}
            if failure_kind == "delete_failed":
                self.journal.append({"kind": "delete_failed", **failure})
            else:
                self.journal.append({"kind": "quarantine_failed", **failure})
            log.error("%s %s: %s", failure_kind, name, reason)

    # ------------------------------------------------------------------ stacks

    async def _dump_stacks(self, action: core.DumpStacks) -> None:
        """The hung trainer's stacks, then the report that lets the policy stop it (the
        policy stops it at its own deadline if this report is late)."""
        try:
            await dump_stacks(
                self.cfg,
                self.files,
                self.journal,
                action.pid,
                action.step,
                action.timeout_s,
                "hang",
            )
        except Exception as exc:  # never fatal to the loop, never holding up the stop
            self.journal.append(
                {"kind": "hang_dump", "path": None, "top_frames": [], "error": repr(exc)}
            )
            log.exception("could not dump the trainer's stacks")
        self.report(core.StacksDumped(time.monotonic(), action.pid))

    # ------------------------------------------------------------------ the mirror

    async def _mirror_work(
        self, action: core.ReadMirrorPointer | core.MirrorCopy | core.PruneMirror
    ) -> None:
        mirror = self.mirror
        if mirror is None:  # the run has no [mirror] path
            return
        if isinstance(action, core.ReadMirrorPointer):
            # In a thread: the mirror may be a slow or hung network disk.
            step = await asyncio.to_thread(mirror.newest_step)
            self.report(core.MirrorPointer(time.monotonic(), step))
        elif isinstance(action, core.MirrorCopy):
            await self._copy(mirror, action.ckpt)
        else:
            await mirror.prune(action.steps)

    async def _copy(self, mirror: Mirror, ckpt: core.Ckpt) -> None:
        path = self.store.dir / ckpt.name
        companions = [p for p in self.store.fmt.companions(path) if p.parent == self.store.dir]
        files: list[Path] = [path, *(p for p in companions if p.exists())]
        result = await mirror.copy(ckpt.step, files, ckpt.name, digest=ckpt.digest)
        self.report(
            core.MirrorCopied(
                time.monotonic(),
                result.step,
                result.ok,
                seconds=round(result.seconds, 3),
                files=len(result.files),
                bytes=result.bytes,
                error=result.error or "",
                superseded_by=result.superseded_by,
                mirrored=result.mirrored,
                changed=result.changed,
                name=ckpt.name,
            )
        )

    async def _retract(self, mirror: Mirror, step: int) -> None:
        if step not in await asyncio.to_thread(mirror.steps):
            return
        latest = await mirror.retract(step)
        self.journal.append({"kind": "mirror_retracted", "step": step, "latest": latest})
