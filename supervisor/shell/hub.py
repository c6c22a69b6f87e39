"""What the daemon knows about the run besides its state, and the topics it is published
on: the followed log's lines (steps to the policy, then the monitor's figures, the resume
audit, save reports, stray output), the newest checkpoint, and the telemetry frame. The
loss history is `run_history`'s, the GPU/host samples `samplers`', the held-out
evaluations `validation`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Final

from trainwarden.plugins.api import CheckpointInfo, EvalRecord, StepRecord
from trainwarden.supervisor import registry as plugin_registry
from trainwarden.supervisor.checkpoint_hints import unrecognised_hint
from trainwarden.supervisor.config import Config
from trainwarden.supervisor.contract import SAVE_REPORT_PREFIX, SaveReport, parse_save_report
from trainwarden.supervisor.core.phases import STEPPING, Phase
from trainwarden.supervisor.core.progress import is_divergent
from trainwarden.supervisor.inputs.logfollow import LogFollower
from trainwarden.supervisor.protocol import (
    AuditResult,
    LogStats,
    ParserNoMatch,
    StateView,
    StatusFigures,
    Telemetry,
    UnrecognisedCheckpoint,
)
from trainwarden.supervisor.shell.parser_watch import ParserWatch, no_match_after_s
from trainwarden.supervisor.shell.run_history import RunHistory
from trainwarden.supervisor.shell.samplers import Samplers
from trainwarden.supervisor.shell.telemetry import (
    Monitor,
    SaveCadence,
    grad_norm_of,
    settings_from_config,
)
from trainwarden.supervisor.shell.validation import Validation
from trainwarden.supervisor.store import resume_audit
from trainwarden.supervisor.store.appendfile import no_space
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.lossdb import encode_loss
from trainwarden.supervisor.store.resume_audit import ResumeAudit
from trainwarden.supervisor.store.rundir import RunFiles

log = logging.getLogger("trainwarden.telemetry")

PUBLISH_INTERVAL_S = 0.2
OFFSET_SAVE_INTERVAL_S = 1.0
STRAY_INTERVAL_S = 5.0
"""At most one `stray_output` record per this many seconds while lines keep coming."""
SPAWN_LOOKBACK_RECORDS = 5000
"""Journal records searched back for the current segment's spawn at a daemon restart."""
UNRECOGNISED_SHOWN = 20
"""Unrecognised names status lists at most (the newest; the journal has every one)."""
LAST_LINE_CHARS = 300
"""The trainer's newest output line is kept this long at most (status and telemetry)."""
LIVE_FIGURES: Final = ("tokens_per_s", "mfu", "steps_per_min", "eta_s")
"""The figures of the trainer's pace now, withheld while it is not stepping (the run
averages, mfu_avg and loss_avg, stay: they say what the run did)."""


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
        """The daemon's queue for a step line's StepLogged: the policy decides each."""
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
        self.runs = RunHistory(cfg, files, journal, loop, cache_refresh_rows)
        """The loss history: .loss.json, its cache, the queries clients make of it."""
        self.validation = Validation(files, journal)
        self.samplers = Samplers(
            cfg, files, journal, self.monitor, self.publish, trainer_pid, phase,
            lambda: self.newest_checkpoint,
        )  # fmt: skip
        self.latest = self.samplers.latest
        """Each topic's newest data (the samplers' and the state), for snapshots."""
        self.follower: LogFollower | None = None
        self.sinks: list[Callable[[str, Any], None]] = []
        self.listening: Callable[[str], bool] = lambda topic: True
        """Whether a topic has subscribers: telemetry frames are built only for someone."""
        self.cadence = SaveCadence(cfg.trainer.total_steps)
        self.cadence.replay(journal.tail(SPAWN_LOOKBACK_RECORDS))
        self.snapshot_failing: Callable[[], dict[str, Any] | None] = lambda: None
        """Why the in-place snapshots fail, if they do ([checkpoints] fixed)."""
        self._init_lines()
        self._init_start()
        self._init_checkpoints()

    def _init_lines(self) -> None:
        """What the lines read so far told: the newest step, line and save."""
        self.seg = 0
        self.last_step: int | None = None
        self.last_step_t: float | None = None
        """Wall time the newest step line was seen (from .loss.json after a restart)."""
        self.last_line: str | None = None
        """The trainer's newest non-blank output line (clipped), for a start that hangs."""
        self.last_line_t: float | None = None
        self.last_save: SaveReport | None = None
        """The newest save a trainer reported (its stall and write time): a fact about
        the newest save, kept across trainer starts; not journaled (a daemon restart
        starts without one)."""
        self.last_save_t: float | None = None
        self.accepting = True
        """Lines belong to a start whose main process runs (or the one it just left)."""
        self.catching_up = True
        """Lines read before this daemon's first start: the previous daemon's start's, which
        it did not live to read (its trainer went on while no daemon ran)."""
        self.caught_up_divergence: tuple[int, float] | None = None
        """The first of those lines with a non-finite or too high loss (step, loss)."""
        self._publish_handle: asyncio.Handle | None = None
        self._offset_saved_t = 0.0
        self._offset_fd: int | None = None
        self._stray: dict[str, Any] | None = None
        self._stray_handle: asyncio.TimerHandle | None = None

    def _init_start(self) -> None:
        """What the current start has shown: its lines, steps, and its resume's audit."""
        self.audit: ResumeAudit | None = None
        self.audit_result: AuditResult | None = None
        self.start_last_line: str | None = None
        """The current (or last ended) start's newest non-blank line: a crash's cause."""
        self.start_steps = 0
        """Step lines the current start has logged."""
        self._resume_names: tuple[str, ...] = ()
        """The checkpoint the current start was given (name, path), until its first step."""
        self.resume_mentioned = False
        """The current start printed its checkpoint's name before its first step: evidence
        that it read it (see inputs.resume_read)."""

    def _init_checkpoints(self) -> None:
        self.newest_checkpoint: CheckpointInfo | None = None
        self.newest_checkpoint_t: float | None = None
        """Wall time the newest checkpoint was committed (its file's mtime)."""
        self.unrecognised: dict[str, UnrecognisedCheckpoint] = {}
        """Names in the checkpoint directory the format does not read, oldest first."""

    # -------------------------------------------------------------- history and log

    def load_history(self, seg: int) -> None:
        """Rebuild telemetry from .loss.json (not the whole log) at daemon start."""
        self.seg = seg
        self.runs.load()
        history = self.runs.history
        for step, loss, dt, t in history.recent(self.cfg.telemetry.window * 2):
            self.monitor.observe(step, loss, dt, t)
            self.last_step_t = t
        self.last_step = history.last_step
        self.validation.load()
        self._continue_count(seg)

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
        last = self.runs.history.last_step_of(seg, above=resume_step)
        self.parser.resume_at(last if last is not None else resume_step or 0)  # type: ignore[attr-defined]

    def _resume_step_of(self, seg: int) -> int | None:
        """The checkpoint step segment `seg` was started from, as its spawn record says."""
        for record in reversed(self.journal.tail(SPAWN_LOOKBACK_RECORDS)):
            if record.get("kind") == "spawn" and record.get("seg") == seg:
                resume = record.get("resume") or {}
                step = resume.get("step") if isinstance(resume, dict) else None
                return step if isinstance(step, int) else None
        return None

    def history_last_step(self) -> int | None:
        return self.runs.history.last_step

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
        history = self.runs.history
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
            history.add(record.step, record.loss, record.dt, now, self.seg)
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
        if rows:
            self.runs.append(rows)
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
        if self.runs.full or self.validation.full:
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
        self.runs.retry_writes()
        self.validation.retry()

    def end_segment(self) -> None:
        """The start's main process is gone and its last lines are read: what the log gains
        until the next start (a leftover helper's, an orphaned worker's) is stray output,
        journaled, never decided on."""
        self.accepting = False
        self.catching_up = False
        self.parser_watch.end()

    def _parser_matches_nothing(self, notice: ParserNoMatch) -> None:
        self.journal.append("parser_no_match", notice)
        log.warning("%s", notice["hint"])
        self.on_no_match(dict(notice))  # the daemon's handler takes a plain dict
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
        last = self.runs.history.last_step
        if last is not None and timeline is not None:
            last = min(last, self._timeline_reach(seg, *timeline))
        if not pivot and resume_step is not None and last is not None and last > resume_step:
            self.audit = ResumeAudit(
                self.runs.history, resume_step, last, self.cfg.telemetry.resume_tolerance
            )

    def _timeline_reach(self, seg: int, first_seg: int, changed_from: int) -> int:
        """The newest step whose standing loss was logged in this data timeline (or before
        its change): past it, the history holds an abandoned timeline's losses."""
        logged = (self.runs.history.last_step_of(k) for k in range(first_seg, seg))
        return max((s for s in logged if s is not None), default=changed_from - 1)

    def _finish_audit(self, result: resume_audit.AuditResult) -> None:
        self.audit = None
        fields = audit_result(result)
        kind = {"verified": "resume_verified", "drift": "resume_drift"}.get(
            fields["status"], "resume_unverified"
        )
        self.audit_result = fields
        self.journal.append(kind, fields)

    async def history_query(
        self, start: int | None, end: int | None, points: int
    ) -> dict[str, Any]:
        result = await self.runs.query(start, end, points, self.validation.snapshot())
        result["collapse_loss"] = self.monitor.snapshot().get("collapse_loss")
        return result

    async def history_of_query(
        self, run: str, start: int | None, end: int | None, points: int, peer: int | None = None
    ) -> dict[str, Any]:
        return await self.runs.query_other(run, start, end, points, peer)

    async def related_runs(self) -> list[dict[str, Any]]:
        return await self.runs.related_runs()

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

    def publish_state(self, data: StateView) -> None:
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

    def telemetry(self) -> Telemetry:
        figures = self.monitor.snapshot()
        phase = self.phase()
        newest = self.newest_checkpoint
        now = time.time()
        at = self.last_step if self.last_step is not None else (newest.step if newest else None)
        save = self.last_save
        val = self.validation.status(now)
        data: Telemetry = {
            **figures,
            "step": self.last_step,
            "step_age_s": _age_s(now, self.last_step_t),
            "last_checkpoint_step": newest.step if newest else None,
            "last_checkpoint_age_s": _age_s(now, self.newest_checkpoint_t or None),
            "next_checkpoint_step": (
                None if phase == Phase.FINISHED else self.cadence.next_after(at)
            ),
            "last_save_name": save.name if save else None,
            "last_save_stall_s": save.stall_s if save else None,
            "last_save_write_s": save.write_s if save else None,
            "last_save_age_s": _age_s(now, self.last_save_t),
            "last_line": self.last_line,
            "last_line_age_s": _age_s(now, self.last_line_t),
            "resume_audit": self.audit_result,
            "parser_no_match": self.parser_watch.notice,
            "checkpoints_unrecognised": list(self.unrecognised.values()),
            "val_step": val["step"] if val else None,
            "val_loss": val["loss"] if val else None,
        }
        if phase not in STEPPING:
            for key in LIVE_FIGURES:
                data[key] = None
        return data

    def snapshot(self, topic: str) -> Any:
        if topic == "telemetry":
            return self.telemetry()
        if topic == "events":
            return self.journal.tail(50)
        return self.latest.get(topic)

    def status_fields(self) -> StatusFigures:
        return {
            **self.telemetry(),
            "gpu": self.latest.get("gpu"),
            "gpu_status": self.samplers.gpu_status(),
            "host": self.latest.get("host"),
            "disk_low": self.samplers.disk_low,
            "disk_full": self.journal.space.full,
            "disk_full_files": sorted(self.journal.space.full_files),
            "snapshot_failing": self.snapshot_failing(),
            "log": log_stats(self.follower) if self.follower else None,
            "val": self.validation.status(time.time()),
        }

    def start_samplers(self) -> None:
        self.samplers.start(self.loop)

    def close(self) -> None:
        self.samplers.close()
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
        self.runs.close()
        self.validation.close()


def _age_s(now: float, since: float | None) -> float | None:
    """Seconds since `since` (wall time), to a tenth; None: never."""
    return round(max(now - since, 0.0), 1) if since is not None else None


def audit_result(result: resume_audit.AuditResult) -> AuditResult:
    """The resume audit's outcome as status shows it and its record journals it:
    non-finite losses as "nan", "inf", "-inf", as in the history file."""
    return {
        "status": result.status,
        "checkpoint_step": result.checkpoint_step,
        "checked": result.checked,
        "expected": result.expected,
        "seg": result.seg,
        "step": result.step,
        "old_loss": None if result.old_loss is None else encode_loss(result.old_loss),
        "new_loss": None if result.new_loss is None else encode_loss(result.new_loss),
    }


def log_stats(follower: LogFollower) -> LogStats:
    """How the run log is being read: the follower's counts and where it is."""
    stats = follower.stats
    return {
        "lines": stats.lines,
        "skipped_long": stats.skipped_long,
        "undecodable": stats.undecodable,
        "truncations": stats.truncations,
        "rotations": stats.rotations,
        "offset": follower.offset,
    }
