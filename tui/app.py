"""`trainwarden tui`: the operator's view of one run, over the daemon's control socket.

The app owns a RunModel; the data source (the daemon, or fixed data in tests) posts
messages that update it; a render tick redraws the panels whose data changed, at most a
few times a second, and never while a modal is open. Operator keys send one command
each over their own connection and report the outcome, success or the daemon's error.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import App, ScreenStackError, SystemCommand
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer

from trainwarden.supervisor.errors import CommandRefused, DaemonNotRunning, ProtocolError
from trainwarden.supervisor.protocol import HALTED, Client, HistoryArgs, Phase, encode
from trainwarden.tui.messages import (
    Connected,
    Disconnected,
    HistoryReceived,
    StatusReceived,
    TopicPushed,
)
from trainwarden.tui.model import PANELS, Clock, RunModel
from trainwarden.tui.sanitize import clean
from trainwarden.tui.screens.confirm import ConfirmScreen
from trainwarden.tui.screens.help import QUIT_LEAVES_RUN, HelpScreen
from trainwarden.tui.screens.log import LogScreen
from trainwarden.tui.screens.main import MainScreen, ReadOnlyMainScreen
from trainwarden.tui.screens.overlay import NO_OVERLAY, OverlayScreen
from trainwarden.tui.screens.pivot import PivotRequest, PivotScreen
from trainwarden.tui.screens.samples import SamplesScreen
from trainwarden.tui.source import DaemonSource, DataSource, describe_failure
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
STARTUP_WAIT_S = 1.0
OUTCOMES_KEPT = 50
HISTORY_CATCH_UP_S = 1.0
"""At most this often the chart asks for history because the run moved past what it drew."""
OVERLAY_REFRESH_S = 10.0
"""At most this often the overlaid run's history is asked for again over the same range
(the daemon reads it from that run's files each time)."""
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
        self.history_asked_at = 0.0
        self.overlay_asked: tuple[Any, float] | None = None
        """What the overlay was last asked for (run and range) and when."""

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
            self._catch_up_history()
        self.request_render()

    def _catch_up_history(self) -> None:
        """Ask for the history again when the run has moved past the chart's newest step,
        so the chart (and its axis) keeps up with the step the header shows."""
        step = (self.model.telemetry.value or {}).get("step")
        drawn = (self.model.history or {}).get("last_step")
        if not isinstance(step, int) or (isinstance(drawn, int) and step <= drawn):
            return
        now = time.monotonic()
        if now - self.history_asked_at >= HISTORY_CATCH_UP_S:
            self.history_asked_at = now
            self.source.want_history()

    def on_history_received(self, message: HistoryReceived) -> None:
        self.model.apply_history(message.history)
        self.request_render()
        run = self.model.overlay_run
        if run is None:
            return
        # The other run over the same range: again when the range or the run changes, or
        # the last answer has aged.
        args = self.history_args()
        asked = (run, sorted(args.items()))
        now = time.monotonic()
        last = self.overlay_asked
        if last is None or last[0] != asked or now - last[1] >= OVERLAY_REFRESH_S:
            self.overlay_asked = (asked, now)
            self.run_worker(self._fetch_overlay(run, args), group="overlay", exclusive=True)

    async def _fetch_overlay(self, run: str, args: HistoryArgs) -> None:
        try:
            reply = await self.source.request("history_of", run=run, **args)
        except CommandRefused as exc:
            # Not a run, or a daemon without history_of: asking again would not help.
            self.model.set_overlay(None)
            self.tell_failure(f"overlay {run}", exc)
        except Exception as exc:  # a slow or lost connection: the next history retries
            self.tell_failure(f"overlay {run}", exc)
            return
        else:
            if self.model.overlay_run == run:  # not changed while it was asked for
                self.model.set_overlay(run, reply if isinstance(reply, dict) else None)
        self.request_render()

    def history_points(self) -> int:
        try:
            return self.main_screen.query_one(LossChart).points_wanted
        except (NoMatches, AssertionError, IndexError):  # not mounted yet, or torn down
            return 160

    def newest_step(self) -> int | None:
        """The newest step the TUI knows of (telemetry or the chart's last history)."""
        known = [
            (self.model.telemetry.value or {}).get("step"),
            (self.model.history or {}).get("last_step"),
        ]
        return max((s for s in known if isinstance(s, int)), default=None)

    def history_args(self) -> HistoryArgs:
        """The history request the chart needs: one point per dot column, over its range."""
        args: HistoryArgs = {"points": max(self.history_points(), 1)}
        try:
            start = self.main_screen.query_one(LossChart).history_start(self.newest_step())
        except (NoMatches, AssertionError, IndexError):
            start = None
        if start is not None:
            args["start"] = start
        return args

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
            chart.show_overlay(model.overlay, (model.run_name, self.overlay_name()))
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

    def refused_read_only(self, what: str) -> bool:
        if self.read_only:
            self.tell(
                f"read-only: {what} is disabled (this TUI was started with --read-only)", "warning"
            )
        return self.read_only

    async def send(self, what: str, cmd: str, **args: Any) -> dict[str, Any] | None:
        """One operator command; its result, or None after telling why it failed."""
        try:
            result = await self.source.request(cmd, timeout=None, **args)
        except Exception as exc:  # whatever went wrong, say so; never take the TUI down
            self.tell_failure(what, exc)
            return None
        return result if isinstance(result, dict) else {}

    # -------------------------------------------------------------- keys

    def action_save(self) -> None:
        if self.refused_read_only("save"):
            return
        if self.model.saving:
            self.tell("a save is already in progress", "warning")
            return
        self.model.saving = True
        self.model.touch("telemetry")
        self.request_render()
        self.tell("saving…", timeout=3)
        self.run_worker(self._save(), group="actions")

    async def _save(self) -> None:
        try:
            result = await self.send("save", "save", wait=True)
        finally:
            self.model.saving = False
            self.model.touch("telemetry")
            self.request_render()
        if result is not None:
            name = result.get("name")
            suffix = f" ({clean(name, 80)})" if name else ""
            self.tell(f"checkpoint saved at step {result.get('step')}{suffix}")

    def action_stop(self) -> None:
        if self.refused_read_only("stop"):
            return
        handles = self.model.handles
        force = handles is not None and "SIGTERM" not in handles
        title, yes_label = "Stop the trainer?", "Stop"
        body = Text(
            "The trainer finishes its step, saves a checkpoint and exits. The daemon keeps "
            "running; press r to start the trainer again."
        )
        if force:
            lost = self.model.unsaved_steps()
            losing = f", losing the {lost} steps since the newest checkpoint" if lost else ""
            title, yes_label = "Kill the trainer without saving?", "Kill"
            body = Text(
                "The trainer does not handle SIGTERM: stopping kills it without a save"
                f"{losing}. The daemon keeps running; press r to start the trainer again "
                "from the newest checkpoint."
            )

        def answered(yes: bool | None) -> None:
            if yes:
                self.tell("stopping the trainer…", timeout=3)
                self.run_worker(self._stop(force), group="actions")

        self.push_screen(ConfirmScreen(title, body, yes_label=yes_label), answered)

    async def _stop(self, force: bool = False) -> None:
        result = await (
            self.send("stop", "stop", force=True) if force else self.send("stop", "stop")
        )
        if result is None:
            return
        message = result.get("message")
        if isinstance(message, str):
            lost = result.get("outcome") not in ("saved", "not_running")
            self.tell(
                f"trainer stopped: {clean(message, 160)}", "warning" if lost else "information"
            )
            return
        ckpt = result.get("checkpoint")
        if isinstance(ckpt, dict):
            name = clean(ckpt.get("name") or "", 80)
            self.tell(f"trainer stopped; final checkpoint: step {ckpt.get('step')} {name}".rstrip())
        else:
            self.tell("trainer stopped; there is no checkpoint yet")

    def action_start(self) -> None:
        if self.refused_read_only("start"):
            return
        phase = self.model.phase
        if phase is not None and phase not in HALTED and self.model.connected:
            self.tell(f"the run is {phase}: start works after a stop or a halt", "warning")
            return
        if phase == Phase.NO_CHECKPOINT:
            self._confirm_start_over()
            return
        self.run_worker(self._start(), group="actions")

    def _confirm_start_over(self) -> None:
        """No verified checkpoint is left: starting over at step 0 is asked, never assumed."""
        reason = clean(
            str((self.model.state.value or {}).get("detail", {}).get("reason") or ""), 300
        )
        body = (
            f"{reason}\n\nStarting over trains from step 0 with fresh weights: everything the"
            " run has learnt so far is not used. Put a verified checkpoint back in the"
            " checkpoint folder instead to resume from it (then press r)."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._start(from_scratch=True), group="actions")
            else:
                self.tell("not started: the run waits for a checkpoint or your choice")

        self.push_screen(
            ConfirmScreen("Start over from step 0?", body, yes_label="Start over"), answered
        )

    async def _start(self, from_scratch: bool = False) -> None:
        args = {"from_scratch": True} if from_scratch else {}
        result = await self.send("start", "start", **args)
        if result is not None:
            resume = result.get("resume_step")
            where = f"step {resume}" if resume is not None else "scratch"
            self.tell(f"trainer starting from {where}")

    def action_pin(self) -> None:
        if self.refused_read_only("pin"):
            return
        ckpt = self.main_screen.query_one(CheckpointsPanel).selected_checkpoint(self.model)
        if ckpt is None:
            self.tell("no checkpoint selected", "warning")
            return
        if ckpt.get("pinned"):
            self.run_worker(self._unpin(ckpt["step"]), group="actions")
        else:
            self.run_worker(self._pin("pin", ckpt["step"]), group="actions")

    async def _pin(self, cmd: str, step: int) -> None:
        result = await self.send(cmd, cmd, step=step)
        if result is not None:
            state = "pinned" if result.get("pinned") else "unpinned"
            self.tell(f"checkpoint at step {result.get('step')} {state}")

    async def _unpin(self, step: int) -> None:
        """Unpin, asking first when the daemon says retention would then delete it."""
        preview = await self.send("unpin", "unpin", step=step, dry_run=True)
        if preview is None:
            return
        if not preview.get("dry_run"):  # a daemon that cannot preview has unpinned already
            self.tell(f"checkpoint at step {preview.get('step')} unpinned")
            return
        doomed = [s for s in preview.get("would_delete") or [] if isinstance(s, int)]
        if step not in doomed:
            await self._pin("unpin", step)
            return
        name = next(
            (
                clean(c.get("name") or "", 80)
                for c in (self.model.checkpoints or {}).get("checkpoints") or []
                if isinstance(c, dict) and c.get("step") == step
            ),
            "",
        )
        others = [s for s in doomed if s != step]
        also = f" (and step {', '.join(f'{s:,}' for s in others)})" if others else ""
        body = Text(
            f"Retention keeps only the newest unpinned checkpoints: unpinned, "
            f"{name or 'the checkpoint'} (step {step:,}) is deleted at once{also}. "
            "This cannot be undone."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._pin("unpin", step), group="actions")
            else:
                self.tell(f"checkpoint at step {step:,} stays pinned")

        self.push_screen(
            ConfirmScreen(f"Unpin step {step:,} and delete it?", body, yes_label="Unpin"),
            answered,
        )

    def action_pivot(self) -> None:
        if self.refused_read_only("pivot"):  # not a kind: the command
            return
        arms = (self.model.bandit or {}).get("arms")
        if not isinstance(arms, dict) or not arms:
            self.tell("no bandit state yet: the trainer has not reported its data arms", "warning")
            return
        self.push_screen(
            PivotScreen({str(k): v if isinstance(v, dict) else {} for k, v in arms.items()}),
            self._pivot_chosen,
        )

    def _pivot_chosen(self, request: PivotRequest | None) -> None:
        if request is not None:
            self.tell("pivoting…", timeout=3)
            self.run_worker(self._pivot(request), group="actions")

    async def _pivot(self, request: PivotRequest) -> None:
        # not a kind: the pivot command
        result = await self.send("pivot", "pivot", caps=request.caps, floors=request.floors)
        if result is not None:
            archive = clean(result.get("archive") or "-", 200)
            zombies = result.get("zombies")
            gone = f"; zombie arms: {', '.join(map(str, zombies))}" if zombies else ""
            self.tell(f"pivot done at step {result.get('step')}; archive: {archive}{gone}")

    def _chart(self) -> LossChart | None:
        try:
            return self.main_screen.query_one(LossChart)
        except (NoMatches, AssertionError, IndexError):
            return None

    def action_chart_range(self) -> None:
        chart = self._chart()
        if chart is not None:
            chart.set_mode(chart.mode.next_range())
            self.source.want_history()

    def action_chart_scale(self) -> None:
        chart = self._chart()
        if chart is not None:
            chart.set_mode(chart.mode.toggled_scale())

    def overlay_name(self) -> str:
        """The overlaid run as the legend names it: its folder's name."""
        run = (self.model.overlay or {}).get("run") or self.model.overlay_run or ""
        return clean(Path(str(run)).name or str(run), 40)

    def action_overlay(self) -> None:
        self.run_worker(self._pick_overlay(), group="actions")

    async def _pick_overlay(self) -> None:
        try:
            reply = await self.source.request("related_runs")
        except Exception as exc:  # an older daemon, or none: a typed path still works
            self.tell_failure("listing other runs", exc)
            reply = {}
        runs = reply.get("runs") if isinstance(reply, dict) else None
        self.push_screen(
            OverlayScreen(runs if isinstance(runs, list) else [], self.model.overlay_run),
            self._overlay_chosen,
        )

    def _overlay_chosen(self, run: str | None) -> None:
        if run is None:
            return
        self.overlay_asked = None  # a run picked again is asked for at once
        if run == NO_OVERLAY:
            self.model.set_overlay(None)
            self.tell("overlay cleared")
        else:
            self.model.set_overlay(run)
            self.tell(f"overlaying {clean(run, 200)}…", timeout=3)
            self.source.want_history()
        self.request_render()

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


def daemon_unreachable(
    socket_path: Path, wait_s: float = STARTUP_WAIT_S, daemon_uid: int | None = None
) -> str | None:
    """Why nobody answers on `socket_path` (None: a daemon does), trying for `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with Client(socket_path, timeout=5.0, daemon_uid=daemon_uid) as client:
                client.sock.sendall(encode({"id": 1, "cmd": "hello"}))
                message = client.read_message()
            if message.get("ok"):
                return None
            error = message.get("error") or {}
            why = clean(error.get("message", "the daemon refused the connection"), 300)
            return f"{socket_path}: {why}"
        except DaemonNotRunning as exc:
            problem = str(exc)
        except (ProtocolError, OSError) as exc:
            problem = f"{socket_path}: {describe_failure(exc)}"
        if time.monotonic() >= deadline:
            return problem
        time.sleep(0.1)


def main(
    socket_path: Path,
    read_only: bool = False,
    log_path: Path | None = None,
    quit_means: str = QUIT_LEAVES_RUN,
    compare: str | None = None,
    daemon_uid: int | None = None,
) -> int:
    """Run the TUI on the daemon at `socket_path`; the exit status.

    `log_path` is the run's training.log when the caller knows it (a local run
    directory); without it the log screen is offered only when the socket lies inside
    the run directory the daemon reports. `compare`: another run to overlay on the loss
    chart, as the daemon finds it (an absolute path, or a folder beside the run).
    `daemon_uid`: the daemon's user when not ours or root (see client._check_server).
    """
    problem = daemon_unreachable(socket_path, daemon_uid=daemon_uid)
    if problem is not None:
        print(f"trainwarden tui: {problem}", file=sys.stderr)
        return 1
    app = TrainwardenApp(
        DaemonSource(socket_path, log_path, daemon_uid),
        read_only=read_only,
        quit_means=quit_means,
        compare=compare,
    )
    app.run()
    return app.return_code or 0
