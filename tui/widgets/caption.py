"""One line under the header: the newest incident (crash, hang, divergence, halt) and what
the daemon did about it, read from the journal records the TUI already receives.

A new incident that arrives while the TUI watches is also shown as a toast; the incidents
already in the journal when the TUI connects are captioned but not toasted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from textual.widgets import Static

from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean

LEADS = frozenset({"crash", "stall", "divergence", "spike", "halt", "trainer_finished"})
"""Records that open an incident; the records after them say what the daemon did."""
FOLLOWS = frozenset({"signal", "trainer_killed", "restart_scheduled", "spawn", "halt", "rollback"})
CAUSE_CHARS = 20
"""A crash's cause is cut here: the events panel and `trainwarden events` hold all of it."""
FUNCTION_CHARS = 40
"""A hung trainer's innermost function is cut here (the dump file holds its stacks)."""
CAPTION_CHARS = 160
"""Longest caption kept; the widget cuts what its width cannot show with an ellipsis."""


@dataclass
class Incident:
    lead: dict[str, Any]
    follows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.lead.get('ts')}|{self.lead.get('kind')}"

    def last(self, kind: str) -> dict[str, Any] | None:
        return next((r for r in reversed(self.follows) if r.get("kind") == kind), None)

    @property
    def resolved(self) -> bool:
        """A new trainer started, or the run halted: the next crash is a new incident."""
        return any(r.get("kind") in ("spawn", "halt") for r in self.follows)


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
    if lead != "stall":
        return False
    # And its stacks, dumped before the kill.
    if kind == "hang_dump":
        return record.get("reason") == "hang" and incident.last("hang_dump") is None
    return kind == "crash" and incident.last("crash") is None


def _step(value: Any) -> str:
    return fmt.integer(value) if fmt.finite(value) else fmt.UNKNOWN


def _cause(record: dict[str, Any]) -> str:
    cause = str(record.get("cause") or "")
    if cause.startswith("exit status "):
        cause = "exit " + cause.removeprefix("exit status ")
    elif not cause and record.get("returncode") is not None:
        cause = f"exit {record['returncode']}"
    # Whole words, as the events panel fits its details: a number is never cut short.
    return fmt.fit(cause.split(), CAUSE_CHARS) if cause else "no cause recorded"


def what_happened(incident: Incident) -> str:
    lead = incident.lead
    kind = lead.get("kind")
    if kind == "crash":
        return f"trainer crashed at step {_step(lead.get('last_step'))} ({_cause(lead)})"
    if kind == "stall":
        return f"trainer hung at step {_step(lead.get('last_step'))}"
    if kind == "divergence":
        return f"loss {fmt.loss(lead.get('loss'))} at step {_step(lead.get('step'))}"
    if kind == "spike":
        return f"loss spike at step {_step(lead.get('first_step'))} ({lead.get('factor', '?')}x average)"
    if kind == "trainer_finished":
        return f"trainer finished at step {_step(lead.get('last_step'))}"
    return f"run halted ({lead.get('state') or 'halt'})"


def details(incident: Incident) -> str:
    """What the caption adds after what the daemon did (cut first on a narrow terminal): where
    a hung trainer was stuck, from its stack dump (the events panel has the path); a spike's
    peak."""
    lead = incident.lead
    if lead.get("kind") == "spike":
        return f"; peak {fmt.loss(lead.get('peak'))}"
    dump = incident.last("hang_dump") if lead.get("kind") == "stall" else None
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


def what_the_daemon_did(incident: Incident) -> str:
    lead = incident.lead.get("kind")
    halt = incident.last("halt") if lead != "halt" else incident.lead
    if halt is not None:
        return f"daemon halted the run ({halt.get('state') or 'halt'}); r starts it again"
    if lead == "trainer_finished":
        return "the run is done"
    spawn = incident.last("spawn")
    killed = "killed it, " if lead in ("stall", "divergence", "spike") else ""
    if lead == "spike":
        return _rolled_back(incident)
    if spawn is not None:
        resume = spawn.get("resume")
        step = resume.get("step") if isinstance(resume, dict) else None
        where = f"from step {_step(step)}" if step is not None else "from scratch"
        if lead == "divergence":
            return f"daemon killed the trainer, rolled back to step {_step(step)}"
        return f"daemon {killed}restarted it {where}"
    scheduled = incident.last("restart_scheduled")
    if scheduled is not None:
        step = scheduled.get("resume_step")
        where = f" from step {_step(step)}" if step is not None else ""
        return f"daemon {killed}restarts it in {scheduled.get('backoff_s', '?')} s{where}"
    if lead == "crash":
        return "daemon is deciding"
    return "daemon is stopping the trainer"


def _rolled_back(incident: Incident) -> str:
    """What the daemon did about a spike: the rollback, the data it skips, the restart."""
    rollback = incident.last("rollback")
    if rollback is None:
        return "daemon is stopping the trainer"
    window = rollback.get("window")
    skip = (
        f", skipping the data of steps {_step(window[0])}-{_step(window[1] - 1)}"
        if isinstance(window, list) and len(window) == 2 and fmt.finite(window[1])
        else ", no data skipped"
    )
    started = " and restarted it" if incident.last("spawn") is not None else ""
    return f"daemon rolled back to step {_step(rollback.get('step'))}{skip}{started}"


def caption_text(records: Iterable[dict[str, Any]]) -> tuple[str, str] | None:
    """(incident key, caption) for the newest incident, or None when there is none."""
    incident = newest_incident(records)
    if incident is None:
        return None
    text = f"{what_happened(incident)}; {what_the_daemon_did(incident)}{details(incident)}"
    return incident.key, clean(text, CAPTION_CHARS)


class IncidentCaption(Static):
    """Hidden until the journal holds an incident."""

    DEFAULT_CSS = """
    IncidentCaption {
        height: 1; padding: 0 1; color: $warning; text-style: bold;
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

    def show(self, model: RunModel) -> None:
        if not model.events:
            return  # connecting: the journal snapshot has not come yet
        found = caption_text(model.events)
        key, text = found if found is not None else (None, None)
        if self.primed and key is not None and key != self.key:
            self.app.notify(text or "", severity="warning", timeout=8, markup=False)
        self.primed = True
        if text == self.text:
            return
        self.key, self.text = key, text
        self.display = text is not None
        self.update(Text(text or ""))
