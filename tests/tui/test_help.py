"""The help screen: how to close it is on screen without scrolling, at every size, and q says
what quitting does to the run (the demo stops the run it started)."""

from __future__ import annotations

import pytest

from tests.tui.fakes import FrozenClock, StaticSource
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.screens.help import HelpScreen


async def open_help(app: TrainwardenApp, pilot) -> str:  # type: ignore[no-untyped-def]
    await until(pilot, lambda: app.model.populated, 10, "data")
    await pilot.press("question_mark")
    await until(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the help screen")
    await pilot.pause(0.3)
    return screen_text(app)


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_escape_closes_is_visible_without_scrolling(size: tuple[int, int]):
    app = TrainwardenApp(StaticSource(), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        text = await open_help(app, pilot)
        assert "escape closes" in text
        assert "trainwarden - keys" in text
        assert "q  quit the TUI; the run goes on" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), 5, "closed")


async def test_help_describes_the_gpu_panel_samples_and_chart_keys():
    app = TrainwardenApp(StaticSource(), clock=FrozenClock())
    async with app.run_test(size=(120, 60)) as pilot:
        text = await open_help(app, pilot)
        assert "gpu          utilisation and memory bars, sparklines" in text
        assert "'no NVIDIA GPU' on a CPU run" in text
        assert "samples: every data arm's recent samples" in text
        assert "loss chart range" in text and "loss chart scale" in text
        assert "quit the TUI; the run goes on" in text


async def test_help_says_what_q_does_in_the_demo():
    means = "quit; the demo then stops the run it started (asks first)"
    app = TrainwardenApp(StaticSource(), clock=FrozenClock(), quit_means=means)
    async with app.run_test(size=(120, 60)) as pilot:
        text = await open_help(app, pilot)
        assert means in text
        assert "the run goes on" not in text
