"""The journal, newest first: what the daemon did and why (crash causes, restarts)."""

from __future__ import annotations

from typing import Any

import orjson
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable

from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean
from trainwarden.tui.widgets.table import Cell, sync_rows

COLUMNS = ("time", "kind", "detail")
ALARMING = {
    "crash",
    "divergence",
    "quarantine",
    "stall",
    "crash_loop",
    "resume_drift",
    "disk_low",
    "disk_full",
    "pivot_failed",
    "pivot_rolled_back",
    "checkpoint_changed",
    "verification_overdue",
    "quarantine_failed",
    "containment_failed",
    "checkpoint_dir_moved",
    "parser_no_match",
    "checkpoint_unrecognised",
}
NOTABLE = {
    "disk_recovered",
    "spawn",
    "restart_scheduled",
    "signal",
    "trainer_stopped",
    "pivot",
    "pivot_stage",
    "pivot_resumed",
    "boot_recovery",
    "leftover_trainer",
    "leftover_processes",
    "stray_output",
    "stray_checkpoint",
    "fallback",
    "stop_outcome",
    "awaiting_verification",
}
HINTED = {"parser_no_match", "checkpoint_unrecognised"}
"""Records whose one-line hint says all they hold."""
GOOD = {"checkpoint", "resume_verified", "trainer_started", "daemon_start", "disk_ok"}
SKIPPED_FIELDS = ("ts", "t", "kind", "argv")
ROUTINE = frozenset({"delete", "state"})
"""Left out of the panel: retention deletes and state snapshots would bury crashes within a
few checkpoints; `trainwarden events` lists them."""


def summary(record: dict[str, Any]) -> str:
    """The one thing to know about a record, then its other fields."""
    kind = record.get("kind")
    if kind == "crash" and record.get("cause"):
        head = f"{record['cause']}"
    elif kind in HINTED and record.get("hint"):
        return f"{record['hint']}"  # it names everything the record holds
    elif kind == "spawn":
        resume = record.get("resume") or {}
        step = resume.get("step") if isinstance(resume, dict) else None
        head = f"seg {record.get('seg')}, " + (
            f"resume from step {step}" if step is not None else "fresh start"
        )
        if record.get("pivot"):
            head += ", pivot"
        return head
    elif kind == "state" and isinstance(record.get("state"), dict):
        state = record["state"]
        head = f"{state.get('phase')}, seg {state.get('seg')}, restarts {state.get('restarts')}"
        if state.get("halt_reason"):
            head += f": {state['halt_reason']}"
        return head
    elif kind == "restart_scheduled" and "backoff_s" in record:
        head = f"in {record['backoff_s']} s"
    else:
        head = ""
    rest = " ".join(
        f"{key}={_short(value)}"
        for key, value in record.items()
        if key not in SKIPPED_FIELDS and not (kind == "crash" and key == "cause")
    )
    return f"{head} {rest}".strip()


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode(errors="replace")


def event_key(record: dict[str, Any]) -> str:
    return f"{record.get('ts')}|{record.get('t')}|{record.get('kind')}"


class EventsPanel(Vertical):
    COMPONENT_CLASSES = {"events--alarm", "events--notable", "events--good", "events--muted"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title = "events"

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="events-table", cursor_type="none", show_cursor=False)
        table.can_focus = False
        for column in COLUMNS:
            table.add_column(column if column != "time" else "UTC", key=column)
        yield table

    def show(self, model: RunModel) -> None:
        alarm = str(self.get_component_rich_style("events--alarm"))
        notable = str(self.get_component_rich_style("events--notable"))
        good = str(self.get_component_rich_style("events--good"))
        muted = str(self.get_component_rich_style("events--muted"))
        rows = {}
        for record in model.events:
            kind = str(record.get("kind", "?"))
            if kind in ROUTINE:
                continue
            style = (
                alarm
                if kind in ALARMING
                else notable
                if kind in NOTABLE
                else good
                if kind in GOOD
                else ""
            )
            ts = record.get("ts")
            clock = ts[11:19] if isinstance(ts, str) and len(ts) >= 19 else fmt.UNKNOWN
            order = record.get("t") if fmt.finite(record.get("t")) else 0.0
            rows[event_key(record)] = [
                Cell(clock, muted, order=order),
                Cell(clean(kind, 24), style),
                Cell(clean(summary(record), 240)),
            ]
        table = self.query_one(DataTable)
        if sync_rows(table, rows.items(), COLUMNS):
            table.sort("time", key=lambda cell: cell.order, reverse=True)
