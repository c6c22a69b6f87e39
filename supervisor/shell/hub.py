"""What the daemon knows about the run besides its state: the followed log, the loss
and validation histories, the monitor's figures, the resume audit, GPU/host samples and
the trainer's bandit and sample files, and the topics they are published on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from trainwarden.plugins.api import CheckpointInfo, EvalRecord, StepRecord
from trainwarden.supervisor import registry as plugin_registry
from trainwarden.supervisor.checkpoint_hints import unrecognised_hint
from trainwarden.supervisor.config import Config
from trainwarden.supervisor.contract import SAVE_REPORT_PREFIX, SaveReport, parse_save_report
from trainwarden.supervisor.core.gpu_faults import Throttle, throttle_step
from trainwarden.supervisor.core.phases import STEPPING, Phase
from trainwarden.supervisor.core.progress import is_divergent
from trainwarden.supervisor.inputs.logfollow import LogFollower
from trainwarden.supervisor.protocol import (
    SIDECAR_READ_MAX_BYTES,
    bounded_sidecar,
    sidecar_too_large,
)
from trainwarden.supervisor.shell.other_runs import OtherRuns
from trainwarden.supervisor.shell.parser_watch import ParserWatch, no_match_after_s
from trainwarden.supervisor.shell.telemetry import (
    Monitor,
    SaveCadence,
    grad_norm_of,
    no_gpu_reason,
    settings_from_config,
)
from trainwarden.supervisor.shell.validation import Validation
from trainwarden.supervisor.store import evaldb, runseries
from trainwarden.supervisor.store.appendfile import no_space
from trainwarden.supervisor.store.branch_history import (
    AncestryKey,
    Inherited,
    ancestry_key,
    inherited,
)
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.lossdb import LossWriter
from trainwarden.supervisor.store.losshistory import LossHistory
from trainwarden.supervisor.store.lossquery import HistoryView
from trainwarden.supervisor.store.resume_audit import ResumeAudit
from trainwarden.supervisor.store.rundir import RunFiles

log = logging.getLogger("trainwarden.telemetry")

PUBLISH_INTERVAL_S = 0.2
OFFSET_SAVE_INTERVAL_S = 1.0
STRAY_INTERVAL_S = 5.0
"""At most one `stray_output` record per this many seconds while lines keep coming."""
CACHE_MIN_ROWS = 100_000
"""A start-up that parsed this many rows past the loss cache writes a new one first."""
CACHE_REFRESH_ROWS = 1_000_000
"""Logged rows after which the loss cache is rebuilt (in a thread), so a start-up after
a crash parses at most about this many lines."""
SPAWN_LOOKBACK_RECORDS = 5000
"""Journal records searched back for the current segment's spawn at a daemon restart."""
UNRECOGNISED_SHOWN = 20
"""Unrecognised names status lists at most (the newest; the journal has every one)."""
LAST_LINE_CHARS = 300
"""The trainer's newest output line is kept this long at most (status and telemetry)."""
LIVE_FIGURES = ("tokens_per_s", "mfu", "steps_per_min", "eta_s")
"""The figures of the trainer's pace now, withheld while it is not stepping (the run
averages, mfu_avg and loss_avg, stay: they say what the run did)."""
MARKER_KINDS = {
    "spawn": "restart",
    "divergence": "divergence",
    "pivot": "pivot",
    "crash": "crash",
    "spike": "spike",
    "rollback": "skip",
}


