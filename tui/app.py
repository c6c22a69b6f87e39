"""`trainwarden tui`: the operator's view of one run, over the daemon's control socket.

The app owns a RunModel; the data source (the daemon, or fixed data in tests) posts
messages that update it; a render tick redraws the panels whose data changed, at most a
few times a second, and never while a modal is open. Operator keys send one command
each over their own connection (`commands`) and report the outcome, success or the
daemon's error; what the loss chart asks for is `chart_feed`'s, starting the app on a
socket is `launch`'s.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from textual.app import App, ScreenStackError, SystemCommand
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer

from trainwarden.supervisor.errors import CommandRefused
from trainwarden.supervisor.protocol import HistoryArgs
from trainwarden.tui.chart_feed import ChartFeed
from trainwarden.tui.commands import RunCommands
from trainwarden.tui.messages import (
    Connected,
    Disconnected,
    HistoryReceived,
    StatusReceived,
    TopicPushed,
)
from trainwarden.tui.model import PANELS, Clock, RunModel
from trainwarden.tui.sanitize import clean
from trainwarden.tui.screens.help import QUIT_LEAVES_RUN, HelpScreen
from trainwarden.tui.screens.log import LogScreen
from trainwarden.tui.screens.main import MainScreen, ReadOnlyMainScreen
from trainwarden.tui.screens.samples import SamplesScreen
from trainwarden.tui.source import DataSource, describe_failure
from trainwarden.tui.widgets.bandit import BanditPanel
from trainwarden.tui.widgets.caption import IncidentCaption
from trainwarden.tui.widgets.checkpoints import CheckpointsPanel
from trainwarden.tui.widgets.events import EventsPanel
from trainwarden.tui.widgets.gpu import GpuPanel
from trainwarden.tui.widgets.header import RunHeader
from trainwarden.tui.widgets.loss_chart import LossChart
from trainwarden.tui.widgets.telemetry import TelemetryPanel

RENDER_INTERVAL_S = 0.25
"""At most four frames a second, however fast the daemon pushes."""
CLOCK_PANELS = ("header", "telemetry", "checkpoints")
OUTCOMES_KEPT = 50
PALETTE = (
    ("Save a checkpoint", "Ask the trainer to save now (s)", "save"),
    ("Stop the trainer", "Save, then stop the trainer; the daemon keeps running (x)", "stop"),
    ("Start the trainer", "Start the trainer again from the newest checkpoint (r)", "start"),
    # not a kind: the pivot action
    ("Pivot the data mix", "Set caps and floors per data arm (p)", "pivot"),
    ("Pin or unpin the checkpoint", "Keep the selected checkpoint from retention (P)", "pin"),
    ("Samples", "Every arm's recent samples, in full (m)", "samples"),
    (
        "Chart range",
        "Loss chart: whole run, last 1k, last 10k, last 10% of steps (c)",
        "chart_range",
    ),
    ("Chart log scale", "Loss chart: switch between linear and log-scale loss (y)", "chart_scale"),
    ("Overlay a run", "Loss chart: draw another run's loss beside this one's (o)", "overlay"),
    ("Log", "The run's training.log (l)", "log"),
    ("Help", "Keys and what each panel shows (?)", "help"),
    ("Quit", "q", "quit"),
)
"""The command palette's entries: title, help line, app action (quit's help line is the
app's own `quit_means`, which the demo changes)."""


