"""Shapes that a journal record and a reply both carry, each defined once.

The protocol imports them at run time (status shows the resume audit that a resume_*
record journals); core.records builds its record classes on them, for the checker only.
Standard library only, and cheap to load, as `phases` and `kinds` are.
"""

from __future__ import annotations

from typing import Literal, TypedDict


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
