"""The loss chart as braille text: pure functions from a history reply to rich Text lines.

A terminal cell holds a 2x4 grid of braille dots, so a W x H panel draws W*2 x H*4
points: the daemon decimates the whole run to one bucket per dot column, and the curve
is the bucket means joined column to column. The collapse reference ln(V) (the loss of a
model that predicts uniformly) is a dashed line; restarts, divergences, pivots,
crashes, loss spikes (S, at the spike's first step) and skipped data (», where a
rollback's skip window starts) are glyphs on a row under the curve. A ChartMode picks the step range (the
whole run or its newest part) and the scale (linear or log); a validation series, when
the history carries one, is drawn as `×` marks over the curve. Another run's history
(`trainwarden tui --compare`) is overlaid on the same axes as a line of `•` cells, its
validation as `+`: told apart from the braille curve without colour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rich.style import Style
from rich.text import Text

from trainwarden.supervisor.protocol import MarkerKind
from trainwarden.tui import fmt

BRAILLE_BASE = 0x2800
# Dot bit for (column 0..1, row 0..3) inside one cell.
DOT_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
MARKER_GLYPHS = {
    MarkerKind.RESTART: "R",
    MarkerKind.DIVERGENCE: "D",
    MarkerKind.PIVOT: "P",
    MarkerKind.CRASH: "C",
    MarkerKind.SPIKE: "S",
    MarkerKind.SKIP: "»",
}
MARKER_PRIORITY = (
    MarkerKind.DIVERGENCE,
    MarkerKind.SPIKE,
    MarkerKind.CRASH,
    MarkerKind.PIVOT,
    MarkerKind.SKIP,
    MarkerKind.RESTART,
)
"""Which marker a cell shows when several fall in it: the first of these."""
ALARMING_MARKERS = frozenset({MarkerKind.DIVERGENCE, MarkerKind.CRASH, MarkerKind.SPIKE})
"""Drawn red when the widget gives no style of its own (the others yellow)."""
SPIKE_LEGEND = "  S spike  » skip"
"""Added to the chart's legend when the history has a spike or skip marker."""
Y_LABEL_WIDTH = 7
VALIDATION_GLYPH = "×"
OVERLAY_GLYPH = "•"
OVERLAY_VALIDATION_GLYPH = "+"
RANGES: tuple[tuple[str, int | None, float | None], ...] = (
    ("whole run", None, None),
    ("last 1k steps", 1_000, None),
    ("last 10k steps", 10_000, None),
    ("last 10%", None, 0.1),
)
"""The step ranges the chart cycles through: (title, newest steps, newest fraction)."""


@dataclass(frozen=True)
class ChartMode:
    """Which part of the run the chart shows and on which scale."""

    range_index: int = 0
    log_scale: bool = False

    @property
    def title(self) -> str:
        name = RANGES[self.range_index % len(RANGES)][0]
        return f"{name}, log" if self.log_scale else name

    def next_range(self) -> ChartMode:
        return ChartMode((self.range_index + 1) % len(RANGES), self.log_scale)

    def toggled_scale(self) -> ChartMode:
        return ChartMode(self.range_index, not self.log_scale)

    def start_step(self, newest: int | None) -> int | None:
        """The first step to ask the daemon for (None: from the run's first step)."""
        _, steps, fraction = RANGES[self.range_index % len(RANGES)]
        if newest is None:
            return None
        if steps is not None:
            first = newest - steps + 1
        elif fraction is not None:
            first = newest - int(newest * fraction) + 1
        else:
            return None
        return first if first > 0 else None


@dataclass(frozen=True)
class ChartStyles:
    line: Style = Style(color="cyan")
    collapse: Style = Style(color="yellow", dim=True)
    axis: Style = Style(dim=True)
    nonfinite: Style = Style(color="red", bold=True)
    validation: Style = Style(bold=True)
    overlay: Style = Style(color="magenta")
    markers: dict[str, Style] | None = None

    def marker(self, kind: str) -> Style:
        if self.markers and kind in self.markers:
            return self.markers[kind]
        alarm = kind in ALARMING_MARKERS
        return Style(color="red" if alarm else "yellow", bold=True)


def has_spike_markers(history: dict[str, Any] | None) -> bool:
    markers = history.get("markers") if isinstance(history, dict) else None
    return isinstance(markers, list) and any(
        isinstance(m, dict) and m.get("kind") in (MarkerKind.SPIKE, MarkerKind.SKIP)
        for m in markers
    )


def dot_columns(cells: int) -> int:
    """How many history points a plot `cells` wide can show: the `points` to ask for."""
    return max(plot_cells(cells), 1) * 2


def plot_cells(width: int) -> int:
    return max(width - Y_LABEL_WIDTH - 1, 1)


def _numbers(values: Any) -> list[float | None]:
    if not isinstance(values, list):
        return []
    return [v if fmt.finite(v) else None for v in values]


