"""The journal, newest first: what the daemon did and why (crash causes, restarts).

The newest incident keeps the top row until a newer incident takes it: at 80x24 the panel
has two rows, and the restart and checkpoints that follow a crash would push it out within
seconds. Runs of routine records (checkpoints and their retention deletes) fold into one
row."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable

from trainwarden.supervisor.journal_text import LEFT_OUT, summary_pieces
from trainwarden.supervisor.protocol import Kind
from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean
from trainwarden.tui.widgets.table import Cell, sync_rows

COLUMNS = ("time", "kind", "detail")
KIND_WIDTH = (10, 16)
"""Cells of the kind column, the least and the most: a quarter of the panel between them.
A longer kind (leftover_trainer_stopped) is shortened with "…" rather than widening the
column and pushing the detail off the screen."""
NARROW = 48
"""Below this many cells the clock drops its seconds, which the detail needs more."""
CELL_PADDING = 2
"""DataTable pads each cell by one cell on either side."""
DETAIL_MIN = 8
ALARMING = {
    Kind.CRASH,
    Kind.REPEATED,
    Kind.DIVERGENCE,
    Kind.SPIKE,
    Kind.QUARANTINE,
    Kind.STALL,
    Kind.RESUME_DRIFT,
    Kind.DISK_LOW,
    Kind.DISK_FULL,
    Kind.PIVOT_FAILED,
    Kind.PIVOT_ROLLED_BACK,
    Kind.CHECKPOINT_CHANGED,
    Kind.VERIFICATION_OVERDUE,
    Kind.QUARANTINE_FAILED,
    Kind.CONTAINMENT_FAILED,
    Kind.CHECKPOINT_DIR_MOVED,
    Kind.PARSER_NO_MATCH,
    Kind.CHECKPOINT_UNRECOGNISED,
}
# GPU faults by class (core.gpu_faults)
ALARMING |= {Kind.GPU_FAULT, Kind.GPU_THROTTLE, Kind.GPU_BUSY}
NOTABLE = {
    Kind.DISK_RECOVERED,
    Kind.SPAWN,
    Kind.RESTART_SCHEDULED,
    Kind.SIGNAL,
    Kind.TRAINER_STOPPED,
    Kind.PIVOT,
    Kind.PIVOT_STAGE,
    Kind.PIVOT_RESUMED,
    Kind.BOOT_RECOVERY,
    Kind.LEFTOVER_TRAINER,
    Kind.LEFTOVER_PROCESSES,
    Kind.STRAY_OUTPUT,
    Kind.STRAY_CHECKPOINT,
    Kind.FALLBACK,
    Kind.ROLLBACK,
    Kind.SPIKE_OUTLIER,
    Kind.SPIKE_OUTCOME,
    Kind.STOP_OUTCOME,
    Kind.AWAITING_VERIFICATION,
    Kind.HANG_DUMP,
}
GOOD = {
    Kind.CHECKPOINT,
    Kind.RESUME_VERIFIED,
    Kind.TRAINER_STARTED,
    Kind.DAEMON_START,
    Kind.DISK_OK,
}
ROUTINE = frozenset({Kind.CHECKPOINT, Kind.DELETE})
"""A run of these, one after another, is one row: the newest checkpoint and how many."""
INCIDENTS = frozenset(
    {Kind.CRASH, Kind.REPEATED, Kind.DIVERGENCE, Kind.STALL, Kind.SPIKE, Kind.GPU_FAULT, Kind.HALT}
)
"""Records that keep the top row until a newer one of them comes (`repeated`: a fast crash
loop's folded crashes)."""
PINNED = float("inf")
"""The sort order of the newest incident's row: first, whatever came after it."""


def newest_incident(records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in reversed(list(records)) if r.get("kind") in INCIDENTS), None)


