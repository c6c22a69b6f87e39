"""How the screens look, with a frozen run and a frozen clock (no daemon, no wall time)."""

from __future__ import annotations

from typing import Any

from textual.pilot import Pilot
from textual.widgets import Input

from tests.tui.fakes import FrozenClock, StaticSource
from tests.tui.live import until
from trainwarden.tui.app import TrainwardenApp


def frozen_app(**source: Any) -> TrainwardenApp:
    return TrainwardenApp(StaticSource(**source), clock=FrozenClock())


def settled(app: TrainwardenApp) -> bool:
    """All data drawn, the chart's history fetched for the chart's final width."""
    history = app.model.history or {}
    return (
        (app.model.populated or (app.model.ever_connected and app.model.disconnect_reason))
        and app.up_to_date
        and len(history.get("step", [])) == app.history_points()
    )


async def populated(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, TrainwardenApp)
    await until(pilot, lambda: settled(app), 30, "every panel drawn")
    await pilot.pause(0.2)
    await until(pilot, lambda: settled(app), 30, "every panel drawn")


def test_main_screen_80x24(snap_compare):
    assert snap_compare(frozen_app(), terminal_size=(80, 24), run_before=populated)


def test_main_screen_160x48(snap_compare):
    assert snap_compare(frozen_app(), terminal_size=(160, 48), run_before=populated)


def test_disconnected_keeps_last_values_greyed(snap_compare):
    app = frozen_app(disconnected="the daemon closed the connection")

    async def run_before(pilot: Pilot[Any]) -> None:
        await populated(pilot)
        assert not app.model.connected and app.model.ever_connected

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_pivot_form(snap_compare):
    async def run_before(pilot: Pilot[Any]) -> None:
        await populated(pilot)
        await pilot.press("p")
        for field in pilot.app.screen.query(Input):
            field.cursor_blink = False
        await pilot.press("backspace", "backspace", "backspace", "0", ".", "5")

    assert snap_compare(frozen_app(), terminal_size=(80, 24), run_before=run_before)


def test_help_screen(snap_compare):
    async def run_before(pilot: Pilot[Any]) -> None:
        await populated(pilot)
        await pilot.press("question_mark")

    assert snap_compare(frozen_app(), terminal_size=(80, 24), run_before=run_before)