def validation_points(history: dict[str, Any]) -> list[tuple[int, float]]:
    """The held-out validation losses a history carries, as (step, loss).

    The hook for a daemon that reports them: `history["val"]` is `{"step": [...],
    "loss": [...]}`; absent, malformed or non-finite entries give no points.
    """
    val = history.get("val")
    if not isinstance(val, dict):
        return []
    steps, losses = val.get("step"), val.get("loss")
    if not isinstance(steps, list) or not isinstance(losses, list):
        return []
    return [
        (step, loss)
        for step, loss in zip(steps, losses, strict=False)
        if isinstance(step, int) and fmt.finite(loss)
    ]


def newest_step(history: dict[str, Any] | None) -> int | None:
    """The newest step a history reply holds (what the axis ends on)."""
    if not isinstance(history, dict):
        return None
    last = history.get("last_step")
    if isinstance(last, int):
        return last
    steps = history.get("step")
    if isinstance(steps, list) and steps and isinstance(steps[-1], int):
        return steps[-1]
    return None


def render_chart(
    history: dict[str, Any] | None,
    width: int,
    height: int,
    collapse_loss: float | None = None,
    styles: ChartStyles | None = None,
    log_scale: bool = False,
    overlay: dict[str, Any] | None = None,
) -> list[Text]:
    """`height` lines of `width` cells: curve rows, then a marker row and a step axis.

    With `log_scale` the curve is drawn over log(loss) and the labels give the loss
    itself; losses <= 0 have no logarithm and leave a gap. `overlay`, another run's
    history reply, shares the axes: the step range and the scale cover both.
    """
    styles = styles or ChartStyles()
    width = max(width, Y_LABEL_WIDTH + 2)
    if height < 3:
        return [Text("loss chart needs more room", style=styles.axis)][:height]
    history = history if isinstance(history, dict) else {}
    steps = history.get("step")
    means = _numbers(history.get("mean"))
    validation = validation_points(history)
    other = overlay if isinstance(overlay, dict) else {}
    other_steps = other.get("step")
    if not isinstance(other_steps, list):
        other_steps = []
    other_means = _numbers(other.get("mean"))
    other_validation = validation_points(other)
    if log_scale:
        means = [_log(v) for v in means]
        validation = [(s, lv) for s, v in validation if (lv := _log(v)) is not None]
        other_means = [_log(v) for v in other_means]
        other_validation = [(s, lv) for s, v in other_validation if (lv := _log(v)) is not None]
    if not isinstance(steps, list) or not steps or not any(v is not None for v in means):
        empty = [Text("") for _ in range(height)]
        why = "no positive loss to draw on a log scale" if log_scale else "no steps logged yet"
        empty[height // 2] = Text(why.center(width), style=styles.axis)
        return empty

    rows = height - 2
    cells = plot_cells(width)
    dots_x, dots_y = cells * 2, rows * 4
    first = history.get("first_step")
    if not isinstance(first, int):
        first = steps[0] if isinstance(steps[0], int) else 0
    last = newest_step(history)
    if last is None:
        last = first
    other_drawn = [
        (step, value)
        for step, value in zip(other_steps, other_means, strict=False)
        if isinstance(step, int)
    ]
    if other_drawn:
        first = min(first, other_drawn[0][0])
        last = max(last, newest_step(other) or other_drawn[-1][0])
    span = max(last - first, 1)

    finite = (
        [v for v in means if v is not None]
        + [v for _, v in other_drawn if v is not None]
        + [v for s, v in validation + other_validation if first <= s <= last]
    )
    low, high = min(finite), max(finite)
    collapse = collapse_loss if fmt.finite(collapse_loss) else None
    if log_scale and collapse is not None:
        collapse = _log(collapse)
    # Drawn when it costs at most half the chart's height; otherwise named on the axis.
    collapse_drawn = collapse is not None and low <= collapse <= high + max(high - low, 0.1)
    if collapse_drawn:
        assert collapse is not None
        high = max(high, collapse)
    if high - low < 1e-9:
        low, high = low - 0.5, high + 0.5

    def y_dot(value: float) -> int:
        return round((high - value) / (high - low) * (dots_y - 1))

    def x_dot(step: int) -> int:
        return min(max(round((step - first) / span * (dots_x - 1)), 0), dots_x - 1)

    grid = [[0] * cells for _ in range(rows)]
    bad_columns: set[int] = set()

    def plot(x: int, y: int) -> None:
        grid[y // 4][x // 2] |= DOT_BITS[x % 2][y % 4]

    nonfinite = history.get("nonfinite")
    if not isinstance(nonfinite, list):
        nonfinite = []
    previous: tuple[int, int] | None = None
    for i, (step, value) in enumerate(zip(steps, means, strict=False)):
        if not isinstance(step, int):
            continue
        x = x_dot(step)
        if i < len(nonfinite) and fmt.finite(nonfinite[i]) and nonfinite[i] > 0:
            bad_columns.add(x // 2)
        if value is None:
            previous = None
            continue
        y = y_dot(value)
        if previous is not None:
            for px, py in _line(previous, (x, y)):
                plot(px, py)
        else:
            plot(x, y)
        previous = (x, y)

    overlay_cells: set[tuple[int, int]] = set()
    previous = None
    for step, value in other_drawn:
        if value is None:
            previous = None
            continue
        point = (x_dot(step), y_dot(value))
        for px, py in _line(previous, point) if previous is not None else [point]:
            overlay_cells.add((py // 4, px // 2))
        previous = point

    def cells_of(points: list[tuple[int, float]]) -> set[tuple[int, int]]:
        return {(y_dot(v) // 4, x_dot(s) // 2) for s, v in points if first <= s <= last}

    validation_cells = cells_of(validation)
    other_validation_cells = cells_of(other_validation)
    collapse_row = y_dot(collapse) // 4 if collapse_drawn and collapse is not None else None
    labels = {0: high, rows - 1: low}
    if rows >= 5:
        labels[(rows - 1) // 2] = (high + low) / 2
    lines: list[Text] = []
    for r in range(rows):
        line = Text()
        label = ""
        if r in labels:
            label = _label(math.exp(labels[r]) if log_scale else labels[r])
        line.append(label.rjust(Y_LABEL_WIDTH - 1) + " ", styles.axis)
        line.append("┤" if r in labels else "│", styles.axis)
        for c in range(cells):
            bits = grid[r][c]
            if c in bad_columns and r == 0:
                line.append("!", styles.nonfinite)
            elif (r, c) in validation_cells:
                line.append(VALIDATION_GLYPH, styles.validation)
            elif (r, c) in other_validation_cells:
                line.append(OVERLAY_VALIDATION_GLYPH, styles.overlay)
            elif bits:
                line.append(chr(BRAILLE_BASE + bits), styles.line)
            elif (r, c) in overlay_cells:
                line.append(OVERLAY_GLYPH, styles.overlay)
            elif r == collapse_row:
                line.append("╌", styles.collapse)
            else:
                line.append(" ")
        lines.append(line)
    in_range = [
        m
        for m in history.get("markers") or []
        if isinstance(m, dict) and isinstance(m.get("step"), int) and first <= m["step"] <= last
    ]
    lines.append(_marker_row(in_range, cells, x_dot, styles))
    collapse_named = math.exp(collapse) if log_scale and collapse is not None else collapse
    lines.append(_axis_row(first, last, cells, collapse_named, collapse_drawn, styles))
    return lines


def _log(value: float | None) -> float | None:
    return math.log(value) if value is not None and value > 0 else None


def _label(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 1000 else f"{value:.3g}"


def _line(start: tuple[int, int], end: tuple[int, int]) -> list[tuple[int, int]]:
    """The dots of a straight segment (Bresenham), so steep drops stay connected."""
    (x0, y0), (x1, y1) = start, end
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
    error = dx + dy
    dots = []
    while True:
        dots.append((x0, y0))
        if x0 == x1 and y0 == y1:
            return dots
        doubled = 2 * error
        if doubled >= dy:
            error += dy
            x0 += sx
        if doubled <= dx:
            error += dx
            y0 += sy


def _marker_row(markers: Any, cells: int, x_dot: Any, styles: ChartStyles) -> Text:
    chosen: dict[int, MarkerKind] = {}
    for marker in markers if isinstance(markers, list) else []:
        if not isinstance(marker, dict) or not isinstance(marker.get("step"), int):
            continue
        if marker.get("kind") not in MARKER_GLYPHS:
            continue
        kind = MarkerKind(marker["kind"])
        cell = x_dot(marker["step"]) // 2
        current = chosen.get(cell)
        if current is None or MARKER_PRIORITY.index(kind) < MARKER_PRIORITY.index(current):
            chosen[cell] = kind
    line = Text(" " * (Y_LABEL_WIDTH - 1) + " ")
    line.append("└", styles.axis)
    for c in range(cells):
        shown = chosen.get(c)
        if shown is None:
            line.append("─", styles.axis)
        else:
            line.append(MARKER_GLYPHS[shown], styles.marker(shown))
    return line


def _axis_row(
    first: int, last: int, cells: int, collapse: float | None, drawn: bool, styles: ChartStyles
) -> Text:
    left, right = f"step {first:,}", f"{last:,}"
    middle = ""
    if collapse is not None:
        middle = f"ln V {collapse:.2f} ╌" if drawn else f"ln V {collapse:.2f} off chart"
    if len(left) + len(right) + 1 > cells:
        left = ""
    room = cells - len(left) - len(right)
    if len(middle) + 2 > room:
        middle = ""
    gap = max(room - len(middle), 1)
    text = left + " " * (gap // 2) + middle + " " * (gap - gap // 2) + right
    return Text(" " * Y_LABEL_WIDTH + " " + text[-cells:], style=styles.axis)
