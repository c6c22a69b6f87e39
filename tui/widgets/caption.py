"""Under the header: the newest incident (crash, hang, divergence, halt) and what the daemon
did about it, read from the journal records the TUI already receives. One line when it
fits; otherwise what happened on one line and what the daemon did on the next, so the
action is never the part that is cut.

A new incident that arrives while the TUI watches is also shown as a toast; the incidents
already in the journal when the TUI connects are captioned but not toasted.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from trainwarden.supervisor.protocol import Kind
from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean

LEADS = frozenset(
    {Kind.CRASH, Kind.STALL, Kind.DIVERGENCE, Kind.SPIKE, Kind.HALT, Kind.TRAINER_FINISHED}
)
"""Records that open an incident; the records after them say what the daemon did."""
FOLLOWS = frozenset(
    {
        Kind.SIGNAL,
        Kind.TRAINER_KILLED,
        Kind.RESTART_SCHEDULED,
        Kind.SPAWN,
        Kind.HALT,
        Kind.ROLLBACK,
    }
)
CAUSE_CHARS = 20
"""A crash's cause is cut here: the events panel and `trainwarden events` hold all of it."""
BRIEF_CAUSE_CHARS = 10
"""The cause cut shorter still when that keeps the caption on one line."""
FUNCTION_CHARS = 40
"""A hung trainer's innermost function is cut here (the dump file holds its stacks)."""
CAPTION_CHARS = 160
"""Longest caption kept; the widget cuts what its width cannot show with an ellipsis."""
LAST_LINE_CHARS = 120
"""The trainer's last output line, quoted when it crashed before its first step."""
MAX_LINES = 3
"""At most this many rows: the third only for a crash before any step, whose last output
line is the cause."""


@dataclass
class Incident:
    lead: dict[str, Any]
    follows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.lead.get('ts')}|{self.lead.get('kind')}"

    def last(self, kind: Kind) -> dict[str, Any] | None:
        return next((r for r in reversed(self.follows) if r.get("kind") == kind), None)

    @property
    def resolved(self) -> bool:
        """A new trainer started, or the run halted: the next crash is a new incident."""
        return any(r.get("kind") in (Kind.SPAWN, Kind.HALT) for r in self.follows)


def newest_incident(records: Iterable[dict[str, Any]]) -> Incident | None:
    """The newest incident in journal order (oldest record first), with what followed it."""
    current: Incident | None = None
    for record in records:
        kind = record.get("kind")
        if current is not None and not current.resolved and _continues(current, record):
            current.follows.append(record)
        elif kind in LEADS:
            current = Incident(record)
        elif current is not None and not current.resolved and kind in FOLLOWS:
            current.follows.append(record)
    return current


def _continues(incident: Incident, record: dict[str, Any]) -> bool:
    kind = record.get("kind")
    if kind in FOLLOWS:
        return True
    # A hang ends in the exit record of the trainer the daemon killed for it.
    lead = incident.lead.get("kind")
    if lead != Kind.STALL:
        return False
    # And its stacks, dumped before the kill.
    if kind == Kind.HANG_DUMP:
        return record.get("reason") == "hang" and incident.last(Kind.HANG_DUMP) is None
    return kind == Kind.CRASH and incident.last(Kind.CRASH) is None


def _cause(record: dict[str, Any], chars: int = CAUSE_CHARS) -> str:
    cause = str(record.get("cause") or "")
    if cause.startswith("exit status "):
        cause = "exit " + cause.removeprefix("exit status ")
    elif not cause and record.get("returncode") is not None:
        cause = f"exit {record['returncode']}"
    # Whole words, as the events panel fits its details: a number is never cut short.
    return fmt.fit(cause.split(), chars) if cause else "no cause recorded"


def last_output(incident: Incident) -> str | None:
    """The trainer's last output line when it crashed before logging any step: then it is
    the only account of the cause (a missing module, a bad flag)."""
    lead = incident.lead
    if lead.get("kind") != Kind.CRASH or fmt.finite(lead.get("last_step")):
        return None
    line = lead.get("last_line")
    return clean(line, LAST_LINE_CHARS) if isinstance(line, str) and line.strip() else None


