"""The loss chart's data: the history it asks the daemon for and the run it overlays.

One point per dot column over the range the operator picked; asked again when the run
moves past the newest step drawn, and the overlaid run's history over the same range.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from textual.css.query import NoMatches

from trainwarden.supervisor.errors import CommandRefused
from trainwarden.supervisor.protocol import HistoryArgs
from trainwarden.tui.host import AppHost
from trainwarden.tui.sanitize import clean
from trainwarden.tui.screens.overlay import NO_OVERLAY, OverlayScreen
from trainwarden.tui.widgets.loss_chart import LossChart

HISTORY_CATCH_UP_S = 1.0
"""At most this often the chart asks for history because the run moved past what it drew."""
OVERLAY_REFRESH_S = 10.0
"""At most this often the overlaid run's history is asked for again over the same range
(the daemon reads it from that run's files each time)."""


class ChartFeed:
    """What the loss chart asks for, and its keys (range, scale, overlay)."""

    def __init__(self, app: AppHost) -> None:
        self.app = app
        self.history_asked_at = 0.0
        self.overlay_asked: tuple[Any, float] | None = None
        """What the overlay was last asked for (run and range) and when."""

    def chart(self) -> LossChart | None:
        try:
            return self.app.main_screen.query_one(LossChart)
        except (NoMatches, AssertionError, IndexError):  # not mounted yet, or torn down
            return None

    def history_points(self) -> int:
        chart = self.chart()
        return 160 if chart is None else chart.points_wanted

    def newest_step(self) -> int | None:
        """The newest step the TUI knows of (telemetry or the chart's last history)."""
        model = self.app.model
        known = [(model.telemetry.value or {}).get("step"), (model.history or {}).get("last_step")]
        return max((s for s in known if isinstance(s, int)), default=None)

    def history_args(self) -> HistoryArgs:
        """The history request the chart needs: one point per dot column, over its range."""
        args: HistoryArgs = {"points": max(self.history_points(), 1)}
        chart = self.chart()
        start = None if chart is None else chart.history_start(self.newest_step())
        if start is not None:
            args["start"] = start
        return args

    def catch_up(self) -> None:
        """Ask for the history again when the run has moved past the chart's newest step,
        so the chart (and its axis) keeps up with the step the header shows."""
        step = (self.app.model.telemetry.value or {}).get("step")
        drawn = (self.app.model.history or {}).get("last_step")
        if not isinstance(step, int) or (isinstance(drawn, int) and step <= drawn):
            return
        now = time.monotonic()
        if now - self.history_asked_at >= HISTORY_CATCH_UP_S:
            self.history_asked_at = now
            self.app.source.want_history()

    def history_received(self) -> None:
        """The chart's history came: the overlaid run's again when the range or the run
        changed, or the last answer has aged."""
        run = self.app.model.overlay_run
        if run is None:
            return
        args = self.history_args()
        asked = (run, sorted(args.items()))
        now = time.monotonic()
        last = self.overlay_asked
        if last is None or last[0] != asked or now - last[1] >= OVERLAY_REFRESH_S:
            self.overlay_asked = (asked, now)
            self.app.run_worker(self._fetch_overlay(run, args), group="overlay", exclusive=True)

    async def _fetch_overlay(self, run: str, args: HistoryArgs) -> None:
        try:
            reply = await self.app.source.request("history_of", run=run, **args)
        except CommandRefused as exc:
            # Not a run, or a daemon without history_of: asking again would not help.
            self.app.model.set_overlay(None)
            self.app.tell_failure(f"overlay {run}", exc)
        except Exception as exc:  # a slow or lost connection: the next history retries
            self.app.tell_failure(f"overlay {run}", exc)
            return
        else:
            if self.app.model.overlay_run == run:  # not changed while it was asked for
                self.app.model.set_overlay(run, reply if isinstance(reply, dict) else None)
        self.app.request_render()

    def overlay_name(self) -> str:
        """The overlaid run as the legend names it: its folder's name."""
        run = (self.app.model.overlay or {}).get("run") or self.app.model.overlay_run or ""
        return clean(Path(str(run)).name or str(run), 40)

    def next_range(self) -> None:
        chart = self.chart()
        if chart is not None:
            chart.set_mode(chart.mode.next_range())
            self.app.source.want_history()

    def toggle_scale(self) -> None:
        chart = self.chart()
        if chart is not None:
            chart.set_mode(chart.mode.toggled_scale())

    async def pick_overlay(self) -> None:
        try:
            reply = await self.app.source.request("related_runs")
        except Exception as exc:  # an older daemon, or none: a typed path still works
            self.app.tell_failure("listing other runs", exc)
            reply = {}
        runs = reply.get("runs") if isinstance(reply, dict) else None
        self.app.push_screen(
            OverlayScreen(runs if isinstance(runs, list) else [], self.app.model.overlay_run),
            self._overlay_chosen,
        )

    def _overlay_chosen(self, run: str | None) -> None:
        if run is None:
            return
        self.overlay_asked = None  # a run picked again is asked for at once
        if run == NO_OVERLAY:
            self.app.model.set_overlay(None)
            self.app.tell("overlay cleared")
        else:
            self.app.model.set_overlay(run)
            self.app.tell(f"overlaying {clean(run, 200)}…", timeout=3)
            self.app.source.want_history()
        self.app.request_render()
