"""Verified checkpoints, newest first, with retention's next victim; quarantined ones apart,
each with its reason (a pivot's set-aside checkpoints calm, a failure in the alarm style)."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.coordinate import Coordinate
from textual.widgets import DataTable, Static

from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean
from trainwarden.tui.widgets.table import Cell, sync_rows

COLUMNS = ("step", "size", "age", "flags")


def checkpoint_name(names: list[str]) -> str:
    """The name that stands for a checkpoint's files: the checkpoint's, not its sidecar's."""
    return next((n for n in sorted(names) if not n.endswith(".json")), sorted(names)[0])


def short_head(entry: dict[str, Any], count: int) -> str | None:
    """A set-aside line's head in fewer cells, from the view's own fields (what set it aside
    and at which step), its count and step whole: "set aside (2, rollback at 2,450):";
    None for a cause without a short form."""
    cause = entry.get("cause")
    if cause not in SHORT_CAUSES:
        return None
    at = entry.get("cause_step")
    return f"set aside ({count}, {cause}{f' at {fmt.integer(at)}' if fmt.finite(at) else ''}):"


SHORT_CAUSES = frozenset({"pivot", "rollback"})  # not a kind: quarantine causes
"""The calm causes of a set-aside (store.quarantine), said in one word when room is short."""


class CheckpointsPanel(Vertical):
    COMPONENT_CLASSES = {
        "checkpoints--pinned",
        "checkpoints--doomed",
        "checkpoints--muted",
        "checkpoints--bad",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title = "checkpoints"
        self.quarantined: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(
            id="checkpoint-table",
            cursor_type="row",
            zebra_stripes=False,
            show_cursor=True,
        )
        for column in COLUMNS:
            table.add_column(column, key=column)
        yield table
        yield Static("", id="quarantined", markup=False)

    @property
    def table(self) -> DataTable[Any]:
        return self.query_one("#checkpoint-table", DataTable)

    def selected_key(self) -> str | None:
        table = self.table
        if not table.row_count or not table.is_valid_row_index(table.cursor_row):
            return None
        return table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value

    def selected_checkpoint(self, model: RunModel) -> dict[str, Any] | None:
        row_key = self.selected_key()
        if row_key is None:
            return None
        for ckpt in (model.checkpoints or {}).get("checkpoints") or []:
            if isinstance(ckpt, dict) and str(ckpt.get("step")) == row_key:
                return ckpt
        return None

    def show(self, model: RunModel) -> None:
        data = model.checkpoints or {}
        now = model.clock.time()
        pinned = self.get_component_rich_style("checkpoints--pinned")
        doomed = self.get_component_rich_style("checkpoints--doomed")
        muted = self.get_component_rich_style("checkpoints--muted")
        rows = []
        for ckpt in data.get("checkpoints") or []:
            if not isinstance(ckpt, dict) or not isinstance(ckpt.get("step"), int):
                continue
            step = ckpt["step"]
            mtime = ckpt.get("mtime")
            age = fmt.duration(now - mtime) if fmt.finite(mtime) else fmt.UNKNOWN
            flags = []
            if ckpt.get("verified"):
                flags.append("✓")
            if ckpt.get("pinned"):
                flags.append("pinned")
            if ckpt.get("next_to_delete"):
                flags.append("next del")
            style = pinned if ckpt.get("pinned") else doomed if ckpt.get("next_to_delete") else ""
            rows.append(
                (
                    str(step),
                    [
                        Cell(
                            fmt.integer(step),
                            str(style),
                            order=(bool(ckpt.get("verified", True)), step),
                        ),
                        Cell(fmt.size(ckpt.get("bytes")), str(muted)),
                        Cell(age, str(muted)),
                        Cell(" ".join(flags), str(style)),
                    ],
                )
            )
        table = self.table
        selected = self.selected_key()
        if sync_rows(table, rows, COLUMNS):
            # Verified before unverified, then newest first: the fixed top row is the newest
            # verified checkpoint.
            table.sort("step", key=lambda cell: cell.order, reverse=True)
            # The newest never scrolls away: a cursor moved down to an old checkpoint (to
            # pin it) must not hide the one a restart would use. (Only with a row: an
            # empty table with a fixed row fails to draw.)
            table.fixed_rows = 1 if table.row_count else 0
            # Keep the cursor on the checkpoint it was on, not on the row number.
            if selected is not None and selected in table.rows:
                table.move_cursor(row=table.get_row_index(selected), animate=False)
        quarantined = [q for q in data.get("quarantined") or [] if isinstance(q, dict)]
        box = self.query_one("#quarantined", Static)
        box.display = bool(quarantined)
        self.quarantined = quarantined
        if quarantined:
            box.update(self.quarantine_text(quarantined))

    def on_resize(self) -> None:
        # The quarantine lines are fitted to the width: fit them again to the new one.
        if self.quarantined:
            box = self.query_one("#quarantined", Static)
            box.update(self.quarantine_text(self.quarantined))

    def quarantine_text(self, quarantined: list[dict[str, Any]]) -> Text:
        """One line for the alarms (a failed verification, a rollback), each with its
        reason; one calm line per pivot for what it set aside. Fitted by whole words, so
        no step number is cut short."""
        bad = str(self.get_component_rich_style("checkpoints--bad"))
        muted = str(self.get_component_rich_style("checkpoints--muted"))
        box = self.query_one("#quarantined", Static)
        # A box shown for the first time has no width yet: take the panel's, less the
        # box's own padding.
        width = box.content_region.width or self.content_region.width - 2
        width = max(width, 20)
        alarms = [q for q in quarantined if q.get("alarming", True) is not False]
        calm: dict[str, dict[Any, list[str]]] = {}
        first: dict[str, dict[str, Any]] = {}
        for q in quarantined:
            if q.get("alarming", True) is False:
                # Grouped by the view's reason in words (the CLI prints the same), and
                # counted per checkpoint: a checkpoint and its sidecar are one.
                why = clean(q.get("why") or "set aside", 160)
                step = q.get("step") if fmt.finite(q.get("step")) else q.get("name")
                calm.setdefault(why, {}).setdefault(step, []).append(clean(q.get("name"), 60))
                first.setdefault(why, q)
        lines = []
        if alarms:
            head = f"quarantined ({len(alarms)}):"
            told = "; ".join(
                clean(q.get("name"), 60) + (f": {clean(q['why'], 160)}" if q.get("why") else "")
                for q in alarms
            )
            pieces = told.split()
            body = fmt.fit(pieces, max(width - cell_len(head) - 1, 1))
            lines.append(Text.assemble((head, bad), " ", (body, muted), no_wrap=True))
        for why, files in calm.items():
            names = [checkpoint_name(group) for group in files.values()]
            head = f"{why} ({len(names)}):"
            short = short_head(first[why], len(names))
            if short is not None and cell_len(head) + 1 + cell_len(names[0]) > width:
                head = short
            pieces = [*head.split(), *[f"{n}," for n in names[:-1]], names[-1]]
            lines.append(Text(fmt.fit(pieces, width), muted, no_wrap=True))
        return Text("\n", no_wrap=True).join(lines)
