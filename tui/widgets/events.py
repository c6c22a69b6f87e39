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
    "crash",
    "repeated",
    "divergence",
    "spike",
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
ALARMING |= {"gpu_fault", "gpu_throttle", "gpu_busy"}  # GPU faults by class (core.gpu_faults)
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
    "rollback",
    "spike_outlier",
    "spike_outcome",
    "stop_outcome",
    "awaiting_verification",
    "hang_dump",
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
    return " ".join(summary_pieces(record))


def summary_pieces(record: dict[str, Any]) -> list[str]:
    """The summary as the pieces it may be shortened by: the head's words, then whole
    key=value fields (a field is never split, so no number is cut in two)."""
    kind = record.get("kind")
    if kind == "crash" and record.get("cause"):
        head = f"{record['cause']}"
    elif kind in HINTED and record.get("hint"):
        return _words(f"{record['hint']}")  # it names everything the record holds
    elif kind == "spawn":
        resume = record.get("resume") or {}
        step = resume.get("step") if isinstance(resume, dict) else None
        head = f"seg {record.get('seg')}, " + (
            f"resume from step {step}" if step is not None else "fresh start"
        )
        if record.get("pivot"):
            head += ", pivot"
        return _words(head)
    elif kind == "state" and isinstance(record.get("state"), dict):
        state = record["state"]
        head = f"{state.get('phase')}, seg {state.get('seg')}, restarts {state.get('restarts')}"
        if state.get("halt_reason"):
            head += f": {state['halt_reason']}"
    elif kind == "restart_scheduled" and "backoff_s" in record:
        head = f"in {record['backoff_s']} s"
    elif kind == "spike":
        head = (
            f"loss {fmt.loss(record.get('peak'))} from step {record.get('first_step')}"
            f" to {record.get('step')}, above {fmt.loss(record.get('threshold'))}"
        )
    elif kind == "hang_dump":
        return _words(hang_dump_text(record))
    elif kind == "repeated":
        return _words(repeated_text(record))
    elif kind == "rollback":
        window = record.get("window")
        skip = f", skip {window[0]}..{window[1]}" if isinstance(window, list) else ", no skip"
        head = f"to step {record.get('step')}{skip}, lr x{record.get('lr_scale')}"
    else:
        head = ""
    rest = [
        f"{key}={_short(value)}"
        for key, value in record.items()
        if key not in SKIPPED_FIELDS and not (kind == "crash" and key == "cause")
    ]
    return [*_words(head), *rest]


def repeated_text(record: dict[str, Any]) -> str:
    """A fast crash loop's folded cycles: how many more of the same crash, and its cause."""
    last = record.get("last")
    crash = last.get("crash") if isinstance(last, dict) else None
    cause = crash.get("cause") if isinstance(crash, dict) else None
    said = (
        f", last line: {crash['last_line']}"
        if isinstance(crash, dict) and crash.get("last_line")
        else ""
    )
    going = " so far" if record.get("ongoing") else ""
    return f"{record.get('cycles')} more crashes like the last{going} ({cause or 'crash'}{said})"


def hang_dump_text(record: dict[str, Any]) -> str:
    """Where the stacks went (from the run's .trainwarden/ on) and the innermost frame, or why
    there are no Python stacks."""
    path = record.get("path")
    where = str(path) if path else "not written"
    if isinstance(path, str) and "/.trainwarden/" in path:
        where = ".trainwarden/" + path.rsplit("/.trainwarden/", 1)[1]
    frames = record.get("top_frames")
    if isinstance(frames, list) and frames:
        return f"{where} in {frames[0]}"
    return f"{where}, no Python stacks: {record.get('error') or 'none found'}"


def _words(text: str) -> list[str]:
    return [word for word in text.split(" ") if word]


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
            clock = (
                ts[11 : 11 + clock_width] if isinstance(ts, str) and len(ts) >= 19 else fmt.UNKNOWN
            )
            order = record.get("t") if fmt.finite(record.get("t")) else 0.0
            rows[event_key(record)] = [
                Cell(clock, muted, order=order),
                Cell(fmt.shorten(clean(kind, 60), kind_width), style),
                Cell(fmt.fit([clean(piece, 240) for piece in summary_pieces(record)], width)),
            ]
        table = self.query_one(DataTable)
        if sync_rows(table, rows.items(), COLUMNS):
            table.sort("time", key=lambda cell: cell.order, reverse=True)
        # A size read while the layout was still changing is checked again once it is drawn.
        self.call_after_refresh(self._refit)
