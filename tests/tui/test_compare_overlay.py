"""`trainwarden tui RUN --compare OTHER_RUN` and the `o` picker: the other run's loss on
the same chart, told apart without colour (• cells and a legend with both names), on a
frozen run whose source answers history_of and related_runs like the daemon, and once
against a real daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, OptionList

from tests.support import running_daemon, scripted_run
from tests.support.histories import make_run
from tests.tui.fakes import FrozenClock, StaticSource, loss_history
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from tests.tui.test_snapshots import settled
from trainwarden.supervisor.errors import CommandRefused
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.chart import OVERLAY_GLYPH, OVERLAY_VALIDATION_GLYPH, render_chart
from trainwarden.tui.screens.overlay import OverlayScreen
from trainwarden.tui.source import DaemonSource
from trainwarden.tui.widgets.loss_chart import LossChart

RELATED = {
    "runs": [
        {"path": "/runs/base", "name": "base", "relation": "parent"},
        {"path": "/runs/lr-low", "name": "lr-low", "relation": "branch"},
    ]
}


def branch_history(points: int, start: int | None = None) -> dict[str, Any]:
    """The frozen run's curve up to step 6,000, then 0.6 higher, with validation points,
    as history_of answers for a branch."""
    reply = loss_history(points, 12_000, markers=False, start=start)
    reply["mean"] = [
        m + (0.6 if s > 6000 else 0.0) for s, m in zip(reply["step"], reply["mean"], strict=True)
    ]
    reply["val"] = {"step": [8000, 11_000], "loss": [3.4, 3.3]}
    reply["run"] = "/runs/lr-low"
    reply.pop("markers")
    return reply


class CompareSource(StaticSource):
    """The frozen run, answering history_of for the runs in `known` over the asked range."""

    def __init__(self, known: tuple[str, ...] = ("/runs/lr-low", "lr-low")) -> None:
        super().__init__(replies={"related_runs": RELATED})
        self.known = known

    async def request(self, cmd: str, timeout: float | None = 30.0, **args: Any) -> Any:
        if cmd != "history_of":
            return await super().request(cmd, timeout, **args)
        self.requests.append((cmd, args))
        if args["run"] not in self.known:
            raise CommandRefused("not_a_run", f"{args['run']}: not a run directory")
        return branch_history(args["points"], args.get("start"))


def app_with(compare: str | None, source: CompareSource | None = None) -> TrainwardenApp:
    return TrainwardenApp(source or CompareSource(), clock=FrozenClock(), compare=compare)


def chart(app: TrainwardenApp) -> LossChart:
    return app.main_screen.query_one(LossChart)


def drawn(app: TrainwardenApp) -> str:
    return "\n".join(line.plain for line in chart(app).drawn)


async def overlaid(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, TrainwardenApp)
    await until(
        pilot, lambda: settled(app) and OVERLAY_GLYPH in drawn(app), 10, "the overlay drawn"
    )


def test_render_chart_overlay_shares_the_axes_and_differs_without_colour():
    own = loss_history(40, 12_000, markers=False)
    other = branch_history(40)
    alone = render_chart(own, 48, 12)
    both = render_chart(own, 48, 12, overlay=other)
    assert OVERLAY_GLYPH not in "".join(t.plain for t in alone)
    text = [t.plain for t in both]
    assert sum(line.count(OVERLAY_GLYPH) for line in text) >= 5
    assert sum(line.count(OVERLAY_VALIDATION_GLYPH) for line in text) == 2
    # Where the two runs share their curve (before the branch) only one line is drawn.
    left = [line[8:20] for line in text[:-2]]
    assert not any(OVERLAY_GLYPH in part for part in left)
    # A branch that runs ahead of this run widens the step axis to its own last step.
    longer = branch_history(40)
    longer["last_step"] = 20_000
    longer["step"][-1] = 20_000
    assert render_chart(own, 48, 12, overlay=longer)[-1].plain.split()[-1] == "20,000"


async def test_compare_overlays_the_other_run_and_the_picker_changes_or_clears_it():
    source = CompareSource()
    app = app_with("/runs/lr-low", source)
    async with app.run_test(size=(100, 30)) as pilot:
        await overlaid(pilot)
        asked = [args for cmd, args in source.requests if cmd == "history_of"]
        assert asked[0]["run"] == "/runs/lr-low"
        assert asked[-1]["points"] == app.history_points()
        subtitle = str(chart(app).border_subtitle)
        assert "gpt2-small-mix" in subtitle and f"{OVERLAY_GLYPH} lr-low" in subtitle
        # This run's history again over the same range: the overlay's answer is recent.
        for _ in range(3):
            source.want_history()
        await pilot.pause(0.2)
        assert [cmd for cmd, _ in source.requests].count("history_of") == len(asked)

        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, OverlayScreen), 10, "the picker")
        assert ("related_runs", {}) in source.requests
        text = screen_text(app)
        assert "base  (parent)" in text and "lr-low  (branch)" in text
        assert "no overlay" in text
        options = app.screen.query_one(OptionList)
        assert options.get_option_at_index(0).id == ""  # the first: no overlay
        await pilot.press("enter")
        await until(pilot, lambda: OVERLAY_GLYPH not in drawn(app), 10, "the overlay cleared")
        assert app.model.overlay_run is None
        assert "⠒" not in str(chart(app).border_subtitle)

        # A typed path: the daemon refuses it, the TUI says so and draws no overlay.
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, OverlayScreen), 10, "the picker")
        assert "no overlay" not in screen_text(app)
        app.screen.query_one(Input).focus()
        await pilot.press(*"/tmp/x", "enter")
        await until(
            pilot, lambda: any("not_a_run" in o for o in app.outcomes), 10, "the refusal told"
        )
        assert app.model.overlay_run is None and OVERLAY_GLYPH not in drawn(app)

        # The branch, picked from the list, is overlaid again; cleared and picked once
        # more, it is asked for again at once.
        for _ in range(2):
            await pilot.press("o")
            await until(pilot, lambda: isinstance(app.screen, OverlayScreen), 10, "the picker")
            await pilot.press("down", "enter")
            await until(pilot, lambda: OVERLAY_GLYPH in drawn(app), 10, "the branch overlaid")
            assert app.model.overlay_run == "/runs/lr-low"
            await pilot.press("o")
            await until(pilot, lambda: isinstance(app.screen, OverlayScreen), 10, "the picker")
            await pilot.press("enter")
            await until(pilot, lambda: OVERLAY_GLYPH not in drawn(app), 10, "cleared")


def test_compare_overlay_snapshot(snap_compare):
    assert snap_compare(app_with("/runs/lr-low"), terminal_size=(120, 40), run_before=overlaid)


@pytest.mark.timeout(300)
async def test_a_real_daemon_serves_the_overlay_of_a_run_beside_it(tmp_path: Path):
    run_dir = scripted_run(tmp_path / "run", "--steps", "100000000", "--dt", "0.02")
    other = make_run(tmp_path / "other", {s: 9.0 - 0.01 * s for s in range(1, 400)})
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("running")
        app = TrainwardenApp(DaemonSource(daemon.socket), compare="other")
        async with app.run_test(size=(120, 40)) as pilot:
            await until(
                pilot,
                lambda: (app.model.overlay or {}).get("count") == 399,
                60,
                "the other run's history",
            )
            assert app.model.overlay["run"] == str(other.resolve())
            await until(pilot, lambda: OVERLAY_GLYPH in drawn(app), 30, "the overlay drawn")
            assert "• other" in str(chart(app).border_subtitle)
            await pilot.press("o")
            await until(pilot, lambda: isinstance(app.screen, OverlayScreen), 30, "the picker")
            assert "other  (sibling)" in screen_text(app)
