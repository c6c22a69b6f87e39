"""Whether the configured parser reads the trainer's lines at all.

A trainer whose lines the parser never matches looks, to the policy, like a trainer that
logs nothing: it is killed as hung after stall_timeout_s, and nothing says why. This
watch notices sooner. When a start's first line is followed by no matching line for
min(60 s, stall_timeout_s / 2), it reports `parser_no_match` once for that start, with a
line it did not match; a matching line clears it.

The hub tells it about batches of lines, never single lines, and only until the start's
first match: a healthy trainer costs it nothing per line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from trainwarden.supervisor.protocol import ParserNoMatch

NO_MATCH_MAX_S = 60.0
"""The longest a start's lines may match nothing before the daemon says so."""
SAMPLE_CHARS = 200
"""A sample line is clipped to this many characters."""


def no_match_after_s(stall_timeout_s: float) -> float:
    """How long a start's lines may match nothing before it is reported: well before the
    stall timeout kills the trainer as hung."""
    return min(NO_MATCH_MAX_S, stall_timeout_s / 2)


def no_match_hint(parser: str, sample: str) -> str:
    return f"no line matched parser {parser}; sample: {sample}; set [telemetry] parser"


class ParserWatch:
    """One trainer start at a time: begin() at its spawn, end() once its main process is
    gone. on_report gets the notice (a protocol ParserNoMatch) when it is due."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        parser: str,
        after_s: float,
        on_report: Callable[[ParserNoMatch], None],
    ) -> None:
        self.loop = loop
        self.parser = parser
        self.after_s = after_s
        self.on_report = on_report
        self.open = False
        """The current start has printed no matching line yet: batches are worth a look."""
        self.notice: ParserNoMatch | None = None
        """The report while it stands (cleared by a match or the next start)."""
        self._seg = 0
        self._sample: str | None = None
        self._reported = False
        self._timer: asyncio.TimerHandle | None = None

    def begin(self, seg: int) -> None:
        self._cancel()
        self._seg = seg
        self.open = True
        self.notice = None
        self._sample = None
        self._reported = False

    def end(self) -> None:
        """The start is over: nothing more is reported for it (its notice, if any, stays
        visible until the next start)."""
        self._cancel()
        self.open = False

    def matched(self) -> None:
        """A line of this start matched the parser: nothing to report, now or later."""
        self._cancel()
        self.open = False
        self.notice = None

    def unmatched(self, lines: list[str]) -> None:
        """A batch of this start's lines of which none matched."""
        sample = next((line for line in reversed(lines) if line.strip()), None)
        if sample is None:
            return
        self._sample = sample.strip()[:SAMPLE_CHARS]
        if self._timer is None and not self._reported:
            self._timer = self.loop.call_later(self.after_s, self._due)

    def _due(self) -> None:
        self._timer = None
        if not self.open or self._reported or self._sample is None:
            return
        self._reported = True
        self.notice = {
            "parser": self.parser,
            "sample": self._sample,
            "seg": self._seg,
            "hint": no_match_hint(self.parser, self._sample),
        }
        self.on_report(self.notice)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
