"""A fast crash loop's cycles counted instead of journaled one by one.

A trainer that dies at once, restarted with no backoff and a large restart budget, goes
round spawn -> trainer_started -> crash -> restart_scheduled (and two `state` records) a
hundred times a second: about 13 MB of journal a minute. Once FOLD_AFTER crashes in a row
were the same (cause, exit, last line with its numbers taken out, last step) and none of those starts logged a step
line, the next cycles of that crash are folded: their records are counted, not written,
and a `repeated` record says how many of each kind there were, since when, and carries the
newest record of each kind. It is written when the folded cycles reach 1, 2, 4, 8, ...
(the first at once: alerts count the crashes it reports), at least every REPORT_S while the
loop goes on, and when it ends: any other
record (a halt, an operator's command, a checkpoint), a different crash, a start that logs
a step, or a record that must be durable at once.

A starting daemon reads a `repeated` record's newest `state` and `spawn` as it reads those
records (boot.last_state_record): killed during a fold it goes on from the last report,
so it may allow up to that many restarts again. The folded starts logged no step, so no
loss row carries a segment number it may number a start with again; their processes are
found at start-up by their markers (a /proc scan), not by their spawn records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

FOLD_AFTER = 5
"""Identical crashes journaled in full before the next ones are counted."""
REPORT_S = 300.0
"""While a fold goes on, a `repeated` record at least this often (on the next record)."""
FOLDED = frozenset({"spawn", "trainer_started", "state", "crash", "restart_scheduled"})
"""The kinds of a crash loop's cycle."""
SIGNATURE = ("cause", "returncode", "signal", "last_line", "last_step", "disk_full", "xid")
"""The crash record's fields that make two crashes the same crash."""
NUMBERS = re.compile(r"\d+")


def signature(fields: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two crashes the same crash. The trainer's last line counts with its
    numbers taken out: one that names its pid, a time or a port differs at every start
    and would never be folded."""
    said = {**fields, "last_line": NUMBERS.sub("#", str(fields.get("last_line")))}
    return tuple(str(said.get(key)) for key in SIGNATURE)


def state_of(record: dict[str, Any]) -> dict[str, Any] | None:
    """The daemon's state a record carries: a `state` record's, or the newest one a
    `repeated` record folded."""
    kind = record.get("kind")
    if kind == "repeated":
        last = record.get("last")
        folded = last.get("state") if isinstance(last, dict) else None
        if not isinstance(folded, dict):
            return None
        record = folded
    elif kind != "state":
        return None
    state = record.get("state")
    return state if isinstance(state, dict) else None


def spawned_seg_of(record: dict[str, Any]) -> int | None:
    """The segment of the newest start a `spawn` (or `repeated`) record journals."""
    if record.get("kind") == "repeated":
        last = record.get("last")
        folded = last.get("spawn") if isinstance(last, dict) else None
        if not isinstance(folded, dict):
            return None
        record = folded
    elif record.get("kind") != "spawn":
        return None
    seg = record.get("seg")
    return seg if isinstance(seg, int) and not isinstance(seg, bool) else None


class RepeatFold:
    """Decides, record by record, what the journal writes in a fast crash loop.

    `quiet()` says whether the start that just crashed logged no step line; `write(kind,
    fields, t)` writes a record (the journal's own, bypassing the fold)."""

    def __init__(
        self,
        quiet: Callable[[], bool],
        write: Callable[[str, dict[str, Any], float], Any],
        *,
        after: int = FOLD_AFTER,
        report_s: float = REPORT_S,
    ) -> None:
        self.quiet = quiet
        self.write = write
        self.after = after
        self.report_s = report_s
        self.same = 0
        """Crashes in a row with `sig`, of starts that logged no step line."""
        self.sig: tuple[Any, ...] | None = None
        self.folding = False
        self.cycles = 0
        """Crashes folded since the fold began."""
        self.counts: dict[str, int] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self.first_t = 0.0
        self.reported_t = 0.0
        self.next_report = 0

    def takes(self, kind: str, fields: Mapping[str, Any], t: float, durable: bool) -> bool:
        """Whether this record is folded (counted, not written). Ends the fold (writing
        its `repeated` record first) when the record is not one of a repeat's."""
        if kind not in FOLDED or (durable and kind != "spawn"):
            self.end(t)
            self.same, self.sig = 0, None
            return False
        if kind != "crash":
            if self.folding:
                self._count(kind, fields, t)
            return self.folding
        same = self.quiet() and signature(fields) == self.sig
        if self.folding and same:
            self._count(kind, fields, t)
            self.cycles += 1
            if self.cycles >= self.next_report or t - self.reported_t >= self.report_s:
                self._report(t, ongoing=True)
                self.next_report = 2 * self.next_report
            return True
        self.end(t)
        if same:
            self.same += 1
        else:
            self.same = 1 if self.quiet() else 0
            self.sig = signature(fields)
        if self.same >= self.after:
            self._begin(t)
        return False

    def end(self, t: float) -> None:
        """Write the fold's `repeated` record (if it folded anything) and stop folding."""
        if self.folding and self.counts:
            self._report(t, ongoing=False)
        self.folding = False

    def _begin(self, t: float) -> None:
        self.folding = True
        self.cycles = 0
        self.counts = {}
        self.last = {}
        self.first_t = self.reported_t = t
        self.next_report = 1

    def _count(self, kind: str, fields: Mapping[str, Any], t: float) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.last[kind] = {"t": round(t, 6), "kind": kind, **fields}

    def _report(self, t: float, *, ongoing: bool) -> None:
        self.reported_t = t
        self.write(
            "repeated",
            {
                "cycles": self.cycles,
                "counts": dict(self.counts),
                "since": round(self.first_t, 6),
                "ongoing": ongoing,
                "last": dict(self.last),
            },
            t,
        )
