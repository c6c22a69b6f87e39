"""Shapes that the daemon's lower layers build and a reply or a journal record carries,
each defined once.

The protocol re-exports them (status shows the resume audit that a resume_* record
journals; `history` and `history_of` send the loss buckets, evaluations and lineage the
store computes; `related_runs` the runs the store finds), so the store builds its part of
a reply as the protocol's type without importing the protocol; core.records builds its
record classes on them, for the checker only. Standard library only, and cheap to load,
as `phases` and `kinds` are.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class ResumeAuditFacts(TypedDict):
    """A resume audit's outcome (shell.start_audit.audit_result): status shows it as
    `resume_audit` (protocol.AuditResult), and each resume_* record carries its keys."""

    status: Literal["verified", "drift", "unverified"]
    checkpoint_step: int
    """The step the trainer resumed from."""
    checked: int
    """Replayed steps compared."""
    expected: int
    """Steps there were to compare."""
    seg: int | None
    step: int | None
    """The first step whose loss differed (drift only)."""
    old_loss: float | str | None
    """Non-finite losses as "nan", "inf", "-inf"."""
    new_loss: float | str | None


class ValidationSeries(TypedDict):
    """A history's evaluations in its step range (at most 2,000, evenly spaced)."""

    step: list[int]
    loss: list[float | None]
    """None for a non-finite loss."""


class BranchAncestor(TypedDict):
    run: str
    """The ancestor run's directory."""
    through_step: int
    """Its steps up to this one are part of the reply."""


class LossBuckets(TypedDict):
    """A step range decimated to buckets of equal width; lists are per bucket
    (store.lossquery.HistoryView.query)."""

    step: list[int]
    """Each bucket's first step."""
    min: list[float | None]
    mean: list[float | None]
    max: list[float | None]
    """Over the bucket's finite losses (None: it has none)."""
    nonfinite: list[int]
    """nan/inf losses in the bucket."""
    first_step: int | None
    last_step: int | None
    count: int


class HistoryBuckets(LossBuckets):
    """The buckets with the held-out evaluations in the same step range."""

    val: ValidationSeries


class HistoryOfResult(HistoryBuckets):
    """Another run's history read from its files, over its lineage (its parent's steps up
    to the branch step, then its own), bucketed as `history` (no markers)."""

    run: str
    """The run's resolved path."""
    lineage: list[list[Any]]
    """[path, last step taken from it (None: the run itself)], oldest first."""


class RelatedRun(TypedDict):
    path: str
    name: str
    relation: Literal["parent", "ancestor", "branch", "sibling"]