class TrainwardenApp(App[int]):
    CSS_PATH = "trainwarden.tcss"
    TITLE = "trainwarden"
    ENABLE_COMMAND_PALETTE = True
    NOTIFICATION_TIMEOUT = 8

    def __init__(
        self,
        source: DataSource,
        read_only: bool = False,
        clock: Clock | None = None,
        quit_means: str = QUIT_LEAVES_RUN,
        compare: str | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.read_only = read_only
        self.quit_means = quit_means
        """What q does to the run, as the help says it (the demo stops its own run)."""
        self.model = RunModel(clock=clock or Clock())
        self.model.overlay_run = compare
        self.rendered: dict[str, int] = {}
        self.clock_rendered_at = 0.0
        self.outcomes: list[str] = []
        self.first_complete_frame_s: float | None = None
        self.started_at = time.perf_counter()
        self.rendered_at = 0.0
        self.render_pending: Timer | None = None
        self.chart_feed = ChartFeed(self)
        self.commands = RunCommands(self)

    def get_default_screen(self) -> Screen[Any]:
        return ReadOnlyMainScreen(read_only=True) if self.read_only else MainScreen()

    def on_mount(self) -> None:
        self.run_worker(self.source.run(self.post_message, self.history_args), name="daemon")
        # Clocks (uptime, ages, countdowns) move even when no data comes.
        self.set_interval(1.0, self.request_render)
        self.call_after_refresh(self.render_tick)

    def request_render(self) -> None:
        """Draw soon: now if the last frame is old enough, else once the interval has passed."""
        if self.render_pending is not None:
            return
        wait = RENDER_INTERVAL_S - (time.monotonic() - self.rendered_at)
        if wait <= 0:
            self.render_tick()
        else:
            self.render_pending = self.set_timer(wait, self._render_due)

    def _render_due(self) -> None:
        self.render_pending = None
        self.render_tick()

    # -------------------------------------------------------------- data in

    def on_connected(self, message: Connected) -> None:
        self.model.set_connected(message.hello)
        self.request_render()

    def on_disconnected(self, message: Disconnected) -> None:
        self.model.set_disconnected(message.reason, message.retry_in_s)
        self.request_render()

    def on_status_received(self, message: StatusReceived) -> None:
        self.model.apply_status(message.status)
        self.request_render()

    def on_topic_pushed(self, message: TopicPushed) -> None:
        self.model.apply_topic(message.topic, message.data)
        if message.topic == "telemetry":
            self.chart_feed.catch_up()
        self.request_render()

    def on_history_received(self, message: HistoryReceived) -> None:
        self.model.apply_history(message.history)
        self.request_render()
        self.chart_feed.history_received()

    def history_points(self) -> int:
        return self.chart_feed.history_points()

    def history_args(self) -> HistoryArgs:
        return self.chart_feed.history_args()

    def panel_resized(self, panel: str) -> None:
        """A panel that fits its text to its width was resized: draw it again for the new
        one (a frozen clock, or a quiet run, would otherwise leave the old fitting up)."""
        if panel in PANELS:
            self.model.touch(panel)
            self.request_render()

    def chart_resized(self) -> None:
        self.source.want_history()
        self.model.touch("chart")
        self.request_render()

    # -------------------------------------------------------------- drawing

    @property
    def main_screen(self) -> MainScreen:
        screen = self.screen_stack[0]
        assert isinstance(screen, MainScreen)
        return screen

    def render_tick(self) -> None:
        try:
            screen = self.screen
        except ScreenStackError:
            return  # the app is shutting down
        if not isinstance(screen, MainScreen):
            return  # a modal or the log is in front: nothing to see, nothing to draw
        self.rendered_at = time.monotonic()
        model = self.model
        now = model.clock.monotonic()
        clock_due = now - self.clock_rendered_at >= 1.0
        due = [
            panel
            for panel in PANELS
            if self.rendered.get(panel) != model.versions[panel]
            or (clock_due and panel in CLOCK_PANELS)
        ]
        if clock_due:
            self.clock_rendered_at = now
        if not due:
            return
        with self.batch_update():
            screen.set_class(not model.connected and model.ever_connected, "-stale")
            for panel in due:
                try:
                    self.render_panel(screen, panel)
                except NoMatches:
                    return  # the screen is being torn down (the app is exiting)
                self.rendered[panel] = model.versions[panel]
        if self.first_complete_frame_s is None and model.populated:
            self.first_complete_frame_s = time.perf_counter() - self.started_at

    @property
    def up_to_date(self) -> bool:
        """Every panel shows the model's current data (no frame is owed)."""
        return self.render_pending is None and all(
            self.rendered.get(panel) == self.model.versions[panel] for panel in PANELS
        )

    def render_panel(self, screen: MainScreen, panel: str) -> None:
        model = self.model
        if panel == "header":
            screen.query_one(RunHeader).show(model)
        elif panel == "telemetry":
            screen.query_one(TelemetryPanel).show(model)
        elif panel == "chart":
            collapse = (model.telemetry.value or {}).get("collapse_loss")
            chart = screen.query_one(LossChart)
            chart.show_overlay(model.overlay, (model.run_name, self.chart_feed.overlay_name()))
            chart.show(model.history, collapse)
        elif panel == "gpu":
            screen.query_one(GpuPanel).show(model)
        elif panel == "checkpoints":
            screen.query_one(CheckpointsPanel).show(model)
        elif panel == "bandit":
            screen.query_one(BanditPanel).show(model)
        elif panel == "events":
            screen.query_one(EventsPanel).show(model)
            screen.query_one(IncidentCaption).show(model)

    # -------------------------------------------------------------- outcomes

    def tell(
        self, message: str, severity: str = "information", timeout: float | None = None
    ) -> None:
        """Show an outcome to the operator (and keep it, for the record and for tests)."""
        text = clean(message, 600)
        self.outcomes = [*self.outcomes[-OUTCOMES_KEPT + 1 :], text]
        self.notify(text, severity=severity, timeout=timeout, markup=False)  # type: ignore[arg-type]

    def tell_failure(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, CommandRefused):
            self.tell(f"{what} refused ({exc.code}): {exc}", "error", 12)
        else:
            self.tell(f"{what} failed: {describe_failure(exc)}", "error", 12)

    # -------------------------------------------------------------- keys

    def action_save(self) -> None:
        self.commands.save()

    def action_stop(self) -> None:
        self.commands.stop()

    def action_start(self) -> None:
        self.commands.start()

    def action_pin(self) -> None:
        self.commands.pin()

    def action_pivot(self) -> None:
        self.commands.pivot()

    def action_chart_range(self) -> None:
        self.chart_feed.next_range()

    def action_chart_scale(self) -> None:
        self.chart_feed.toggle_scale()

    def action_overlay(self) -> None:
        self.run_worker(self.chart_feed.pick_overlay(), group="actions")

    def action_samples(self) -> None:
        self.push_screen(SamplesScreen(self.model))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        for title, help_line, action in PALETTE:
            if action == "quit":
                help_line = f"{self.quit_means[:1].upper()}{self.quit_means[1:]} (q)"
            yield SystemCommand(title, help_line, self._palette_action(action))

    def _palette_action(self, action: str) -> Any:
        async def run() -> None:
            await self.run_action(action)

        return run

    def action_log(self) -> None:
        self.push_screen(LogScreen(self.source.log_path))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(read_only=self.read_only, quit_means=self.quit_means))

    async def action_quit(self) -> None:
        self.exit(0)