def what_happened(incident: Incident, cause_chars: int = CAUSE_CHARS) -> str:
    lead = incident.lead
    kind = lead.get("kind")
    if kind == Kind.CRASH:
        if not fmt.finite(lead.get("last_step")):
            return f"trainer crashed before any step ({_cause(lead, cause_chars)})"
        cause = _cause(lead, cause_chars)
        return f"trainer crashed at step {fmt.integer(lead.get('last_step'))} ({cause})"
    if kind == Kind.STALL:
        return f"trainer hung at step {fmt.integer(lead.get('last_step'))}"
    if kind == Kind.DIVERGENCE:
        return f"loss {fmt.loss(lead.get('loss'))} at step {fmt.integer(lead.get('step'))}"
    if kind == Kind.SPIKE:
        return f"loss spike at step {fmt.integer(lead.get('first_step'))} ({lead.get('factor', '?')}x average)"
    if kind == Kind.TRAINER_FINISHED:
        return f"trainer finished at step {fmt.integer(lead.get('last_step'))}"
    return f"run halted ({lead.get('state') or 'halt'})"


def details(incident: Incident) -> str:
    """What the caption adds after what the daemon did (cut first on a narrow terminal): where
    a hung trainer was stuck, from its stack dump (the events panel has the path); a spike's
    peak."""
    lead = incident.lead
    if lead.get("kind") == Kind.SPIKE:
        return f"; peak {fmt.loss(lead.get('peak'))}"
    dump = incident.last(Kind.HANG_DUMP) if lead.get("kind") == Kind.STALL else None
    if dump is None:
        return ""
    frames = dump.get("top_frames")
    if isinstance(frames, list) and frames and isinstance(frames[0], str):
        function = frames[0].split(" (", 1)[0]
        if len(function) > FUNCTION_CHARS:
            function = function[: FUNCTION_CHARS - 1] + "…"
        return f"; stacks dumped: in {function}"
    if dump.get("path"):
        return "; kernel stacks dumped, no Python stacks"
    return "; no stacks dumped"


def what_the_daemon_did(incident: Incident, short: bool = False) -> str:
    """The action, in words; `short`: the same facts in fewer cells, for narrow screens."""
    lead = incident.lead.get("kind")
    halt = incident.last(Kind.HALT) if lead != Kind.HALT else incident.lead
    if halt is not None:
        state = halt.get("state") or "halt"
        if short:
            return f"daemon halted the run ({state}); r restarts"
        return f"daemon halted the run ({state}); r starts it again"
    if lead == Kind.TRAINER_FINISHED:
        return "the run is done"
    spawn = incident.last(Kind.SPAWN)
    killed = "killed it, " if lead in (Kind.STALL, Kind.DIVERGENCE, Kind.SPIKE) else ""
    if lead == Kind.SPIKE:
        return _rolled_back(incident, short)
    if spawn is not None:
        resume = spawn.get("resume")
        step = resume.get("step") if isinstance(resume, dict) else None
        where = f"from step {fmt.integer(step)}" if step is not None else "from scratch"
        if lead == Kind.DIVERGENCE:
            if short:
                return f"daemon killed it, rolled back to step {fmt.integer(step)}"
            return f"daemon killed the trainer, rolled back to step {fmt.integer(step)}"
        return f"daemon {killed}restarted it {where}"
    scheduled = incident.last(Kind.RESTART_SCHEDULED)
    if scheduled is not None:
        # No seconds here: the header's badge counts the backoff down, and one countdown
        # that moves beats two that disagree.
        step = scheduled.get("resume_step")
        where = f" from step {fmt.integer(step)}" if step is not None else ""
        return f"daemon {killed}will restart it{where}"
    if lead == Kind.CRASH:
        return "daemon is deciding"
    return "daemon is stopping the trainer"


def _rolled_back(incident: Incident, short: bool = False) -> str:
    """What the daemon did about a spike: the rollback, the data it skips, the restart."""
    rollback = incident.last(Kind.ROLLBACK)
    if rollback is None:
        return "daemon is stopping the trainer"
    found = rollback.get("window")
    skipped = isinstance(found, list) and len(found) == 2 and fmt.finite(found[1])
    window: list[Any] = found if isinstance(found, list) and skipped else [None, 1]
    started = incident.last(Kind.SPAWN) is not None
    to = fmt.integer(rollback.get("step"))
    if short:
        skip = (
            f", skips {fmt.integer(window[0])}-{fmt.integer(window[1] - 1)}"
            if skipped
            else ", no skip"
        )
        return f"daemon rolled back to {to}{skip}{', restarted' if started else ''}"
    skip = (
        f", skipping the data of steps {fmt.integer(window[0])}-{fmt.integer(window[1] - 1)}"
        if skipped
        else ", no data skipped"
    )
    return f"daemon rolled back to step {to}{skip}{' and restarted it' if started else ''}"


