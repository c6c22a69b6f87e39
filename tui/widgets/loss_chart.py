"""The loss curve, one history bucket per braille dot column, over the range and scale
the operator picked (the whole run by default)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.style import Style
from rich.text import Text
from textual.events import Click, Resize
from textual.widget import Widget

from trainwarden.supervisor.protocol import MARKER_KINDS, MarkerKind
from trainwarden.tui.chart import (
    OVERLAY_GLYPH,
    OVERLAY_VALIDATION_GLYPH,
    SPIKE_LEGEND,
    ChartMode,
    ChartStyles,
    dot_columns,
    has_spike_markers,
    newest_step,
    render_chart,
    validation_points,
)

LEGEND = "R restart  C crash  D divergence  P pivot"
SHORT_LABELS = {MarkerKind.DIVERGENCE: "div", "validation": "val"}
"""Labels that have a shorter form, used when the legend does not fit the border."""
BORDER_CELLS = 6
"""The border's corners, the spaces around its subtitle and the rule before it."""


def legend_text(entries: list[str], prefix: str, width: int) -> str:
    """The legend in `width` cells: `entries` ("R restart", ...) two spaces apart, then one,
    then with short labels, then the marks alone (the help explains them), so that it is
    never cut mid-word."""
    short = [" ".join(SHORT_LABELS.get(w, w) for w in e.split(" ")) for e in entries]
    marks = [e.split(" ", 1)[0] for e in entries]
    candidates = [
        prefix + "  ".join(entries),
        prefix + " ".join(entries),
        prefix + " ".join(short),
        prefix + " ".join(marks) + "  ? explains",
        prefix + " ".join(marks),
    ]
    return next((c for c in candidates if len(c) <= width), candidates[-1])


class LossChart(Widget):
    COMPONENT_CLASSES = {
        "loss-chart--line",
        "loss-chart--collapse",
        "loss-chart--axis",
        "loss-chart--nonfinite",
        "loss-chart--validation",
        "loss-chart--overlay",
        *(f"loss-chart--{kind}" for kind in MARKER_KINDS),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history: dict[str, Any] | None = None
        self.collapse_loss: float | None = None
        self.mode = ChartMode()
        self.overlay: dict[str, Any] | None = None
        """Another run's history, drawn on the same axes (None: none)."""
        self.names: tuple[str, str] = ("", "")
        """This run's name and the overlaid run's, for the legend."""
        self.drawn: list[Text] = []
        """The lines of the newest frame (what the operator sees; tests read it)."""
        self._title()

    @property
    def points_wanted(self) -> int:
        """The `points` to ask the daemon for: one per dot column of the plot."""
        return dot_columns(self.content_size.width or 80)

    def history_start(self, newest: int | None) -> int | None:
        """The first step to ask for in the current mode, given the run's newest step."""
        return self.mode.start_step(newest)

    def on_resize(self, event: Resize) -> None:
        self._title()  # the legend is fitted to the width
        # The width decides how many history points to fetch: ask again at the new size.
        self.app.call_after_refresh(self.app.chart_resized)  # type: ignore[attr-defined]

    async def on_click(self, event: Click) -> None:
        await self.app.run_action("chart_range")

    def set_mode(self, mode: ChartMode) -> None:
        self.mode = mode
        self._title()
        self.refresh()

    def _title(self) -> None:
        self.border_title = Text(f"loss · {self.mode.title}")
        entries = LEGEND.split("  ")
        if has_spike_markers(self.history):
            entries += SPIKE_LEGEND.strip().split("  ")
        if self.history is not None and validation_points(self.history):
            entries.append("× val")
        prefix = ""
        if self.overlay is not None:
            own, other = self.names
            val = f" {OVERLAY_VALIDATION_GLYPH} val" if validation_points(self.overlay) else ""
            prefix = f"⠒ {own}  {OVERLAY_GLYPH} {other}{val}  "
        outer = self.outer_size.width
        width = outer - BORDER_CELLS if outer else 10_000
        legend = legend_text(entries, prefix, width)
        self.border_subtitle = Text(legend)

    def show_overlay(self, overlay: dict[str, Any] | None, names: tuple[str, str]) -> None:
        self.overlay = overlay if isinstance(overlay, dict) else None
        self.names = names
        self._title()
        self.refresh()

    def show(self, history: dict[str, Any] | None, collapse_loss: float | None) -> None:
        self.history = history
        if isinstance(history, dict) and isinstance(history.get("collapse_loss"), int | float):
            collapse_loss = history["collapse_loss"]
        self.collapse_loss = collapse_loss
        self._title()
        self.refresh()

    @property
    def newest_drawn_step(self) -> int | None:
        return newest_step(self.history)

    def _styles(self) -> ChartStyles:
        def style(name: str) -> Style:
            return self.get_component_rich_style(f"loss-chart--{name}")

        return ChartStyles(
            line=style("line"),
            collapse=style("collapse"),
            axis=style("axis"),
            nonfinite=style("nonfinite"),
            validation=style("validation"),
            overlay=style("overlay"),
            markers={kind: style(kind) for kind in MARKER_KINDS},
        )

    def render(self) -> Group:
        width, height = self.content_size.width, self.content_size.height
        self.drawn = render_chart(
            self.history,
            width,
            height,
            self.collapse_loss,
            self._styles(),
            log_scale=self.mode.log_scale,
            overlay=self.overlay,
        )
        return Group(*self.drawn)
