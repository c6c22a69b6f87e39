"""The daemon: one asyncio loop that owns the state, feeds events to the policy and
carries out the actions it returns (the imperative shell around supervisor.policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from trainwarden.supervisor import PROTOCOL_VERSION, __version__
from trainwarden.supervisor import registry as plugin_registry
from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core import policy
from trainwarden.supervisor.inputs.checkpoint_watch import CheckpointWatcher
from trainwarden.supervisor.serve.notify import NOTIFY_ENV_KEYS
from trainwarden.supervisor.shell.hub import TelemetryHub
from trainwarden.supervisor.shell.process import TrainerIdentity, send_signal, spawn, stop_leftover
from trainwarden.supervisor.store.checkpoints import CheckpointStore, Verdict
from trainwarden.supervisor.store.journal import Journal, read_records
from trainwarden.supervisor.store.rundir import RunFiles, acquire_lock, fsync_dir, write_atomic

if TYPE_CHECKING:
    from trainwarden.supervisor.serve.metrics import MetricsServer
    from trainwarden.supervisor.store.mirror import Mirror

log = logging.getLogger("trainwarden.daemon")

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGUSR1": signal.SIGUSR1, "SIGKILL": signal.SIGKILL}


class _Decided(NamedTuple):
    """A decision already made (and its state journaled) whose actions are still to run."""

    before: policy.State
    actions: list[Any]


class _Failed(NamedTuple):
    """A decision made on the follower's callback that raised: raised again in the task."""

    error: Exception


def archive_dir(run_dir: Path, relative: str) -> Path:
    """A pivot archive folder, refusing any name that would leave run_dir/archive."""
    if (run_dir / "archive").is_symlink():
        raise OSError(0, f"refusing archive path {relative!r}: {run_dir / 'archive'} is a link")
    base = run_dir.resolve() / "archive"
    target = (run_dir / relative).resolve()
    if target.parent != base or not target.name.startswith("pivot-"):
        raise OSError(0, f"refusing archive path {relative!r} outside {base}")
    return target


def rules_from(cfg: Config) -> policy.Rules:
    return policy.Rules(
        keep_last=cfg.checkpoints.keep_last,
        backoff_initial_s=cfg.restart.backoff_initial_s,
        backoff_max_s=cfg.restart.backoff_max_s,
        max_restarts_without_progress=cfg.restart.max_restarts_without_progress,
        stall_timeout_s=cfg.restart.stall_timeout_s,
        stop_timeout_s=cfg.trainer.stop_timeout_s,
        max_loss=cfg.telemetry.max_loss,
        divergence_retries=cfg.restart.divergence_retries,
    )


def last_state_record(journal_path: Path) -> tuple[dict[str, Any] | None, bool]:
    """(the newest persisted state, whether the previous daemon exited cleanly)."""
    state = None
    last_kind = None
    for record in read_records(journal_path):
        last_kind = record.get("kind")
        if last_kind == "state":
            state = record.get("state")
    clean = last_kind in (None, "daemon_exit")
    return state, clean