def folded(records: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records as the panel's rows, oldest first: each a list of the records it stands
    for (one, or a run of routine ones, newest last). A run's row is its newest checkpoint's
    (a run of deletes alone is a row of its own kind)."""
    rows: list[list[dict[str, Any]]] = []
    run: list[dict[str, Any]] = []
    for record in records:
        kind = record.get("kind")
        if kind in LEFT_OUT:  # state snapshots (`trainwarden events --kind state`)
            continue
        if kind in ROUTINE:
            run.append(record)
            continue
        if run:
            rows.append(_run_row(run))
            run = []
        rows.append([record])
    if run:
        rows.append(_run_row(run))
    return rows


def _run_row(run: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A routine run with the record that names its row last: the newest checkpoint."""
    newest = next((r for r in reversed(run) if r.get("kind") == Kind.CHECKPOINT), run[-1])
    return [r for r in run if r is not newest] + [newest]


def routine_pieces(records: list[dict[str, Any]]) -> list[str]:
    """One row for a run of checkpoints and deletes: the newest checkpoint, then counts."""
    newest = records[-1]
    saved = sum(1 for r in records if r.get("kind") == Kind.CHECKPOINT)
    deleted = sum(1 for r in records if r.get("kind") == Kind.DELETE)
    told = [f"{saved} saved"] if saved > 1 else []
    if deleted:
        told.append(f"{deleted} deleted")
    counts = f"({', '.join(told)})".split() if told else []
    if newest.get("kind") != Kind.CHECKPOINT:
        return counts
    step = newest.get("step")
    head = [f"step={step}"] if step is not None else []
    return [*head, *counts, *summary_pieces(newest)[len(head) :]]


def event_key(record: dict[str, Any]) -> str:
    return f"{record.get('ts')}|{record.get('t')}|{record.get('kind')}"


class EventsPanel(Vertical):
    COMPONENT_CLASSES = {"events--alarm", "events--notable", "events--good", "events--muted"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title = "events"
        self.model: RunModel | None = None
        self.shown_widths = (0, 0, 0)

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="events-table", cursor_type="none", show_cursor=False)
        table.can_focus = False
        for column in COLUMNS:
            table.add_column(column if column != "time" else "UTC", key=column)
        yield table

    def on_resize(self) -> None:
        self._refit()

    def _refit(self) -> None:
        """The rows were fitted to another width (an older size, or one read before the
        layout settled): fit them again."""
        if self.model is not None and self.column_widths() != self.shown_widths:
            self.show(self.model)

    def column_widths(self) -> tuple[int, int, int]:
        """Cells for the time, the kind and the detail, beside padding and the scroll bar."""
        table = self.query_one(DataTable)
        width = self.content_region.width
        clock = 5 if width < NARROW else 8
        kind = min(max(width // 4, KIND_WIDTH[0]), KIND_WIDTH[1])
        used = clock + kind + 3 * CELL_PADDING + table.styles.scrollbar_size_vertical
        return clock, kind, max(width - used, DETAIL_MIN)

    def show(self, model: RunModel) -> None:
        self.model = model
        self.shown_widths = clock_width, kind_width, width = self.column_widths()
        alarm = str(self.get_component_rich_style("events--alarm"))
        notable = str(self.get_component_rich_style("events--notable"))
        good = str(self.get_component_rich_style("events--good"))
        muted = str(self.get_component_rich_style("events--muted"))
        rows = {}
        incident = newest_incident(model.events)
        for records in folded(model.events):
            record = records[-1]
            kind = str(record.get("kind", "?"))
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
            clock = (
                ts[11 : 11 + clock_width] if isinstance(ts, str) and len(ts) >= 19 else fmt.UNKNOWN
            )
            order = record.get("t") if fmt.finite(record.get("t")) else 0.0
            key = event_key(record)
            if record is incident:
                # Its own key while pinned, so that unpinning re-sorts it by its time.
                order, key = PINNED, f"{key}|pinned"
            pieces = summary_pieces(record) if len(records) == 1 else routine_pieces(records)
            rows[key] = [
                Cell(clock, muted, order=order),
                Cell(fmt.shorten(clean(kind, 60), kind_width), style),
                Cell(fmt.fit([clean(piece, 240) for piece in pieces], width)),
            ]
        table = self.query_one(DataTable)
        if sync_rows(table, rows.items(), COLUMNS):
            table.sort("time", key=lambda cell: cell.order, reverse=True)
        # A size read while the layout was still changing is checked again once it is drawn.
        self.call_after_refresh(self._refit)
