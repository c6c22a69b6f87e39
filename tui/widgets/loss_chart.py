"""The whole run's loss curve, one history bucket per braille dot column."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.style import Style
from textual.events import Resize
from textual.widget import Widget

from trainwarden.tui.chart import ChartStyles, dot_columns, render_chart

MARKER_KINDS = ("restart", "divergence", "pivot", "crash")


class LossChart(Widget):
    COMPONENT_CLASSES = {
        "loss-chart--line",
        "loss-chart--collapse",
        "loss-chart--axis",
        "loss-chart--nonfinite",
        *(f"loss-chart--{kind}" for kind in MARKER_KINDS),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history: dict[str, Any] | None = None
        self.collapse_loss: float | None = None
        self.border_title = "loss"
        self.border_subtitle = "R restart  C crash  D divergence  P pivot"

    @property
    def points_wanted(self) -> int:
        """The `points` to ask the daemon for: one per dot column of the plot."""
        return dot_columns(self.content_size.width or 80)

    def on_resize(self, event: Resize) -> None:
        # The width decides how many history points to fetch: ask again at the new size.
        self.app.call_after_refresh(self.app.chart_resized)  # type: ignore[attr-defined]

    def show(self, history: dict[str, Any] | None, collapse_loss: float | None) -> None:
        self.history = history
        if isinstance(history, dict) and isinstance(history.get("collapse_loss"), int | float):
            collapse_loss = history["collapse_loss"]
        self.collapse_loss = collapse_loss
        self.refresh()

    def _styles(self) -> ChartStyles:
        def style(name: str) -> Style:
            return self.get_component_rich_style(f"loss-chart--{name}")

        return ChartStyles(
            line=style("line"),
            collapse=style("collapse"),
            axis=style("axis"),
            nonfinite=style("nonfinite"),
            markers={kind: style(kind) for kind in MARKER_KINDS},
        )

    def render(self) -> Group:
        width, height = self.content_size.width, self.content_size.height
        lines = render_chart(self.history, width, height, self.collapse_loss, self._styles())
        return Group(*lines)