def caption_text(records: Iterable[dict[str, Any]]) -> tuple[str, str] | None:
    """(incident key, caption in one line) for the newest incident, or None when there is
    none. The toast says this; the widget lays it out for its width (caption_lines)."""
    incident = newest_incident(records)
    if incident is None:
        return None
    said = last_output(incident)
    happened = what_happened(incident) + (f": {said}" if said else "")
    text = f"{happened}; {what_the_daemon_did(incident)}{details(incident)}"
    return incident.key, clean(text, CAPTION_CHARS)


def caption_lines(incident: Incident, width: int) -> list[str]:
    """The caption in rows of at most `width` cells: the first layout whose every row fits,
    trying the full wording before the short one; what the daemon did always has a row of
    its own before anything else is cut."""
    width = max(width, 20)
    happened = clean(what_happened(incident), CAPTION_CHARS)
    brief = clean(what_happened(incident, BRIEF_CAUSE_CHARS), CAPTION_CHARS)
    extra = clean(details(incident), CAPTION_CHARS)
    said = last_output(incident)
    actions = [
        clean(what_the_daemon_did(incident, short), CAPTION_CHARS) for short in (False, True)
    ]
    layouts: list[list[str]] = []
    for action in actions:
        if said:
            quoted = f"last output: {said}"
            layouts += [
                [f"{happened}: {said}; {action}"],
                [f"{happened}: {said}", action],
                [f"{happened}; {action}", quoted],
            ]
        else:
            layouts += [[f"{happened}; {action}{extra}"], [f"{brief}; {action}"]]
            layouts += [[f"{happened}{extra}", action]]
    for action in actions:
        layouts.append([happened, action])
    for lines in layouts:
        if all(cell_len(line) <= width for line in lines):
            return lines
    # Nothing fits whole: the short action still gets its rows, cut by whole words.
    action = actions[-1]
    rows = [fmt.shorten(happened, width)]
    if said:
        rows.append(fmt.shorten(f"last output: {said}", width))
    wrapped = textwrap.wrap(action, width, break_long_words=False, break_on_hyphens=False)
    rows += [fmt.shorten(row, width) for row in wrapped]
    return rows[:MAX_LINES]


class IncidentCaption(Static):
    """Hidden until the journal holds an incident."""

    DEFAULT_CSS = """
    IncidentCaption {
        height: auto; max-height: 3; padding: 0 1; color: $warning; text-style: bold;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", markup=False, **kwargs)
        self.display = False
        self.primed = False
        """The journal snapshot has been seen: incidents from now on are news."""
        self.key: str | None = None
        self.text: str | None = None
        """The caption in one line (as the toast says it)."""
        self.incident: Incident | None = None
        self.lines: list[str] = []
        """The rows on screen, fitted to the width."""

    def show(self, model: RunModel) -> None:
        if not model.events:
            return  # connecting: the journal snapshot has not come yet
        incident = newest_incident(model.events)
        found = caption_text(model.events)
        key, text = found if found is not None else (None, None)
        if self.primed and key is not None and key != self.key:
            self.app.notify(
                toast_text(incident) if incident else text or "",
                severity="warning",
                timeout=8,
                markup=False,
            )
        self.primed = True
        self.incident = incident
        if text == self.text and self.lines:
            self._fit()
            return
        self.key, self.text = key, text
        self.display = text is not None
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """Lay the caption out for the current width (the screen's, before the first
        layout has given this widget one)."""
        if self.incident is None or self.text is None:
            if self.lines:
                self.lines = []
                self.update("")
            return
        width = self.content_size.width or self.app.size.width - 2  # less the padding
        lines = caption_lines(self.incident, width)
        if lines != self.lines:
            self.lines = lines
            self.update(Text("\n".join(lines), no_wrap=True, overflow="ellipsis"))


TOAST_CHARS = 36
"""A toast is one line of the toast's width (docs/tui.md): the caption holds the rest."""


def toast_text(incident: Incident) -> str:
    """The news in one toast line: what happened (the caption beside it says the rest)."""
    return fmt.shorten(clean(what_happened(incident), CAPTION_CHARS), TOAST_CHARS)
