"""The main screen: header, six panels, key bar. Sized for 80x24, roomier from 120x36 up."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Horizontal
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from trainwarden.tui.widgets.bandit import BanditPanel
from trainwarden.tui.widgets.caption import IncidentCaption
from trainwarden.tui.widgets.checkpoints import CheckpointsPanel
from trainwarden.tui.widgets.events import EventsPanel
from trainwarden.tui.widgets.gpu import GpuPanel
from trainwarden.tui.widgets.header import RunHeader
from trainwarden.tui.widgets.loss_chart import LossChart
from trainwarden.tui.widgets.telemetry import TelemetryPanel

ACTING = (
    ("s", "save", "save"),
    ("x", "stop", "stop"),
    ("r", "start", "start"),
    ("p", "pivot", "pivot"),  # not a kind: the action and its label
    ("P", "pin", "pin"),
)


def acting_bindings(show: bool) -> list[BindingType]:
    return [Binding(key, f"app.{action}", label, show=show) for key, action, label in ACTING]


NARROW_COLUMNS = 80
"""Below this width the panels stack and the lesser ones (bandit, gpu, chart) hide."""
HIDDEN_WHEN_NARROW = ("l", "ctrl+p")
"""Keys the key bar leaves out below NARROW_COLUMNS (help and the palette list them)."""


class KeyBar(Footer):
    """The footer, compact on small screens so every key it shows stays readable."""

    composed_narrow: bool | None = None

    def compose(self) -> ComposeResult:
        narrow = self.composed_narrow = self.app.size.width < NARROW_COLUMNS
        for widget in super().compose():
            if narrow and isinstance(widget, FooterKey) and widget.key in HIDDEN_WHEN_NARROW:
                continue
            yield widget

    def on_resize(self, event: Resize) -> None:
        # The keys it leaves out depend on the width: compose again when that crosses over.
        if (self.app.size.width < NARROW_COLUMNS) != self.composed_narrow:
            self.call_later(self.recompose)


class MainScreen(Screen[None]):
    HORIZONTAL_BREAKPOINTS = [(0, "-compact"), (NARROW_COLUMNS, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]
    BINDINGS: ClassVar[list[BindingType]] = [
        *acting_bindings(show=True),
        Binding("m", "app.samples", "samples"),
        Binding("c", "app.chart_range", "chart", show=False),
        Binding("y", "app.chart_scale", "log scale", show=False),
        Binding("o", "app.overlay", "overlay", show=False),
        Binding("l", "app.log", "log"),
        Binding("question_mark", "app.help", "help", key_display="?"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(self, read_only: bool = False) -> None:
        super().__init__(id="main")
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        yield RunHeader(read_only=self.read_only, id="header")
        yield IncidentCaption(id="caption")
        with Container(id="body"):
            with Horizontal(id="row-top", classes="row"):
                yield TelemetryPanel(id="telemetry", classes="panel left")
                yield LossChart(id="chart", classes="panel right")
            with Horizontal(id="row-middle", classes="row"):
                yield CheckpointsPanel(id="checkpoints", classes="panel left")
                yield BanditPanel(id="bandit", classes="panel right")
            with Horizontal(id="row-bottom", classes="row"):
                yield GpuPanel(id="gpu", classes="panel left")
                yield EventsPanel(id="events", classes="panel right")
        yield KeyBar(compact=True)

    def on_mount(self) -> None:
        self.query_one("#checkpoint-table").focus()

    def on_screen_resume(self) -> None:
        # Panels do not redraw under a modal; catch up as soon as it closes.
        self.app.call_after_refresh(self.app.request_render)  # type: ignore[attr-defined]


class ReadOnlyMainScreen(MainScreen):
    """Same screen; the acting keys stay bound (to say they are refused) but are not shown."""

    BINDINGS: ClassVar[list[BindingType]] = acting_bindings(show=False)
