"""The run's held-out evaluations as the daemon holds them: each appended to `.eval.json`,
the newest for status, telemetry and /metrics, and all of them (one per evaluation
cadence: few) for history replies.

An evaluation is never a training step: nothing here reaches the divergence policy, the
resume audit or the step count. A nan validation loss is journaled (`val_nan`, once per
trainer start) and shown, and the trainer goes on.
"""

from __future__ import annotations

import bisect
import logging
import math
import time

from trainwarden.plugins.api import EvalRecord
from trainwarden.supervisor import protocol
from trainwarden.supervisor.store.evaldb import EvalPoint, EvalWriter, number_extras, read_evals
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.lossdb import encode_loss
from trainwarden.supervisor.store.rundir import RunFiles

log = logging.getLogger("trainwarden.telemetry")


class Validation:
    """What the daemon holds of `.eval.json`, and its writer."""

    def __init__(self, files: RunFiles, journal: Journal) -> None:
        self.path = files.eval_history
        self.journal = journal
        self.writer: EvalWriter | None = None
        self.steps: list[int] = []
        self.points: list[EvalPoint] = []
        """In step order, the newest segment's per step (as `read_evals` reads them)."""
        self.newest: EvalPoint | None = None
        """The latest start's newest evaluation."""
        self._nan_seg: int | None = None
        """The start whose nan validation loss was journaled (one record a start)."""

    def load(self) -> None:
        """At daemon start: the evaluations `.eval.json` holds, then append to it."""
        self.points = read_evals(self.path)
        self.steps = [point.step for point in self.points]
        self.newest = max(self.points, key=lambda p: (p.seg, p.step), default=None)
        self.writer = EvalWriter(self.path)
        self._note_space(time.time())

    @property
    def full(self) -> bool:
        """Evaluation lines are held in memory: the disk had no space for them."""
        return self.writer is not None and self.writer.full

    def observe(self, records: list[EvalRecord], seg: int, now: float) -> None:
        """A batch of evaluations the trainer logged: written with one write, kept."""
        rows = []
        for record in records:
            point = EvalPoint(
                record.step, record.loss, now, seg, number_extras(dict(record.extras))
            )
            self._keep(point)
            rows.append((point.step, point.loss, point.t, point.seg, point.extras))
            if math.isnan(record.loss) and self._nan_seg != seg:
                self._nan_seg = seg
                self.journal.append({"kind": "val_nan", "step": record.step, "seg": seg})
                log.warning(
                    "validation loss nan at step %d: reported only, training goes on",
                    record.step,
                )
        if self.writer is not None:
            self.writer.append_many(rows)
            self._note_space(now)

    def _keep(self, point: EvalPoint) -> None:
        i = bisect.bisect_left(self.steps, point.step)
        if i < len(self.steps) and self.steps[i] == point.step:
            self.points[i] = point
        else:
            self.steps.insert(i, point.step)
            self.points.insert(i, point)
        self.newest = point

    def retry(self) -> None:
        """Write the lines held since the disk filled (the daemon's retry timer)."""
        if self.writer is not None and self.writer.full:
            self.writer.retry()
            self._note_space(time.time())

    def _note_space(self, now: float) -> None:
        """Journal `.eval.json`'s change between full and written again (as `.loss.json`'s)."""
        writer = self.writer
        if writer is None:
            return
        change = self.journal.space.change(
            writer.path, writer.file.error, "holding its evaluation lines in memory",
            "evaluation", writer.file.take_lost, now,
        )  # fmt: skip
        if change is not None:
            self.journal.append(change)

    def status(self, now: float) -> protocol.Validation | None:
        """The newest evaluation for `status` (None before the first)."""
        newest = self.newest
        if newest is None:
            return None
        return {
            "step": newest.step,
            "loss": encode_loss(newest.loss),
            "extras": newest.extras,
            "seg": newest.seg,
            "t": newest.t,
            "age_s": round(max(now - newest.t, 0.0), 1) if newest.t else None,
        }

    def snapshot(self) -> tuple[list[int], list[float]]:
        """(steps, losses) as they stand, for a history reply built off the loop."""
        return list(self.steps), [p.loss for p in self.points]

    def close(self) -> None:
        if self.writer is not None:
            self.retry()
            self.writer.close()
