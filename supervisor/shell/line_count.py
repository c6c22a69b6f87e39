"""Step numbers for a log parser that counts lines instead of reading a step from each
(one with `resume_at`, such as hf-trainer's progress bar): each start's count begins at
the checkpoint it resumed from, and after a daemon restart at the last step its segment
recorded, so the lines caught up from the log keep their true steps instead of being
numbered from 0 again over the ones already recorded."""

from __future__ import annotations

from typing import Any

from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.losshistory import LossHistory

SPAWN_LOOKBACK_RECORDS = 5000
"""Journal records searched back for the current segment's spawn at a daemon restart."""


def counts_lines(parser: Any) -> bool:
    """Whether the parser numbers steps by counting lines (it has `resume_at`)."""
    return getattr(parser, "resume_at", None) is not None


def begin_at(parser: Any, resume_step: int | None) -> None:
    """A start resumed from `resume_step` (None: from scratch): count from there."""
    if counts_lines(parser):
        parser.resume_at(resume_step or 0)


def go_on(parser: Any, journal: Journal, history: LossHistory, seg: int) -> None:
    """At a daemon restart: go on from the last step segment `seg` recorded, or from the
    checkpoint it resumed from if it recorded none."""
    if not counts_lines(parser):
        return
    resume_step = resume_step_of(journal, seg)
    last = history.last_step_of(seg, above=resume_step)
    parser.resume_at(last if last is not None else resume_step or 0)


def resume_step_of(journal: Journal, seg: int) -> int | None:
    """The checkpoint step segment `seg` was started from, as its spawn record says."""
    for record in reversed(journal.tail(SPAWN_LOOKBACK_RECORDS)):
        if record.get("kind") == "spawn" and record.get("seg") == seg:
            resume = record.get("resume") or {}
            step = resume.get("step") if isinstance(resume, dict) else None
            return step if isinstance(step, int) else None
    return None
