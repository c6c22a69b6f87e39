"""The resume audit of each trainer start: the losses a resumed start logs again are
compared with the ones logged before it (store.resume_audit), and the outcome is journaled
(`resume_verified`, `resume_drift` or `resume_unverified`) and shown in status.

A start is audited only where it replays steps of the same data: after a pivot the bandit
starts fresh, and after a spike's skip window the losses earlier starts logged past the
change saw other data by design (see `StartAudit.begin`).
"""

from __future__ import annotations

from trainwarden.supervisor.protocol import AuditResult
from trainwarden.supervisor.shell.run_history import RunHistory
from trainwarden.supervisor.store import resume_audit
from trainwarden.supervisor.store.journal import Journal
from trainwarden.supervisor.store.lossdb import encode_loss
from trainwarden.supervisor.store.resume_audit import ResumeAudit


class StartAudit:
    def __init__(self, runs: RunHistory, journal: Journal, tolerance: float) -> None:
        self.runs = runs
        self.journal = journal
        self.tolerance = tolerance
        """[telemetry] resume_tolerance."""
        self.current: ResumeAudit | None = None
        """The current start's audit, until its outcome is known."""
        self.result: AuditResult | None = None
        """The newest outcome (status shows it)."""

    def begin(
        self,
        seg: int,
        resume_step: int | None,
        pivot: bool = False,
        timeline: tuple[int, int] | None = None,
    ) -> None:
        """Start `seg`'s audit, after the outcome of the previous one. `timeline`: a spike's
        skip window (the first start given it, the step it changes data from): only the
        steps this timeline has logged, and those before the change, are compared."""
        self.end()
        history = self.runs.history
        last = history.last_step
        if last is not None and timeline is not None:
            last = min(last, self._timeline_reach(seg, *timeline))
        if not pivot and resume_step is not None and last is not None and last > resume_step:
            self.current = ResumeAudit(history, resume_step, last, self.tolerance)

    def observe(self, step: int, loss: float) -> None:
        """A step line of the audited start."""
        assert self.current is not None
        result = self.current.observe(step, loss)
        if result is not None:
            self._finish(result)

    def end(self) -> None:
        """The start logs no more: its audit's outcome, if it has not had one."""
        if self.current is not None:
            result = self.current.finish()
            self.current = None
            if result is not None:
                self._finish(result)

    def _timeline_reach(self, seg: int, first_seg: int, changed_from: int) -> int:
        """The newest step whose standing loss was logged in this data timeline (or before
        its change): past it, the history holds an abandoned timeline's losses."""
        logged = (self.runs.history.last_step_of(k) for k in range(first_seg, seg))
        return max((s for s in logged if s is not None), default=changed_from - 1)

    def _finish(self, result: resume_audit.AuditResult) -> None:
        self.current = None
        fields = audit_result(result)
        self.result = fields
        if fields["status"] == "verified":
            self.journal.append({"kind": "resume_verified", **fields})
        elif fields["status"] == "drift":
            self.journal.append({"kind": "resume_drift", **fields})
        else:
            self.journal.append({"kind": "resume_unverified", **fields})


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
