"""What the daemon knows about the run besides its state, and the topics it is published
on. The hub follows the log: each batch of lines gives its steps to the policy first, then
to the monitor's figures, the loss history, the resume audit and the newest save; it
builds the telemetry frame and publishes it. Beside it, each in a module of its own:
the loss history (`run_history`), GPU and host samples (`samplers`), held-out evaluations
(`validation`), the resume audit (`start_audit`), the newest checkpoint and unrecognised
names (`checkpoint_view`), the log offset (`log_offset`), stray output (`stray`) and a
counting parser's steps (`line_count`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from trainwarden.plugins.api import CheckpointInfo, EvalRecord, StepRecord
from trainwarden.supervisor import registry as plugin_registry
from trainwarden.supervisor.config import Config
from trainwarden.supervisor.contract import SAVE_REPORT_PREFIX, SaveReport, parse_save_report
from trainwarden.supervisor.core.phases import STEPPING, Phase
from trainwarden.supervisor.core.progress import is_divergent
from trainwarden.supervisor.inputs.logfollow import LogFollower
from trainwarden.supervisor.protocol import (
    HistoryResult,
    ParserNoMatch,
    StateView,
    Telemetry,
)
from trainwarden.supervisor.shell import line_count
from trainwarden.supervisor.shell.checkpoint_view import CheckpointView
from trainwarden.supervisor.shell.log_offset import LogOffset
from trainwarden.supervisor.shell.parser_watch import ParserWatch, no_match_after_s
from trainwarden.supervisor.shell.run_history import RunHistory
from trainwarden.supervisor.shell.samplers import Samplers
from trainwarden.supervisor.shell.save_cadence import SaveCadence
from trainwarden.supervisor.shell.start_audit import StartAudit
from trainwarden.supervisor.shell.stray import StrayLines
from trainwarden.supervisor.shell.telemetry import Monitor, grad_norm_of, settings_from_config
from trainwarden.supervisor.shell.validation import Validation
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.rundir import RunFiles

log = logging.getLogger("trainwarden.telemetry")

PUBLISH_INTERVAL_S = 0.2
CADENCE_LOOKBACK_RECORDS = 5000
"""Journal records the save cadence replays at a daemon start."""
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
        self.audit = StartAudit(self.runs, journal, cfg.telemetry.resume_tolerance)
        """The resume audit of each start."""
        self.samplers = Samplers(
            cfg, files, journal, self.monitor, self.publish, trainer_pid, phase,
            lambda: self.checkpoints.newest,
        )  # fmt: skip
        self.latest = self.samplers.latest
        """Each topic's newest data (the samplers' and the state), for snapshots."""
        self.follower: LogFollower | None = None
        self.sinks: list[Callable[[str, Any], None]] = []
        self.listening: Callable[[str], bool] = lambda topic: True
        """Whether a topic has subscribers: telemetry frames are built only for someone."""
        self.cadence = SaveCadence(cfg.trainer.total_steps)
        self.cadence.replay(journal.tail(CADENCE_LOOKBACK_RECORDS))
        self.snapshot_failing: Callable[[], dict[str, Any] | None] = lambda: None
        """Why the in-place snapshots fail, if they do ([checkpoints] fixed)."""
        self.checkpoints = CheckpointView(journal, cfg.checkpoints.format, self._schedule_publish)
        self.offset = LogOffset(
            files.log_offset, cfg.log_path, lambda: self.runs.full or self.validation.full
        )
        self.stray = StrayLines(
            journal, loop, lambda line: isinstance(self.parser.parse(line), StepRecord)
        )
        self._init_lines()
        self._init_start()

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

    def _init_start(self) -> None:
        """What the current start has shown: its lines, steps, and its resume's audit."""
        self.start_last_line: str | None = None
        """The current (or last ended) start's newest non-blank line: a crash's cause."""
        self.start_steps = 0
        """Step lines the current start has logged."""
        self._resume_names: tuple[str, ...] = ()
        """The checkpoint the current start was given (name, path), until its first step."""
        self.resume_mentioned = False
        """The current start printed its checkpoint's name before its first step: evidence
        that it read it (see inputs.resume_read)."""

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
        line_count.go_on(self.parser, self.journal, history, seg)

    def start_follower(self) -> None:
        offset = self.offset.saved()
        self.offset.open()
        self.follower = LogFollower(self.cfg.log_path, offset, self._on_lines, self.loop)
        self.follower.start()

    async def drain_log(self) -> None:
        """Read whatever the log holds now (a trainer's last words before its exit)."""
        if self.follower is not None:
            await asyncio.sleep(0)
            self.follower.read_new()

    def _on_lines(self, lines: list[str]) -> None:
        if not self.accepting:
            self.stray.note(self.seg, lines)
            # Counted as stray once: a restarted daemon must not take them for its start's.
            if self.follower is not None:
                self.offset.save(self.follower.offset)
            return
        parse = self.parser.parse
        history = self.runs.history
        audit = self.audit
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
            if audit.current is not None:
                audit.observe(record.step, record.loss)
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
            if self.follower is not None:
                self.offset.save(self.follower.offset)
        elif self.follower is not None:
            self.offset.save_due(self.follower.offset)  # lines that told us nothing
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
        self.journal.append({"kind": "parser_no_match", **notice})
        log.warning("%s", notice["hint"])
        self.on_no_match(dict(notice))  # the daemon's handler takes a plain dict
        self._schedule_publish()

    def begin_segment(
        self,
        seg: int,
        resume_step: int | None,
        pivot: bool = False,
        timeline: tuple[int, int] | None = None,
        resume_names: tuple[str, ...] = (),
    ) -> None:
        """A trainer starts: its lines belong to `seg`, and the steps it replays are
        audited (see shell.start_audit for `pivot` and `timeline`)."""
        self.stray.flush()
        self.accepting = True
        self.cadence.started()
        self.monitor.new_segment()
        self.audit.begin(seg, resume_step, pivot, timeline)
        self.seg = seg
        self.parser_watch.begin(seg)
        self.start_last_line = None
        self.start_steps = 0
        self.resume_mentioned = False
        self._resume_names = tuple(name for name in resume_names if name)
        line_count.begin_at(self.parser, resume_step)

    async def history_query(self, start: int | None, end: int | None, points: int) -> HistoryResult:
        result = await self.runs.query(start, end, points, self.validation.snapshot())
        result["collapse_loss"] = self.monitor.snapshot().get("collapse_loss")
        return result

    # -------------------------------------------------------------- checkpoints

    def checkpoint_seen(self, info: CheckpointInfo, mtime: float, scanned: bool = False) -> None:
        """A verified commit, its file's mtime (the commit time, which a daemon restart
        does not change), and whether the start-up scan found it (the journal, replayed
        at start, already told the cadence about those)."""
        if not scanned:
            self.cadence.committed(info.step)
        newest = self.checkpoints.committed(info, mtime)
        if newest and self.cfg.telemetry.n_params == "auto" and info.n_params:
            self.monitor.set_n_params(info.n_params)

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
        newest = self.checkpoints.newest
        now = time.time()
        at = self.last_step if self.last_step is not None else (newest.step if newest else None)
        save = self.last_save
        val = self.validation.status(now)
        data: Telemetry = {
            **figures,
            "step": self.last_step,
            "step_age_s": _age_s(now, self.last_step_t),
            "last_checkpoint_step": newest.step if newest else None,
            "last_checkpoint_age_s": _age_s(now, self.checkpoints.newest_t),
            "next_checkpoint_step": (
                None if phase == Phase.FINISHED else self.cadence.next_after(at)
            ),
            "last_save_name": save.name if save else None,
            "last_save_stall_s": save.stall_s if save else None,
            "last_save_write_s": save.write_s if save else None,
            "last_save_age_s": _age_s(now, self.last_save_t),
            "last_line": self.last_line,
            "last_line_age_s": _age_s(now, self.last_line_t),
            "resume_audit": self.audit.result,
            "parser_no_match": self.parser_watch.notice,
            "checkpoints_unrecognised": list(self.checkpoints.unrecognised.values()),
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

    def start_samplers(self) -> None:
        self.samplers.start(self.loop)

    def close(self) -> None:
        self.samplers.close()
        if self.follower is not None:
            self.follower.read_new()
            self.follower.stop()
            self.stray.flush()
            # A last try; lines still held are read again from the log by the next daemon
            # (the saved offset stays before them).
            self.retry_writes()
        self.offset.close(self.follower.offset if self.follower is not None else None)
        self.runs.close()
        self.validation.close()


def _age_s(now: float, since: float | None) -> float | None:
    """Seconds since `since` (wall time), to a tenth; None: never."""
    return round(max(now - since, 0.0), 1) if since is not None else None
