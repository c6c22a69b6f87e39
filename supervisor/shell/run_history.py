"""The run's loss history as the daemon keeps it: `.loss.json` appended as steps are
logged, its binary cache rebuilt in a thread every so many rows, and the queries clients
make of it (this run's, a branch's ancestors', another run's), answered off the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.protocol import (
    HistoryOfResult,
    HistoryResult,
    Marker,
    MarkerKind,
    RelatedRun,
)
from trainwarden.supervisor.shell.other_runs import OtherRuns
from trainwarden.supervisor.store import evaldb, runseries
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
from trainwarden.supervisor.store.rundir import RunFiles

log = logging.getLogger("trainwarden.telemetry")

CACHE_MIN_ROWS = 100_000
"""A start-up that parsed this many rows past the loss cache writes a new one first."""
CACHE_REFRESH_ROWS = 1_000_000
"""Logged rows after which the loss cache is rebuilt (in a thread), so a start-up after
a crash parses at most about this many lines."""
MARKERS_SEARCHED = 2000
"""Journal records searched back for a history reply's markers."""
MARKER_KINDS = {
    "spawn": "restart",
    "divergence": "divergence",
    "pivot": "pivot",
    "crash": "crash",
    "spike": "spike",
    "rollback": "skip",
}
"""The journal kinds a history reply marks, and the marker (core.kinds.MarkerKind) each
becomes."""


class RunHistory:
    def __init__(
        self,
        cfg: Config,
        files: RunFiles,
        journal: Journal,
        loop: asyncio.AbstractEventLoop,
        cache_refresh_rows: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.files = files
        self.journal = journal
        self.loop = loop
        self.history = LossHistory()
        self.writer: LossWriter | None = None
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

    @property
    def loss_cache_dir(self) -> Path:
        return self.files.state_dir / "loss-cache"

    def load(self) -> None:
        """Read .loss.json (through its cache) at daemon start and open it for appending."""
        path, cache = self.files.loss_history, self.loss_cache_dir
        try:
            # Many rows past the cache go into a new generation as they are parsed, so the
            # first start of a long run holds one chunk of them in memory, not all.
            self.history = LossHistory.load(path, cache, cache_rows=CACHE_MIN_ROWS)
        except OSError as exc:
            # Only a start-up's speed depends on the cache: the run goes on without it.
            log.warning("could not write the loss cache in %s: %s", cache, exc)
            self.history = LossHistory.load(path, cache)
        self.writer = LossWriter(self.files.loss_history)
        self._note_loss_space()
        # A branch's first history query need not wait for its parent's history to load.
        self._history_thread.submit(self._ancestry, self.history.first_step)

    @property
    def full(self) -> bool:
        """Step lines are held in memory: the disk refused them."""
        return self.writer is not None and self.writer.full

    def append(self, rows: list[tuple[int, float, float | None, float, int]]) -> None:
        """Steps logged (step, loss, dt, time, seg), already added to `history`: to disk."""
        if self.writer is None:
            return
        self.writer.append_many(rows)
        self._note_loss_space()
        self._count_for_cache(len(rows))

    def retry_writes(self) -> None:
        """Write the step lines held since the disk filled (the daemon's retry timer)."""
        if self.writer is not None and self.writer.full:
            self.writer.retry()
            self._note_loss_space()

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
            self.journal.append(change)

    # -------------------------------------------------------------- the cache

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

    # -------------------------------------------------------------- queries

    async def query(
        self,
        start: int | None,
        end: int | None,
        points: int,
        validation: tuple[Sequence[int], Sequence[float]],
    ) -> HistoryResult:
        """Decimated in the history thread over a snapshot, so the loop keeps deciding on
        steps however long the run (and however many clients ask). `validation`: the
        held-out evaluations' steps and losses, snapshotted on the loop. Its
        `collapse_loss` is the monitor's, which the hub fills in on the loop."""
        view = self.history.snapshot()
        own_first = self.history.first_step
        val_steps, val_losses = validation

        def answer() -> HistoryResult:
            ancestry = self._ancestry(own_first)
            whole = HistoryView([*ancestry.parts, *view.parts]) if ancestry.parts else view
            steps = [p.step for p in ancestry.evals] + list(val_steps)
            losses = [p.loss for p in ancestry.evals] + list(val_losses)
            return {
                **whole.query(start, end, points),
                "markers": self._markers(),
                "branch_step": ancestry.branch_step,
                "ancestors": ancestry.ancestors,
                "val": evaldb.series(steps, losses, start, end, points),
                "collapse_loss": None,
            }

        return await self.loop.run_in_executor(self._history_thread, answer)

    async def query_other(
        self, run: str, start: int | None, end: int | None, points: int, peer: int | None = None
    ) -> HistoryOfResult:
        """Another run's history, read from its files (read only: its own daemon, if any,
        owns them) in the other runs' thread, never this run's history thread. For `peer`,
        a client of another user than the daemon's (or root), only a related run that user
        may read (resolve_for_peer)."""
        run_dir = self.files.run_dir

        def answer() -> HistoryOfResult:
            if peer is None:
                path = runseries.resolve_run(run_dir, run)
            else:
                path = runseries.resolve_for_peer(run_dir, run, peer)
            return runseries.decimated(self._others.series(path), start, end, points)

        return await self._others.run(self.loop, answer)

    async def related_runs(self) -> list[RelatedRun]:
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

    def _markers(self) -> list[Marker]:
        markers: list[Marker] = []
        for record in self.journal.tail(MARKERS_SEARCHED):
            name = MARKER_KINDS.get(record.get("kind", ""))
            if name is None:
                continue
            kind = MarkerKind(name)
            step = record.get("step")
            if kind == MarkerKind.RESTART:
                if record.get("seg", 0) <= 1:
                    continue  # the run's first start is no restart
                resume = record.get("resume") or {}
                step = resume.get("step", 0)
            elif kind == MarkerKind.CRASH:
                step = record.get("last_step")
            elif kind == MarkerKind.SPIKE:
                step = record.get("first_step")
            elif kind == MarkerKind.SKIP:
                # Where the data jumps: the first step of the window (none: a plain rollback).
                window = record.get("window")
                step = window[0] if isinstance(window, list) and window else None
            if isinstance(step, int):
                markers.append({"step": step, "kind": kind})
        return markers

    def close(self) -> None:
        # A cache rebuild under way finishes (its manifest rename is what makes it count).
        self._history_thread.shutdown(wait=False, cancel_futures=True)
        self._others.close()
        if self.writer is not None:
            self.writer.close()
