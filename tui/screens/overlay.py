"""Pick another run to overlay on the loss chart: the runs the daemon lists beside this
one (its parent, its branches, its siblings), a typed path, or no overlay at all.

Dismisses with the run's path, "" for no overlay, or None when cancelled.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from trainwarden.tui.sanitize import clean

NO_OVERLAY = ""
"""The option's id (and the dismissal) that clears the overlay."""


class OverlayScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, runs: list[dict[str, Any]], current: str | None) -> None:
        super().__init__()
        self.runs = [r for r in runs if isinstance(r, dict) and isinstance(r.get("path"), str)]
        self.current = current

    def compose(self) -> ComposeResult:
        options = [
            Option(
                Text(f"{clean(str(r.get('name') or r['path']), 60)}  ({r.get('relation', '')})"),
                id=r["path"],
            )
            for r in self.runs
        ]
        if self.current is not None:
            options.insert(
                0, Option(Text(f"no overlay (now: {clean(self.current, 60)})"), NO_OVERLAY)
            )
        with Vertical(id="overlay", classes="dialog"):
            yield Static(Text("Overlay another run's loss"), classes="dialog-title", markup=False)
            if not options:
                yield Static(Text("no other run beside this one: type a path"), markup=False)
            yield OptionList(*options, id="overlay-runs")
            yield Input(placeholder="or a run directory's path, then enter", id="overlay-path")

    def on_mount(self) -> None:
        runs = self.query_one(OptionList)
        if runs.option_count:
            runs.highlighted = 0
            runs.focus()
        else:
            self.query_one(Input).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id or NO_OVERLAY)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        path = event.value.strip()
        if path:
            self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)