class Daemon:
    def __init__(self, cfg: Config, notifier: Any = None) -> None:
        self.cfg = cfg
        self.files = RunFiles(cfg.run_dir)
        self.rules = rules_from(cfg)
        self.fmt = plugin_registry.checkpoint_format(
            cfg.checkpoints.format, dict(cfg.checkpoints.options)
        )
        self.store = CheckpointStore(cfg.checkpoint_dir, self.fmt)
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self._tick_handle: asyncio.TimerHandle | None = None
        self._idle = False
        """The event loop's task is waiting for an event and none is queued."""
        self.state = policy.State()
        self.persisted: dict[str, Any] | None = None
        self.exit_code: int | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.journal: Journal | None = None
        self.lock_fd: int | None = None
        self.notifier = notifier
        self.hub: TelemetryHub | None = None
        self.server: Any = None
        self.replies: dict[int, asyncio.Future[policy.Reply]] = {}
        self.request_ids = iter(range(1, 1 << 62))
        self.started_t = time.time()
        self.known_commits: dict[str, float] = {}
        self.ready_sent = False
        self.mirror: Mirror | None = None
        self.metrics: MetricsServer | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # Test-only fault injection: SIGKILL this daemon right after a pivot stage is
        # journaled, before its effects, to prove a restarted daemon finishes or undoes it.
        self._die_at_stage = os.environ.get("TRAINWARDEN_TEST_DIE_AT_PIVOT_STAGE")

    # ------------------------------------------------------------------ life cycle

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.lock_fd = acquire_lock(self.files)
        try:
            return await self._run(loop)
        finally:
            os.close(self.lock_fd)

    async def _run(self, loop: asyncio.AbstractEventLoop) -> int:
        write_atomic(self.files.daemon_pid, f"{os.getpid()}\n".encode(), mode=0o644)
        restored, clean = last_state_record(self.files.journal)
        self.journal = Journal(self.files.journal)
        self.journal.append(
            "daemon_start",
            {"pid": os.getpid(), "version": __version__, "previous_exit_clean": clean},
        )
        self.state = policy.restore(restored or {}, self.rules)
        self.state = replace(
            self.state, pinned=self.state.pinned | frozenset(self.cfg.checkpoints.pinned)
        )
        self.persisted = policy.persisted(self.state)

        self.hub = TelemetryHub(
            self.cfg, self.files, self.journal, loop, self._on_step, lambda: self.state.trainer_pid
        )
        self.hub.load_history(seg=self.state.seg)
        self.hub.start_follower()

        leftover = TrainerIdentity.load(self.files.trainer_pid)
        if leftover is not None and leftover.alive():
            self.journal.append("leftover_trainer", {"pid": leftover.pid, "action": "stopping"})
            await asyncio.to_thread(stop_leftover, leftover, self.cfg.trainer.stop_timeout_s)
            self.journal.append("leftover_trainer_stopped", {"pid": leftover.pid})
            await self.hub.drain_log()
        with contextlib.suppress(FileNotFoundError):
            self.files.trainer_pid.unlink()

        self.store.ensure()
        stale = self.store.remove_stale_in_flight()
        if stale:
            self.journal.append("stale_tmp_removed", {"names": stale})
        await self._scan_checkpoints()

        watcher = CheckpointWatcher(
            self.store, loop, on_committed=self._on_committed_name, on_writing=self._on_writing
        )
        watcher.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        from trainwarden.supervisor.serve.control import ControlServer

        self.server = ControlServer(self)
        await self.server.start()
        self.hub.sinks.append(self.server.publish)
        self.hub.listening = self.server.listening
        self.hub.start_samplers()
        self._start_mirror()
        self._start_metrics(loop)

        self.queue.put_nowait(
            policy.Startup(
                time.monotonic(),
                last_logged_step=self.hub.history_last_step(),
                unclean=not clean,
            )
        )
        watchdog_task = loop.create_task(self._watchdog_pings())
        try:
            await self._event_loop()
        finally:
            watchdog_task.cancel()
            if self.notifier is not None and not self.state.shutdown:
                self.notifier.stopping()
            watcher.stop()
            if self.mirror is not None:
                self.mirror.close()  # interrupts a copy in progress; latest.json stays
            if self.metrics is not None:
                await asyncio.to_thread(self.metrics.close)
            await self.server.close()
            self.hub.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            with contextlib.suppress(FileNotFoundError):
                self.files.trainer_pid.unlink()
            self.journal.append("daemon_exit", {"code": self.exit_code})
            self.journal.close()
            with contextlib.suppress(FileNotFoundError):
                self.files.daemon_pid.unlink()
        return self.exit_code or 0

    async def _watchdog_pings(self) -> None:
        """WATCHDOG=1 from the event loop itself, so a wedged loop gets the unit restarted."""
        interval = getattr(self.notifier, "watchdog_interval_s", None)
        if not interval:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    async def _event_loop(self) -> None:
        while self.exit_code is None:
            if self.queue.empty():
                self._arm_tick(policy.deadline(self.state, self.rules))
                self._idle = True
                try:
                    event = await self.queue.get()
                finally:
                    self._idle = False
            else:
                event = self.queue.get_nowait()
            if isinstance(event, _Decided):
                await self._carry_out(event.before, event.actions)
            elif isinstance(event, _Failed):
                raise event.error
            else:
                await self.handle(event)

    def _arm_tick(self, due: float | None) -> None:
        """Have a Tick queued by `due` (time.monotonic()).

        One timer, moved only when the deadline comes earlier: a step line pushes the
        stall deadline later each time, and a timer left armed too early just delivers a
        Tick that finds nothing due, once per stall timeout rather than a timer
        rescheduled per line.
        """
        if due is None:
            return
        when = self._loop_time(due)
        armed = self._tick_handle
        if armed is not None:
            if armed.when() <= when:
                return
            armed.cancel()
        self._tick_handle = asyncio.get_running_loop().call_at(when, self._tick)

    def _tick(self) -> None:
        self._tick_handle = None
        self.queue.put_nowait(policy.Tick(time.monotonic()))

    def _loop_time(self, monotonic_t: float) -> float:
        """A time.monotonic() deadline in the event loop's clock."""
        loop = asyncio.get_running_loop()
        return loop.time() + (monotonic_t - time.monotonic())

    async def handle(self, event: Any) -> None:
        before = self.state
        actions = self._decide(event)
        await self._carry_out(before, actions)

    def _decide(self, event: Any) -> list[Any]:
        """The policy's decision on one event, its state journaled; the actions to run."""
        assert self.journal is not None
        before = self.state
        self.state, actions = policy.decide(self.state, event, self.rules)
        now_persisted = policy.persisted(self.state)
        if now_persisted != self.persisted:
            # A pivot's stage must survive a power cut before the stage's effects start.
            pivot_moved = now_persisted.get("pivot") != (self.persisted or {}).get("pivot")
            self.persisted = now_persisted
            self.journal.append("state", {"state": now_persisted}, sync=pivot_moved)
            if pivot_moved and self._die_at_stage is not None:
                stage = (now_persisted.get("pivot") or {}).get("stage")
                if stage == self._die_at_stage:
                    os.kill(os.getpid(), signal.SIGKILL)
        if self.state.shutdown and not before.shutdown and self.notifier is not None:
            self.notifier.stopping(f"stopping: {self.state.phase}")
        return actions

    async def _carry_out(self, before: policy.State, actions: list[Any]) -> None:
        for action in actions:
            await self.execute(action)
        self._announce(before)

    def _announce(self, before: policy.State) -> None:
        """Tell subscribers (and systemd, and the mirror) what changed since `before`."""
        assert self.hub is not None
        if self.state.phase != before.phase or self.state.trainer_pid != before.trainer_pid:
            self.hub.publish_state(self.state_view())
            self._notify_status()
        if before.checkpoints != self.state.checkpoints or before.pinned != self.state.pinned:
            self.hub.publish("checkpoints", self.checkpoints_view())
            if self.mirror is not None:
                fresh = [c for c in self.state.checkpoints if c not in before.checkpoints]
                if fresh:
                    self._mirror_soon(max(fresh, key=lambda c: c.step))

    # ------------------------------------------------------------------ executor

    async def execute(self, action: Any) -> None:
        assert self.journal is not None
        journal = self.journal
        if isinstance(action, policy.Record):
            journal.append(action.kind, action.fields)
        elif isinstance(action, policy.Spawn):
            await self._spawn(action)
        elif isinstance(action, policy.SignalTrainer):
            pid = self.state.trainer_pid or (self.proc.pid if self.proc else None)
            journal.append("signal", {"signal": action.signal, "pid": pid, "reason": action.reason})
            if pid is not None:
                send_signal(pid, SIGNALS[action.signal], self.cfg.trainer.signal_target)
        elif isinstance(action, policy.Delete):
            journal.append(
                "delete", {"step": action.step, "name": action.name, "reason": action.reason}
            )
            await self._file_op(self.store.delete, action.name, "delete_failed")
            self.known_commits.pop(action.name, None)
        elif isinstance(action, policy.Quarantine):
            journal.append(
                "quarantine", {"step": action.step, "name": action.name, "reason": action.reason}
            )
            await self._file_op(self.store.quarantine, action.name, "quarantine_failed")
            self.known_commits.pop(action.name, None)
            if self.mirror is not None and action.step is not None:
                # The mirror must never offer what was quarantined here (poisoned weights).
                self._in_background(self._retract(action.step))
        elif isinstance(action, policy.Reply):
            future = self.replies.pop(action.request_id, None)
            if future is not None and not future.done():
                future.set_result(action)
        elif isinstance(action, policy.Exit):
            self.exit_code = action.code
        elif isinstance(action, policy.Archive):
            error = await asyncio.to_thread(self._archive, action)
            self.queue.put_nowait(policy.PivotProgress(time.monotonic(), "archived", error))
        elif isinstance(action, policy.WritePolicy):
            error = await asyncio.to_thread(self._write_policy, action.policy)
            self.queue.put_nowait(policy.PivotProgress(time.monotonic(), "policy_written", error))

    def _archive(self, action: policy.Archive) -> str | None:
        """Move the old bandit state, samples and policy into the pivot's archive folder."""
        try:
            target = archive_dir(self.cfg.run_dir, action.directory)
            target.mkdir(parents=True, exist_ok=True)
            for source in (self.files.samples, self.files.bandit_state, self.files.policy):
                if source.exists():
                    os.replace(source, target / source.name)
            if not (target / self.files.policy.name).exists():
                # The run had no policy.json: archive the defaults it ran under.
                write_atomic(
                    target / self.files.policy.name,
                    orjson.dumps(action.old_policy, option=orjson.OPT_INDENT_2),
                )
            write_atomic(
                target / "pivot.json",
                orjson.dumps(
                    {
                        "step": action.step,
                        "old_policy": action.old_policy,
                        "new_policy": action.new_policy,
                    },
                    option=orjson.OPT_INDENT_2,
                ),
            )
            fsync_dir(self.cfg.run_dir)
            fsync_dir(target)
        except OSError as exc:
            return f"{exc.filename or ''}: {exc.strerror or exc}"
        return None

    def _write_policy(self, new_policy: dict[str, Any]) -> str | None:
        data = orjson.dumps(new_policy, option=orjson.OPT_INDENT_2) + b"\n"
        try:
            write_atomic(self.files.policy, data, mode=0o644)
            if self.files.policy.read_bytes() != data:
                return "policy.json reads back different from what was written"
        except OSError as exc:
            return f"policy.json: {exc.strerror or exc}"
        return None

    async def _file_op(self, operation: Any, name: str, failure_kind: str) -> None:
        """Move or delete checkpoint files; a failure is journaled, never fatal to the loop."""
        assert self.journal is not None
        try:
            await asyncio.to_thread(operation, name)
        except (OSError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
            self.journal.append(failure_kind, {"name": name, "error": reason})
            log.error("%s %s: %s", failure_kind, name, reason)

    async def _spawn(self, action: policy.Spawn) -> None:
        assert self.journal is not None and self.hub is not None
        cfg = self.cfg
        argv = list(cfg.trainer.command)
        env = {**os.environ, **cfg.trainer.env}
        env.pop("TRAINWARDEN_RESUME", None)
        env.pop("TRAINWARDEN_PIVOT", None)
        for key in NOTIFY_ENV_KEYS:
            # The trainer must not talk to systemd as if it were the daemon.
            env.pop(key, None)
        env["TRAINWARDEN_RUN_DIR"] = str(cfg.run_dir)
        env["TRAINWARDEN_SEG"] = str(action.seg)
        if action.resume is not None:
            path = self.store.dir / action.resume.name
            env["TRAINWARDEN_RESUME"] = str(path)
            argv += [
                a.replace("{checkpoint}", str(path)).replace("{step}", str(action.resume.step))
                for a in cfg.trainer.resume_args
            ]
        if action.pivot:
            env["TRAINWARDEN_PIVOT"] = "1"
        self.journal.append(
            "spawn",
            {
                "seg": action.seg,
                "resume": policy.ckpt_json(action.resume),
                "pivot": action.pivot,
                "argv": argv,
            },
        )
        self.hub.begin_segment(
            action.seg, action.resume.step if action.resume else None, pivot=action.pivot
        )
        try:
            proc = await spawn(argv, cfg.run_dir, env, cfg.log_path)
        except OSError as exc:
            self.queue.put_nowait(
                policy.SpawnFailed(time.monotonic(), f"{argv[0]}: {exc.strerror or exc}")
            )
            return
        self.proc = proc
        self.journal.append("trainer_started", {"pid": proc.pid, "seg": action.seg})
        self.queue.put_nowait(policy.TrainerSpawned(time.monotonic(), proc.pid))
        asyncio.get_running_loop().create_task(self._await_exit(proc))
        try:
            # In a thread: while the child is still inside execve its cmdline reads empty,
            # and TrainerIdentity.of waits (sleeping) for it.
            identity = await asyncio.to_thread(TrainerIdentity.of, proc.pid)
            await asyncio.to_thread(identity.save, self.files.trainer_pid)
        except Exception as exc:  # it may already have died; its exit is reported anyway
            log.warning("could not record the trainer's identity: %s", exc)

    async def _await_exit(self, proc: asyncio.subprocess.Process) -> None:
        returncode = await proc.wait()
        # The trainer's last lines (its final checkpoint, its last steps) are in the log
        # before its exit: read them first so the policy sees them in order.
        if self.hub is not None:
            await self.hub.drain_log()
        self.queue.put_nowait(policy.TrainerExited(time.monotonic(), proc.pid, returncode))
        if self.ready_sent is False:
            self._send_ready()

    # ------------------------------------------------------------------ checkpoints

    async def _scan_checkpoints(self) -> None:
        names, _ = self.store.scan()
        verdicts = await asyncio.to_thread(lambda: [self.store.verify(n) for n in names])
        good = []
        for verdict in verdicts:
            if verdict.info is None:
                assert self.journal is not None
                self.journal.append(
                    "quarantine",
                    {"step": verdict.step, "name": verdict.name, "reason": verdict.reason},
                )
                await self._file_op(self.store.quarantine, verdict.name, "quarantine_failed")
                continue
            mtime = verdict.info.path.stat().st_mtime
            self.known_commits[verdict.name] = mtime
            good.append(policy.Ckpt(verdict.info.step, verdict.name, verdict.info.bytes, mtime))
            if self.hub is not None:
                self.hub.checkpoint_seen(verdict.info)
        self.state = replace(self.state, checkpoints=tuple(sorted(good, key=lambda c: c.step)))

    async def _verify_and_report(self, name: str) -> None:
        verdict: Verdict = await asyncio.to_thread(self.store.verify, name)
        now = time.monotonic()
        if verdict.info is None:
            if verdict.reason.startswith("vanished"):
                return
            self.queue.put_nowait(
                policy.CheckpointRejected(now, verdict.step, name, verdict.reason)
            )
            return
        try:
            mtime = verdict.info.path.stat().st_mtime
        except FileNotFoundError:
            return
        if self.known_commits.get(name) == mtime:
            return
        self.known_commits[name] = mtime
        if self.hub is not None:
            self.hub.checkpoint_seen(verdict.info)
        self.queue.put_nowait(
            policy.CheckpointCommitted(now, verdict.info.step, name, verdict.info.bytes, mtime)
        )

    # ------------------------------------------------------------------ inputs from others

    def _on_committed_name(self, name: str) -> None:
        asyncio.get_running_loop().create_task(self._verify_and_report(name))

    def _on_writing(self) -> None:
        self.queue.put_nowait(policy.CheckpointWriting(time.monotonic()))

    def _on_signal(self, sig: int) -> None:
        self.queue.put_nowait(policy.ShutdownRequested(time.monotonic(), signal.Signals(sig).name))

    def _on_step(self, step: int, loss: float) -> None:
        event = policy.StepLogged(time.monotonic(), step, loss)
        if self._idle and self.queue.empty():
            # The event loop waits with nothing queued: decide on the line's own callback
            # rather than wake its task for it (most of a quiet run's cost per step). The
            # actions, if any (a divergence's kill), run in the task, in order.
            before = self.state
            try:
                actions = self._decide(event)
            except Exception as exc:
                # Not the follower's to swallow: the task raises it, as for any event.
                self.queue.put_nowait(_Failed(exc))
                return
            if actions:
                self.queue.put_nowait(_Decided(before, actions))
            else:
                self._announce(before)
                # As the task would before waiting again (a no-op unless a deadline came
                # earlier: a step only ever pushes the stall deadline later).
                self._arm_tick(policy.deadline(self.state, self.rules))
        else:
            self.queue.put_nowait(event)
        if not self.ready_sent and self.state.trainer_alive:
            self._send_ready()

    async def operator(self, cmd: str, args: dict[str, Any], uid: int | None) -> policy.Reply:
        """Queue an operator command and wait for the policy's reply."""
        if cmd == "pivot":
            args = {**args, **await asyncio.to_thread(self._pivot_context)}
        request_id = next(self.request_ids)
        future: asyncio.Future[policy.Reply] = asyncio.get_running_loop().create_future()
        self.replies[request_id] = future
        self.queue.put_nowait(policy.Operator(time.monotonic(), request_id, cmd, args, uid))
        try:
            return await future
        finally:
            self.replies.pop(request_id, None)

    def _pivot_context(self) -> dict[str, Any]:
        """What the pure policy needs to validate a pivot: the arms the trainer has now."""
        bandit: dict[str, Any] = {}
        current: dict[str, Any] = {}
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            bandit = orjson.loads(self.files.bandit_state.read_bytes())
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            current = orjson.loads(self.files.policy.read_bytes())
        arms = bandit.get("arms") if isinstance(bandit, dict) else None
        return {
            "_arms": sorted(arms) if isinstance(arms, dict) else [],
            "_zombies": list(bandit.get("zombies") or []) if isinstance(bandit, dict) else [],
            "_current_policy": current if isinstance(current, dict) else {},
            "_utc": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
        }

    # ------------------------------------------------------------------ mirror, metrics

    def _in_background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _start_mirror(self) -> None:
        if self.cfg.mirror.path is None:
            return
        from trainwarden.supervisor.store.mirror import Mirror

        self.mirror = Mirror(
            Path(self.cfg.mirror.path).expanduser(),
            run_dir=self.cfg.run_dir,
            keep_last=self.cfg.mirror.keep_last,
            format_name=self.cfg.checkpoints.format,
            checkpoint_dir=self.cfg.checkpoints.dir,
        )
        self._in_background(self._catch_up_mirror())

    async def _catch_up_mirror(self) -> None:
        """Committed while no daemon ran (or a copy failed): the mirror is behind. Its
        pointer is read in a thread: the mirror may be a slow or hung network disk."""
        assert self.mirror is not None
        newest = self.state.newest
        if newest is None:
            return
        mirrored = await asyncio.to_thread(self.mirror.newest_step)
        if mirrored is None or mirrored < newest.step:
            self._mirror_soon(newest)

    def _mirror_soon(self, ckpt: policy.Ckpt) -> None:
        path = self.store.dir / ckpt.name
        companions = [p for p in self.fmt.companions(path) if p.parent == self.store.dir]
        files = [path, *(p for p in companions if p.exists())]
        self._in_background(self._mirror(ckpt.step, ckpt.name, files))

    async def _mirror(self, step: int, name: str, files: list[Path]) -> None:
        assert self.mirror is not None and self.journal is not None
        result = await self.mirror.copy(step, files, name)
        if result.ok:
            self.journal.append("mirrored", result.journal_fields())
        elif result.superseded_by is not None:
            self.journal.append("mirror_superseded", result.journal_fields())
        else:
            self.journal.append("mirror_failed", result.journal_fields())

    async def _retract(self, step: int) -> None:
        assert self.mirror is not None and self.journal is not None
        if step not in await asyncio.to_thread(self.mirror.steps):
            return
        latest = await self.mirror.retract(step)
        self.journal.append("mirror_retracted", {"step": step, "latest": latest})

    def _start_metrics(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.journal is not None
        if self.cfg.metrics.listen is None:
            return
        from trainwarden.supervisor.serve.metrics import start_metrics_server

        try:
            self.metrics = start_metrics_server(
                self.cfg.metrics.listen,
                self.metrics_snapshot,
                allow_remote=self.cfg.metrics.allow_remote,
                loop=loop,
            )
        except OSError as exc:
            # Supervision matters more than the figures: carry on without them.
            self.journal.append(
                "metrics_failed",
                {"listen": self.cfg.metrics.listen, "error": exc.strerror or str(exc)},
            )
            return
        self.journal.append("metrics_listening", {"url": self.metrics.url})

    def metrics_snapshot(self) -> dict[str, Any]:
        """The figures /metrics exports; runs on the event loop (see supervisor.metrics)."""
        assert self.hub is not None
        return {
            "run": self.cfg.run.name,
            **self.state_view(),
            **self.hub.telemetry(),
            "gpu": self.hub.latest.get("gpu"),
        }

    # ------------------------------------------------------------------ views

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
        if not self.ready_sent and (self.state.trainer_alive or self.state.phase in policy.HALTED):
            self._send_ready()

    def state_view(self) -> dict[str, Any]:
        s = self.state
        detail: dict[str, Any] = {}
        if s.phase == "backoff" and s.backoff_until is not None:
            detail["restart_in_s"] = round(max(0.0, s.backoff_until - time.monotonic()), 3)
        if s.halt_reason and s.phase in policy.HALTED:
            detail["reason"] = s.halt_reason
        if s.stop_reason:
            detail["stop_reason"] = s.stop_reason
        if s.pivot is not None:
            detail["pivot_stage"] = s.pivot.stage
            detail["pivot_step"] = s.pivot.step
        uptime = None
        if s.trainer_started_t is not None and s.trainer_alive:
            uptime = round(time.monotonic() - s.trainer_started_t, 3)
        return {
            "state": s.phase,
            "detail": detail,
            "trainer_pid": s.trainer_pid,
            "trainer_uptime_s": uptime,
            "restarts": s.restarts,
            "restarts_without_progress": s.restarts_without_progress,
            "seg": s.seg,
        }

    def checkpoints_view(self) -> dict[str, Any]:
        doomed = policy.next_to_delete(self.state, self.rules)
        return {
            "checkpoints": [
                {
                    "step": c.step,
                    "name": c.name,
                    "path": str(self.store.dir / c.name),
                    "bytes": c.bytes,
                    "mtime": c.mtime,
                    "verified": True,
                    "pinned": c.step in self.state.pinned,
                    "next_to_delete": c.step == doomed,
                }
                for c in self.state.checkpoints
            ],
            "quarantined": [{"name": n} for n in self.store.quarantined()],
        }

    def status_view(self) -> dict[str, Any]:
        assert self.hub is not None
        view: dict[str, Any] = {
            "protocol": PROTOCOL_VERSION,
            "version": __version__,
            "run": self.cfg.run.name,
            "run_dir": str(self.cfg.run_dir),
            "daemon_pid": os.getpid(),
            "daemon_started_at": self.started_t,
            "total_steps": self.cfg.trainer.total_steps,
            **self.state_view(),
        }
        view.update(self.hub.status_fields())
        view["step"] = self.hub.last_step
        view.update(self.checkpoints_view())
        return view
