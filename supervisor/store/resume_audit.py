"""The resume audit: compares the losses a resumed trainer replays with the ones they
supersede in the loss history."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trainwarden.supervisor.store.losshistory import LossHistory


@dataclass(frozen=True, slots=True)
class AuditResult:
    """How the losses replayed after a resume compare with the ones they supersede."""

    status: Literal["verified", "drift", "unverified"]
    """verified: every compared step matched; drift: one differed; unverified: none compared."""
    checkpoint_step: int
    """The step the trainer resumed from."""
    checked: int
    """Replayed steps compared."""
    expected: int
    """Steps there were to compare (logged after the checkpoint, before the restart)."""
    seg: int | None = None
    """The segment (trainer start) that replayed them, when the caller said."""
    step: int | None = None
    """The first step whose loss differed (drift only)."""
    old_loss: float | None = None
    new_loss: float | None = None


class ResumeAudit:
    """Compares replayed losses (checkpoint_step < step <= last_step) with the old ones.

    Build it when the resumed trainer starts, before its replayed steps reach the
    history: it copies the values they will supersede (at most the steps since the
    checkpoint). Then feed it every logged step. The result is decided at the first
    difference (drift), once every expected step has been seen or the trainer logs past
    them (verified), or when finish() says the trainer stopped logging; with nothing to
    compare it is `unverified`. Each audit hands its result out exactly once, from
    whichever of observe() or finish() comes first after the decision.
    """

    def __init__(
        self,
        previous: LossHistory | Mapping[int, float],
        checkpoint_step: int,
        last_step: int | None = None,
        tolerance: float = 0.0,
        *,
        seg: int | None = None,
    ) -> None:
        """previous: the history (or {step: loss}) before the restart; last_step: the
        newest step to compare (default: all after the checkpoint), e.g. one before a
        divergence that is being rolled back."""
        if isinstance(previous, LossHistory):
            through = previous.last_step if last_step is None else last_step
            old = previous.losses_between(checkpoint_step, through) if through is not None else {}
        else:
            old = {
                step: loss
                for step, loss in previous.items()
                if step > checkpoint_step and (last_step is None or step <= last_step)
            }
        self.checkpoint_step = checkpoint_step
        self.seg = seg
        self.tolerance = tolerance
        self._pending = old
        self._last_expected = max(old, default=checkpoint_step)
        self.expected = len(old)
        self.checked = 0
        self.result: AuditResult | None = None
        self._handed_out = False
        if not old:
            self.result = self._decide()

    def _matches(self, old: float, new: float) -> bool:
        if old == new or (math.isnan(old) and math.isnan(new)):
            return True
        if not math.isfinite(old) and math.isfinite(new):
            # The superseded value is a divergence the rollback undid, not a resume error.
            return True
        return abs(new - old) <= self.tolerance  # false for inf vs finite, nan vs anything

    def _decide(self, drift: tuple[int, float, float] | None = None) -> AuditResult:
        common: dict[str, Any] = {
            "checkpoint_step": self.checkpoint_step,
            "checked": self.checked,
            "expected": self.expected,
            "seg": self.seg,
        }
        if drift is not None:
            step, old, new = drift
            return AuditResult("drift", step=step, old_loss=old, new_loss=new, **common)
        return AuditResult("verified" if self.checked else "unverified", **common)

    def _hand_out(self) -> AuditResult | None:
        if self.result is None or self._handed_out:
            return None
        self._handed_out = True
        return self.result

    def observe(self, step: int, loss: float) -> AuditResult | None:
        """A logged step of the resumed trainer; the result once it is decided, else None."""
        if self.result is None:
            old = self._pending.pop(step, None)
            if old is not None:
                self.checked += 1
                if not self._matches(old, loss):
                    self.result = self._decide((step, old, loss))
            if self.result is None and (not self._pending or step >= self._last_expected):
                self.result = self._decide()
        return self._hand_out()

    def finish(self) -> AuditResult | None:
        """The trainer stopped logging (exited, died, stopped): the result, unless handed out."""
        if self.result is None:
            self.result = self._decide()
        return self._hand_out()