class TelemetryHub:
    def __init__(
        self,
        cfg: Config,
        files: RunFiles,
        journal: Journal,
        loop: asyncio.AbstractEventLoop,
        on_step: Callable[[int, float, float | None], None],
        trainer_pid: Callable[[], int | None] = lambda: None,
        cache_refresh_rows: int | None = None,
        on_no_match: Callable[[dict[str, Any]], None] = lambda notice: None,
        phase: Callable[[], Phase] = lambda: Phase.RUNNING,
    ) -> None:
        self.cfg = cfg
        self.files = files
        self.journal = journal
        self.loop = loop
        self.on_step = on_step
        self.trainer_pid = trainer_pid
        """The daemon's own knowledge of the live trainer (for process figures)."""
        self.phase = phase
        """The run's phase now: the pace figures are published only while it steps."""
        self.parser = plugin_registry.log_parser(
            cfg.telemetry.parser, dataclasses.asdict(cfg.telemetry)
        )
        self.monitor = Monitor(settings_from_config(cfg.telemetry, cfg.trainer.total_steps))
        self.on_no_match = on_no_match
        """Told (after the journal) when a start's lines have matched no line of the parser."""
        self.parser_watch = ParserWatch(
            loop,
            cfg.telemetry.parser,
            no_match_after_s(cfg.restart.stall_timeout_s),
            self._parser_matches_nothing,
        )
        self.history = LossHistory()
        self.writer: LossWriter | None = None
        self.validation = Validation(files, journal)
        self.follower: LogFollower | None = None
        self.audit: ResumeAudit | None = None
        self.audit_result: dict[str, Any] | None = None
        self.seg = 0
        self.last_step: int | None = None
        self.sinks: list[Callable[[str, Any], None]] = []
        self.listening: Callable[[str], bool] = lambda topic: True
        """Whether a topic has subscribers: telemetry frames are built only for someone."""
        self.latest: dict[str, Any] = {"gpu": None, "host": None, "bandit": None, "samples": None}
        self.newest_checkpoint: CheckpointInfo | None = None
        self.newest_checkpoint_t: float | None = None
        """Wall time the newest checkpoint was committed (its file's mtime)."""
        self.cadence = SaveCadence(cfg.trainer.total_steps)
        self.cadence.replay(journal.tail(SPAWN_LOOKBACK_RECORDS))
        self.last_line: str | None = None
        """The trainer's newest non-blank output line (clipped), for a start that hangs."""
        self.last_line_t: float | None = None
        self.start_last_line: str | None = None
        self.start_steps = 0
        """Step lines the current start has logged."""
        """The current (or last ended) start's newest non-blank line: a crash's cause."""
        self._resume_names: tuple[str, ...] = ()
        """The checkpoint the current start was given (name, path), until its first step."""
        self.resume_mentioned = False
        """The current start printed its checkpoint's name before its first step: evidence
        that it read it (see inputs.resume_read)."""
        self.last_step_t: float | None = None
        """Wall time the newest step line was seen (from .loss.json after a restart)."""
        self.last_save: SaveReport | None = None
        """The newest save a trainer reported (its stall and write time): a fact about
        the newest save, kept across trainer starts; not journaled (a daemon restart
        starts without one)."""
        self.last_save_t: float | None = None
        self.unrecognised: dict[str, dict[str, str]] = {}
        """Names in the checkpoint directory the format does not read, oldest first."""
        self.disk_low = False
        self._publish_handle: asyncio.Handle | None = None
        self._offset_saved_t = 0.0
        self._offset_fd: int | None = None
        self._sampler_task: asyncio.Task[None] | None = None
        self._file_mtimes: dict[str, float] = {}
        self.gpu_sampler: Any = None
        self.throttle = Throttle()
        """GPU 0's throttle episode (see core.gpu_faults.throttle_step)."""
        self.host_sampler: Any = None
        self.snapshot_failing: Callable[[], dict[str, Any] | None] = lambda: None
        """Why the in-place snapshots fail, if they do ([checkpoints] fixed)."""
        self.accepting = True
        """Lines belong to a start whose main process runs (or the one it just left)."""
        self.catching_up = True
        """Lines read before this daemon's first start: the previous daemon's start's, which
        it did not live to read (its trainer went on while no daemon ran)."""
        self.caught_up_divergence: tuple[int, float] | None = None
        """The first of those lines with a non-finite or too high loss (step, loss)."""
        self._stray: dict[str, Any] | None = None
        self._stray_handle: asyncio.TimerHandle | None = None
        self._history_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="history"
        )
        """History queries and cache rebuilds, one at a time, off the event loop."""
        self._others = OtherRuns()
        """Other runs' histories (history_of, related_runs): their own thread and bounds."""
        self._inherited: tuple[AncestryKey, Inherited] | None = None
        """A branch's ancestors' history, by what it was read for (history thread only)."""
        self._rows_since_cache = 0
        self._cache_job: asyncio.Future[LossHistory | None] | None = None
        self.cache_refresh_rows = cache_refresh_rows or CACHE_REFRESH_ROWS
        """Logged rows between cache rebuilds (a parameter for tests)."""

    # -------------------------------------------------------------- history and log

    def load_history(self, seg: int) -> None:
        """Rebuild telemetry from .loss.json (not the whole log) at daemon start."""
        self.seg = seg
        path, cache = self.files.loss_history, self.loss_cache_dir
        try:
            # Many rows past the cache go into a new generation as they are parsed, so the
            # first start of a long run holds one chunk of them in memory, not all.
            self.history = LossHistory.load(path, cache, cache_rows=CACHE_MIN_ROWS)
        except OSError as exc:
            # Only a start-up's speed depends on the cache: the run goes on without it.
            log.warning("could not write the loss cache in %s: %s", cache, exc)
            self.history = LossHistory.load(path, cache)
        for step, loss, dt, t in self.history.recent(self.cfg.telemetry.window * 2):
            self.monitor.observe(step, loss, dt, t)
            self.last_step_t = t
        self.last_step = self.history.last_step
        self.writer = LossWriter(self.files.loss_history)
        self._note_loss_space()
        self.validation.load()
        self._continue_count(seg)
        # A branch's first history query need not wait for its parent's history to load.
        self._history_thread.submit(self._ancestry, self.history.first_step)

    @property
    def counts_lines(self) -> bool:
        """Whether the parser numbers steps by counting lines (it has `resume_at`)."""
        return getattr(self.parser, "resume_at", None) is not None

    def _continue_count(self, seg: int) -> None:
        """After a daemon restart, a parser that counts lines goes on from the last step
        segment `seg` recorded (or from the checkpoint it resumed from, if it recorded
        none), so the lines caught up from the log keep their true steps instead of being
        numbered from 0 again over the ones already recorded."""
        if not self.counts_lines:
            return
        resume_step = self._resume_step_of(seg)
        last = self.history.last_step_of(seg, above=resume_step)
        self.parser.resume_at(last if last is not None else resume_step or 0)  # type: ignore[attr-defined]

    def _resume_step_of(self, seg: int) -> int | None:
        """The checkpoint step segment `seg` was started from, as its spawn record says."""
        for record in reversed(self.journal.tail(SPAWN_LOOKBACK_RECORDS)):
            if record.get("kind") == "spawn" and record.get("seg") == seg:
                resume = record.get("resume") or {}
                step = resume.get("step") if isinstance(resume, dict) else None
                return step if isinstance(step, int) else None
        return None

    @property
    def loss_cache_dir(self) -> Path:
        return self.files.state_dir / "loss-cache"

    def _rebuild_cache(self, upto: int) -> LossHistory | None:
        """In the history thread: the cache for .loss.json's first `upto` bytes (what had
        been logged when the rebuild began), and the history over it."""
        try:
            return LossHistory.load(
                self.files.loss_history, self.loss_cache_dir, upto=upto, cache_rows=1
            )
        except OSError as exc:
            log.warning("could not write the loss cache in %s: %s", self.loss_cache_dir, exc)
            return None

    def _count_for_cache(self, rows: int) -> None:
        self._rows_since_cache += rows
        if self._rows_since_cache < self.cache_refresh_rows or self._cache_job is not None:
            return
        upto = self.writer.size() if self.writer is not None else None
        if upto is None:
            return  # lines held on a full disk: the file is behind the history for now
        self._rows_since_cache = 0
        self.history.mark()
        job = self.loop.run_in_executor(self._history_thread, self._rebuild_cache, upto)
        self._cache_job = job
        job.add_done_callback(self._cache_rebuilt)

    def _cache_rebuilt(self, job: asyncio.Future[LossHistory | None]) -> None:
        """On the loop: the running history trades the rows the new cache holds for maps
        of it (the steps logged meanwhile are added again), so its memory stays about
        CACHE_REFRESH_ROWS rows however long the daemon runs."""
        self._cache_job = None
        base = None
        if not job.cancelled():
            if job.exception() is not None:
                log.warning("loss cache rebuild failed: %r", job.exception())
            else:
                base = job.result()
        if base is None:
            self.history.remap_cancel()
            return
        self.history.remap(base)

    def history_last_step(self) -> int | None:
        return self.history.last_step

    def start_follower(self) -> None:
        offset = self._saved_offset()
        self._offset_fd = os.open(
            self.files.log_offset, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
        self.follower = LogFollower(self.cfg.log_path, offset, self._on_lines, self.loop)
        self.follower.start()

    def _saved_offset(self) -> int:
        try:
            return int(self.files.log_offset.read_text().strip() or 0)
        except (OSError, ValueError):
            # No record of where we were: old lines belong to earlier runs of the log.
            try:
                return self.cfg.log_path.stat().st_size
            except OSError:
                return 0

    async def drain_log(self) -> None:
        """Read whatever the log holds now (a trainer's last words before its exit)."""
        if self.follower is not None:
            await asyncio.sleep(0)
            self.follower.read_new()

    def _on_lines(self, lines: list[str]) -> None:
        if not self.accepting:
            self._note_stray(lines)
            # Counted as stray once: a restarted daemon must not take them for its start's.
            self._offset_saved_t = time.monotonic()
            if self.follower is not None and self._offset_fd is not None:
                self._write_offset()
            return
        parse = self.parser.parse
        rows = []
        evals: list[EvalRecord] = []
        reported = False
        for line in reversed(lines):
            if line.strip():
                self.last_line = self.start_last_line = line.rstrip()[:LAST_LINE_CHARS]
                self.last_line_t = time.time()
                break
        for line in lines:
            if self._resume_names and any(name in line for name in self._resume_names):
                # Its checkpoint named before its first step: evidence the start read it.
                self.resume_mentioned = True
                self._resume_names = ()
            record = parse(line)
            if record is None:
                # The prefix first: a line that is neither costs one startswith.
                if line.startswith(SAVE_REPORT_PREFIX):
                    reported = self._note_save_report(line) or reported
                continue
            if isinstance(record, EvalRecord):
                evals.append(record)  # reported only: never a step, never decided on
                continue
            # The policy first: a divergence is acted on before any bookkeeping.
            self.on_step(record.step, record.loss, grad_norm_of(record.extras))
            if (
                self.catching_up
                and self.caught_up_divergence is None
                and is_divergent(record.loss, self.cfg.telemetry.max_loss)
            ):
                self.caught_up_divergence = (record.step, record.loss)
            now = time.time()
            rows.append((record.step, record.loss, record.dt, now, self.seg))
            self.history.add(record.step, record.loss, record.dt, now, self.seg)
            self.monitor.observe_record(record, now)
            self.last_step = record.step
            self.last_step_t = now
            self.start_steps += 1
            self._resume_names = ()  # past its first step: what it said no longer matters
            if self.audit is not None:
                result = self.audit.observe(record.step, record.loss)
                if result is not None:
                    self._finish_audit(result)
        if self.parser_watch.open:
            # Per batch, and only until the start's first match.
            if rows or evals:
                self.parser_watch.matched()
            else:
                self.parser_watch.unmatched(lines)
        if rows and self.writer is not None:
            self.writer.append_many(rows)
            self._note_loss_space()
            self._count_for_cache(len(rows))
        if evals:
            self.validation.observe(evals, self.seg, time.time())
        if rows or evals or reported:
            # The offset moves with what the lines told us (.loss.json's rows, .eval.json,
            # the newest save): a daemon killed now must not take them again from the log.
            # A restarted daemon would record the steps a second time as the segment it
            # knows of (a spike's abandoned losses as the new timeline's, a counting
            # parser's steps numbered again), or show an old start's save as news.
            self._offset_saved_t = time.monotonic()
            if self.follower is not None and self._offset_fd is not None:
                self._write_offset()
        else:
            self._save_offset()  # lines that told us nothing: at most once a second
        self._schedule_publish()

    def _note_save_report(self, line: str) -> bool:
        """Take a save report line; whether it was one."""
        report = parse_save_report(line)
        if report is None:
            return False
        name = report.name[:LAST_LINE_CHARS]
        self.last_save = dataclasses.replace(report, name=name)
        self.last_save_t = time.time()
        return True

    def _save_offset(self) -> None:
        now = time.monotonic()
        if self.follower is None or self._offset_fd is None:
            return
        if now - self._offset_saved_t < OFFSET_SAVE_INTERVAL_S:
            return
        self._offset_saved_t = now
        self._write_offset()

    def _write_offset(self) -> None:
        assert self.follower is not None and self._offset_fd is not None
        if (self.writer is not None and self.writer.full) or self.validation.full:
            # Lines past the saved offset are in memory only: a daemon killed now reads
            # them again from the log rather than lose them.
            return
        try:
            os.pwrite(self._offset_fd, f"{self.follower.offset}\n".encode().ljust(24), 0)
        except OSError as exc:
            if not no_space(exc):
                raise
            # Saved again within a second, once there is space: .loss.json holds the steps.

    def retry_writes(self) -> None:
        """Write the step lines held since the disk filled (the daemon's retry timer)."""
        if self.writer is not None and self.writer.full:
            self.writer.retry()
            self._note_loss_space()
        self.validation.retry()

    def _note_loss_space(self) -> None:
        """Journal (and log) .loss.json's change between full and written again."""
        writer = self.writer
        if writer is None:
            return
        change = self.journal.space.change(
            writer.path, writer.file.error, "holding its step lines in memory", "step",
            writer.take_lost, time.time(),
        )  # fmt: skip
        if change is not None:
            self.journal.append(*change)

    def end_segment(self) -> None:
        """The start's main process is gone and its last lines are read: what the log gains
        until the next start (a leftover helper's, an orphaned worker's) is stray output,
        journaled, never decided on."""
        self.accepting = False
        self.catching_up = False
        self.parser_watch.end()

    def _parser_matches_nothing(self, notice: dict[str, Any]) -> None:
        self.journal.append("parser_no_match", notice)
        log.warning("%s", notice["hint"])
        self.on_no_match(notice)
        self._schedule_publish()

    def _note_stray(self, lines: list[str]) -> None:
        lines = [line for line in lines if line.strip()]
        if not lines:
            return
        if self._stray is None:
            self._stray = {"seg": self.seg, "lines": 0, "step_lines": 0, "first": lines[0][:500]}
            self._stray_handle = self.loop.call_later(STRAY_INTERVAL_S, self.flush_stray)
        self._stray["lines"] += len(lines)
        self._stray["step_lines"] += sum(
            isinstance(self.parser.parse(line), StepRecord) for line in lines
        )

    def flush_stray(self) -> None:
        """Journal the stray lines counted so far (one record for many lines)."""
        if self._stray_handle is not None:
            self._stray_handle.cancel()
            self._stray_handle = None
        stray, self._stray = self._stray, None
        if stray is not None:
            self.journal.append("stray_output", stray)
            log.warning("%d stray log lines after seg %s ended", stray["lines"], stray["seg"])

    def begin_segment(
        self,
        seg: int,
        resume_step: int | None,
        pivot: bool = False,
        timeline: tuple[int, int] | None = None,
        resume_names: tuple[str, ...] = (),
    ) -> None:
        """A trainer starts: its lines belong to `seg`; audit the steps it replays.

        After a pivot the bandit starts fresh, so replayed steps see other data by design:
        there is nothing to audit. After a spike's skip window (`timeline`: the first start
        given it, the step it changes data from), losses that earlier starts logged from that
        step on saw other data by design too: only the steps this timeline has logged, and
        those before the change, are compared."""
        self.flush_stray()
        self.accepting = True
        self.cadence.started()
        self.monitor.new_segment()
        if self.audit is not None:
            result = self.audit.finish()
            if result is not None:
                self._finish_audit(result)
        self.seg = seg
        self.parser_watch.begin(seg)
        self.audit = None
        self.start_last_line = None
        self.start_steps = 0
        self.resume_mentioned = False
        self._resume_names = tuple(name for name in resume_names if name)
        if self.counts_lines:
            # Parsers that count steps themselves (hf-trainer) continue from the checkpoint.
            self.parser.resume_at(resume_step or 0)  # type: ignore[attr-defined]
        last = self.history.last_step
        if last is not None and timeline is not None:
            last = min(last, self._timeline_reach(seg, *timeline))
        if not pivot and resume_step is not None and last is not None and last > resume_step:
            self.audit = ResumeAudit(
                self.history, resume_step, last, self.cfg.telemetry.resume_tolerance
            )

    def _timeline_reach(self, seg: int, first_seg: int, changed_from: int) -> int:
        """The newest step whose standing loss was logged in this data timeline (or before
        its change): past it, the history holds an abandoned timeline's losses."""
        logged = (self.history.last_step_of(k) for k in range(first_seg, seg))
        return max((s for s in logged if s is not None), default=changed_from - 1)

    def _finish_audit(self, result: Any) -> None:
        self.audit = None
        fields = result.to_dict() if hasattr(result, "to_dict") else dict(result)
        kind = {"verified": "resume_verified", "drift": "resume_drift"}.get(
            fields.get("status", ""), "resume_unverified"
        )
        self.audit_result = fields
        self.journal.append(kind, fields)

    async def history_query(
        self, start: int | None, end: int | None, points: int
    ) -> dict[str, Any]:
        """Decimated in the history thread over a snapshot, so the loop keeps deciding on
        steps however long the run (and however many clients ask)."""
        view = self.history.snapshot()
        own_first = self.history.first_step
        val_steps, val_losses = self.validation.snapshot()

        def answer() -> dict[str, Any]:
            ancestry = self._ancestry(own_first)
            whole = HistoryView([*ancestry.parts, *view.parts]) if ancestry.parts else view
            steps = [p.step for p in ancestry.evals] + val_steps
            losses = [p.loss for p in ancestry.evals] + val_losses
            return {
                **whole.query(start, end, points),
                "markers": self._markers(),
                "branch_step": ancestry.branch_step,
                "ancestors": ancestry.ancestors,
                "val": evaldb.series(steps, losses, start, end, points),
            }

        result = await self.loop.run_in_executor(self._history_thread, answer)
        result["collapse_loss"] = self.monitor.snapshot().get("collapse_loss")
        return result

    async def history_of_query(
        self, run: str, start: int | None, end: int | None, points: int, peer: int | None = None
    ) -> dict[str, Any]:
        """Another run's history, read from its files (read only: its own daemon, if any,
        owns them) in the other runs' thread, never this run's history thread. For `peer`,
        a client of another user than the daemon's (or root), only a related run that user
        may read (resolve_for_peer)."""
        run_dir = self.files.run_dir

        def answer() -> dict[str, Any]:
            if peer is None:
                path = runseries.resolve_run(run_dir, run)
            else:
                path = runseries.resolve_for_peer(run_dir, run, peer)
            return runseries.decimated(self._others.series(path), start, end, points)

        return await self._others.run(self.loop, answer)

    async def related_runs(self) -> list[dict[str, Any]]:
        return await self._others.run(
            self.loop, functools.partial(runseries.related_runs, self.files.run_dir)
        )

    def _ancestry(self, own_first: int | None) -> Inherited:
        """In the history thread: a branch's inherited steps, read again only when its
        lineage changed (a parent now reachable, say) or its own steps reach below its
        branch step."""
        key = ancestry_key(self.cfg.run_dir, own_first)
        if self._inherited is None or self._inherited[0] != key:
            self._inherited = (key, inherited(self.cfg.run_dir, key[1]))
        return self._inherited[1]

    def _markers(self) -> list[dict[str, Any]]:
        markers = []
        for record in self.journal.tail(2000):
            kind = MARKER_KINDS.get(record.get("kind", ""))
            if kind is None:
                continue
            step = record.get("step")
            if kind == "restart":
                if record.get("seg", 0) <= 1:
                    continue  # the run's first start is no restart
                resume = record.get("resume") or {}
                step = resume.get("step", 0)
            elif kind == "crash":
                step = record.get("last_step")
            elif kind == "spike":
                step = record.get("first_step")
            elif kind == "skip":
                # Where the data jumps: the first step of the window (none: a plain rollback).
                window = record.get("window")
                step = window[0] if isinstance(window, list) and window else None
            if isinstance(step, int):
                markers.append({"step": step, "kind": kind})
        return markers

    # -------------------------------------------------------------- checkpoints

    def checkpoint_seen(self, info: CheckpointInfo, mtime: float, scanned: bool = False) -> None:
        """A verified commit, its file's mtime (the commit time, which a daemon restart
        does not change), and whether the start-up scan found it (the journal, replayed
        at start, already told the cadence about those)."""
        if not scanned:
            self.cadence.committed(info.step)
        previous = self.newest_checkpoint
        if previous is not None and info.step <= previous.step:
            return
        self.newest_checkpoint = info
        self.newest_checkpoint_t = mtime or None
        if self.cfg.telemetry.n_params == "auto" and info.n_params:
            self.monitor.set_n_params(info.n_params)

    def checkpoint_unrecognised(self, name: str, is_dir: bool) -> None:
        """The checkpoint watcher found a name its format does not read: say which option
        would (journaled once per name by the watcher's own bookkeeping)."""
        fmt = self.cfg.checkpoints.format
        hint = unrecognised_hint(name, is_dir, fmt)
        self.journal.append(
            "checkpoint_unrecognised",
            {"name": name, "folder": is_dir, "format": fmt, "hint": hint},
        )
        log.warning("%s", hint)
        self.unrecognised[name] = {"name": name, "hint": hint}
        while len(self.unrecognised) > UNRECOGNISED_SHOWN:
            del self.unrecognised[next(iter(self.unrecognised))]
        self._schedule_publish()

    def checkpoint_resolved(self, name: str) -> None:
        """An unrecognised name went away."""
        if self.unrecognised.pop(name, None) is not None:
            self._schedule_publish()

    # -------------------------------------------------------------- publishing

    def publish(self, topic: str, data: Any) -> None:
        for sink in self.sinks:
            sink(topic, data)

    def publish_state(self, data: dict[str, Any]) -> None:
        self.latest["state"] = data
        self.publish("state", data)
        # The pace figures come and go with the phase: a stop must not leave the last
        # speed and ETA standing until the next step line.
        self._schedule_publish()

    def _schedule_publish(self) -> None:
        # Coalesce: at 10,000 lines/s subscribers still get a few frames a second. With
        # nobody subscribed there is no frame to build and no timer to wake the loop for.
        if self._publish_handle is None and self.listening("telemetry"):
            self._publish_handle = self.loop.call_later(PUBLISH_INTERVAL_S, self._publish_telemetry)

    def _publish_telemetry(self) -> None:
        self._publish_handle = None
        self.publish("telemetry", self.telemetry())

    def telemetry(self) -> dict[str, Any]:
        data = self.monitor.snapshot()
        phase = self.phase()
        if phase not in STEPPING:
            data.update(dict.fromkeys(LIVE_FIGURES))
        data["step"] = self.last_step
        newest = self.newest_checkpoint
        now = time.time()
        data["step_age_s"] = (
            round(max(now - self.last_step_t, 0.0), 1) if self.last_step_t is not None else None
        )
        data["last_checkpoint_step"] = newest.step if newest else None
        data["last_checkpoint_age_s"] = (
            round(max(now - self.newest_checkpoint_t, 0.0), 1) if self.newest_checkpoint_t else None
        )
        at = self.last_step if self.last_step is not None else (newest.step if newest else None)
        data["next_checkpoint_step"] = (
            None if phase == Phase.FINISHED else self.cadence.next_after(at)
        )
        save = self.last_save
        data["last_save_name"] = save.name if save else None
        data["last_save_stall_s"] = save.stall_s if save else None
        data["last_save_write_s"] = save.write_s if save else None
        data["last_save_age_s"] = (
            round(max(now - self.last_save_t, 0.0), 1) if self.last_save_t is not None else None
        )
        data["last_line"] = self.last_line
        data["last_line_age_s"] = (
            round(max(now - self.last_line_t, 0.0), 1) if self.last_line_t is not None else None
        )
        data["resume_audit"] = self.audit_result
        data["parser_no_match"] = self.parser_watch.notice
        data["checkpoints_unrecognised"] = list(self.unrecognised.values())
        data.update(self.validation.telemetry())
        return data

    def snapshot(self, topic: str) -> Any:
        if topic == "telemetry":
            return self.telemetry()
        if topic == "events":
            return self.journal.tail(50)
        return self.latest.get(topic)

    def status_fields(self) -> dict[str, Any]:
        fields = self.telemetry()
        fields["gpu"] = self.latest.get("gpu")
        fields["gpu_status"] = self.gpu_status()
        fields["host"] = self.latest.get("host")
        fields["disk_low"] = self.disk_low
        fields["disk_full"] = self.journal.space.full
        fields["disk_full_files"] = sorted(self.journal.space.full_files)
        fields["snapshot_failing"] = self.snapshot_failing()
        fields["log"] = self.follower.stats_dict() if self.follower else None
        fields["val"] = self.validation.status(time.time())
        return fields

    def gpu_status(self) -> str:
        if self.gpu_sampler is None:
            return "not sampled yet"
        if not getattr(self.gpu_sampler, "available", False):
            return getattr(self.gpu_sampler, "reason", None) or no_gpu_reason()
        return "ok"

    # -------------------------------------------------------------- samplers

    def start_samplers(self) -> None:
        self._sampler_task = self.loop.create_task(self._sample_forever())

    async def _sample_forever(self) -> None:
        from trainwarden.supervisor.inputs.gpu import GpuSampler
        from trainwarden.supervisor.inputs.host import HostSampler

        self.gpu_sampler = await asyncio.to_thread(GpuSampler)
        self.host_sampler = HostSampler(self.cfg.checkpoint_dir)
        if not self.gpu_sampler.available:
            if self.cfg.telemetry.peak_tflops == "auto":
                self.monitor.set_peak_tflops(None, no_gpu_reason())
        else:
            name = await asyncio.to_thread(self.gpu_sampler.name)
            if self.cfg.telemetry.peak_tflops == "auto":
                self.monitor.set_gpu_name(name)
        while True:
            try:
                await self._sample_once()
            except Exception:  # a sampler failure must never stop supervision
                log.exception("sampling failed")
            await asyncio.sleep(self.cfg.telemetry.sample_interval_s)

    async def _sample_once(self) -> None:
        from trainwarden.supervisor.inputs.host import disk_low

        gpu = await asyncio.to_thread(self.gpu_sampler.sample)
        gpu_data = gpu.to_dict() if gpu is not None else None
        self.latest["gpu"] = gpu_data
        self.publish("gpu", gpu_data)
        if gpu is not None:
            self._watch_throttle(gpu.index, gpu.throttle_reasons)
        pid = self.trainer_pid()
        host = await asyncio.to_thread(self.host_sampler.sample, pid)
        host_data = host.to_dict()
        self.latest["host"] = host_data
        self.publish("host", host_data)
        newest = self.newest_checkpoint
        if newest is not None:
            low = disk_low(host.disk_free_bytes, newest.bytes)
            if low != self.disk_low:
                self.disk_low = low
                self.journal.append(
                    "disk_low" if low else "disk_ok",
                    {"free_bytes": host.disk_free_bytes, "checkpoint_bytes": newest.bytes},
                )
        for topic, path in (("bandit", self.files.bandit_state), ("samples", self.files.samples)):
            data = await asyncio.to_thread(self._read_if_changed, topic, path)
            if data is not None:
                self.latest[topic] = data
                self.publish(topic, data)

    def _watch_throttle(self, index: int, reasons: Any) -> None:
        """Journal `gpu_throttle` once per episode of heat or hardware slowdown that lasts
        [gpu] throttle_after_s, with the MFU it cost."""
        from trainwarden.supervisor.inputs.gpu import ALARMING_REASONS

        alarming = tuple(r for r in reasons or () if r in ALARMING_REASONS)
        mfu = self.monitor.snapshot().get("mfu") if self.phase() in STEPPING else None
        self.throttle, record = throttle_step(
            self.throttle, time.monotonic(), alarming, mfu, self.cfg.gpu.throttle_after_s
        )
        if record is not None:
            self.journal.append("gpu_throttle", {"gpu": index, **record})

    def _read_if_changed(self, topic: str, path: Path) -> Any:
        try:
            info = path.stat()
        except OSError:
            return None
        mtime = info.st_mtime
        if self._file_mtimes.get(topic) == mtime:
            return None
        self._file_mtimes[topic] = mtime
        if info.st_size > SIDECAR_READ_MAX_BYTES:
            return sidecar_too_large(info.st_size)
        try:
            raw = path.read_bytes()
            data = orjson.loads(raw)
        except (OSError, orjson.JSONDecodeError) as exc:
            # The trainer writes these atomically; a bad one is its bug, not ours.
            log.warning("ignoring %s: %s", path.name, exc)
            return None
        # Cut to what a subscribe's one line can carry (the cut is marked `truncated`).
        return bounded_sidecar(data, len(raw)) if isinstance(data, dict) else None

    def close(self) -> None:
        if self._sampler_task is not None:
            self._sampler_task.cancel()
        # A cache rebuild under way finishes (its manifest rename is what makes it count).
        self._history_thread.shutdown(wait=False, cancel_futures=True)
        self._others.close()
        if self.follower is not None:
            self.follower.read_new()
            self.follower.stop()
            self.flush_stray()
            # A last try; lines still held are read again from the log by the next daemon
            # (the saved offset stays before them).
            self.retry_writes()
            if self._offset_fd is not None:
                self._write_offset()
        if self._offset_fd is not None:
            os.close(self._offset_fd)
            self._offset_fd = None
        if self.writer is not None:
            self.writer.close()
        self.validation.close()
