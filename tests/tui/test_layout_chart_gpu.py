"""Layout at small sizes, the loss chart's modes, the GPU panel, the samples screen, the
command palette and mouse clicks, on a frozen run (tests/tui/fakes.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.pilot import Pilot
from textual.widgets._toast import Toast

from tests.tui.fakes import FrozenClock, StaticSource, loss_history, status
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from tests.tui.test_snapshots import populated
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.chart import VALIDATION_GLYPH, render_chart
from trainwarden.tui.messages import TopicPushed
from trainwarden.tui.screens.main import MainScreen
from trainwarden.tui.screens.samples import SamplesScreen
from trainwarden.tui.widgets.checkpoints import CheckpointsPanel
from trainwarden.tui.widgets.events import EventsPanel
from trainwarden.tui.widgets.loss_chart import LossChart


def gpu_sample(i: int, **changes: Any) -> dict[str, Any]:
    return {
        **status()["gpu"],
        "util_percent": 40 + (i * 7) % 60,
        "temperature_c": 60 + i % 12,
        "power_w": 250.0 + (i * 13) % 200,
        **changes,
    }


class GpuSource(StaticSource):
    """The frozen run, plus a few minutes of GPU pushes (the sparklines' data)."""

    def __init__(self, gpu: list[dict[str, Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gpu_pushes = gpu if gpu is not None else [gpu_sample(i) for i in range(40)]

    async def run(self, post, history_args):  # type: ignore[no-untyped-def]
        for sample in self.gpu_pushes:
            post(TopicPushed("gpu", sample))
            # GPU frames replace each other while queued: let each be taken first.
            await asyncio.sleep(0.01)
        await super().run(post, history_args)


def frozen(source: StaticSource | None = None) -> TrainwardenApp:
    return TrainwardenApp(source or GpuSource(), clock=FrozenClock())


def chart(app: TrainwardenApp) -> LossChart:
    return app.main_screen.query_one(LossChart)


def axis_right_label(app: TrainwardenApp) -> str:
    return chart(app).drawn[-1].plain.split()[-1]


# ---------------------------------------------------------------- layout


def test_main_screen_60x20(snap_compare):
    app = frozen()

    async def run_before(pilot: Pilot[Any]) -> None:
        await populated(pilot)
        text = screen_text(app)
        footer = text.splitlines()[-1]
        for key in ("s save", "x stop", "r start", "p pivot", "P pin", "m samples", "q quit"):
            assert key in footer, footer
        assert "step   12,000 / 50,000" in text
        assert "checkpoints" in text and "events" in text
        assert not app.main_screen.query_one("#bandit").display  # hidden, not squeezed

    assert snap_compare(app, terminal_size=(60, 20), run_before=run_before)


def test_main_screen_80x24(snap_compare):
    app = frozen()

    async def run_before(pilot: Pilot[Any]) -> None:
        await populated(pilot)
        text = screen_text(app)
        assert "loss · whole run" in text
        assert "util ██████████  98%" in text and "mem  █████████░ 21.4/24.0 GiB" in text
        assert "q quit" in text.splitlines()[-1] and "^p palette" in text.splitlines()[-1]

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_main_screen_120x40(snap_compare):
    app = frozen()

    async def run_before(pilot: Pilot[Any]) -> None:
        await populated(pilot)
        text = screen_text(app)
        assert "throttle none" in text and "2610 MHz" in text
        assert "m samples" in text

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


async def test_toasts_leave_the_events_panel_uncovered_at_80x24():
    app = frozen()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await populated(pilot)
        app.tell("checkpoint saved at step 12000 (step_012000.bin)")
        app.tell("trainer starting from step 12000")
        await until(pilot, lambda: len(app.screen.query(Toast)) == 2, 10, "two toasts")
        await pilot.pause(0.3)
        events = app.main_screen.query_one(EventsPanel).region
        for toast in app.screen.query(Toast):
            assert toast.region.area > 0
            assert not toast.region.overlaps(events), (toast.region, events)


# ---------------------------------------------------------------- chart


async def test_chart_keys_change_the_range_and_scale_it_draws():
    source = GpuSource()
    app = frozen(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await populated(pilot)
        whole = chart(app).drawn
        assert "step 1 " in whole[-1].plain and axis_right_label(app) == "12,000"
        assert "start" not in source.history_requests[-1]

        await pilot.press("c")
        await until(
            pilot, lambda: (chart(app).history or {}).get("first_step") == 11_001, 10, "last 1k"
        )
        await pilot.pause(0.3)
        assert source.history_requests[-1]["start"] == 11_001
        assert "loss · last 1k steps" in screen_text(app)
        assert "step 11,001" in chart(app).drawn[-1].plain
        assert axis_right_label(app) == "12,000"
        # The crash (4,000) and pivot (9,000) lie outside the last 1k steps: no letters.
        assert set(chart(app).drawn[-2].plain.strip()) <= {"└", "─"}

        linear_top = chart(app).drawn[0].plain.split()[0]
        linear_curve = [line.plain for line in chart(app).drawn[:-2]]
        await pilot.press("y")
        await pilot.pause(0.3)
        assert "loss · last 1k steps, log" in screen_text(app)
        history = chart(app).history or {}
        means = [m for m in history["mean"] if m is not None]
        # The labels name the loss itself; the top one is the range's highest mean.
        assert chart(app).drawn[0].plain.split()[0] == f"{max(means):.2f}" == linear_top
        bottom = [line for line in chart(app).drawn[:-2] if "┤" in line.plain][-1]
        assert bottom.plain.split()[0] == f"{min(means):.2f}"
        # Same data, other scale: the dots moved.
        assert [line.plain for line in chart(app).drawn[:-2]] != linear_curve

        for expected in ("last 10k steps", "last 10%", "whole run"):
            await pilot.press("c")
            await until(pilot, lambda e=expected: f"loss · {e}" in screen_text(app), 10, expected)
        await until(pilot, lambda: "start" not in source.history_requests[-1], 10, "whole run")


async def test_axis_label_keeps_up_with_the_newest_step():
    source = GpuSource()
    source.history_steps = 3_800
    app = frozen(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await populated(pilot)
        assert axis_right_label(app) == "3,800"
        # The run moves on: the telemetry says step 21,300 before any history poll.
        source.history_steps = 21_300
        app.post_message(TopicPushed("telemetry", {**status(), "step": 21_300}))
        await until(pilot, lambda: axis_right_label(app) == "21,300", 10, "the axis at 21,300")
        assert chart(app).newest_drawn_step == 21_300


def test_validation_series_is_drawn_as_marks_distinct_from_the_curve():
    history = loss_history(60, 12_000, markers=False)
    plain = [line.plain for line in render_chart(history, 40, 8)]
    assert not any(VALIDATION_GLYPH in line for line in plain)
    history["val"] = {"step": [3000, 6000, 11_000], "loss": [3.2, 2.6, 2.4]}
    plain = [line.plain for line in render_chart(history, 40, 8)]
    assert sum(line.count(VALIDATION_GLYPH) for line in plain) == 3


def test_chart_modes_snapshot(snap_compare):
    async def run_before(pilot: Pilot[Any]) -> None:
        await populated(pilot)
        await pilot.press("c", "y")
        app = pilot.app
        assert isinstance(app, TrainwardenApp)
        await until(pilot, lambda: "start" in app.source.history_requests[-1], 10, "last 1k")  # type: ignore[attr-defined]
        await populated(pilot)

    assert snap_compare(frozen(), terminal_size=(80, 24), run_before=run_before)


# ---------------------------------------------------------------- gpu


async def test_gpu_sparklines_and_a_marked_throttle_warning():
    throttled = [gpu_sample(i) for i in range(39)]
    throttled.append(gpu_sample(39, throttle_reasons=["sw_power_cap"], alarming=True))
    source = GpuSource(gpu=throttled, status={**status(), "gpu": throttled[-1]})
    app = frozen(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await populated(pilot)
        lines = screen_text(app).splitlines()
        assert any("⚠ throttled: sw_power_cap" in line for line in lines)
        util = next(line for line in lines if "util █" in line)
        # One glyph per push, scaled 0..100%: more than one level shows.
        glyphs = {ch for ch in util if ch in "▁▂▃▄▅▆▇█"} - {"█"}
        assert len(glyphs) >= 3, util
        assert len(app.model.gpu_samples) == 40


async def test_no_gpu_is_one_line():
    cpu = {**status(), "gpu": None, "gpu_status": "no NVIDIA GPU (CPU run)"}
    app = frozen(StaticSource(status=cpu))
    async with app.run_test(size=(80, 24)) as pilot:
        await populated(pilot)
        assert "no NVIDIA GPU (CPU run)" in screen_text(app)
        assert "util" not in str(app.main_screen.query_one("#gpu").render())


# ---------------------------------------------------------------- samples


def test_samples_screen(snap_compare):
    app = frozen()

    async def run_before(pilot: Pilot[Any]) -> None:
        await populated(pilot)
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, SamplesScreen), 10, "samples")
        await pilot.pause(0.2)
        text = screen_text(app)
        assert "escape closes" in text.splitlines()[0]
        assert "@12,000  the request handler returns [bold]early[/bold]" in text
        assert "@11,500  old docs sample" in text  # older samples too, not only the newest
        assert "def parse(line): return line.split()" in text  # the escape is gone
        assert "\x1b" not in text

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


async def test_samples_screen_closes_on_escape_and_shows_whole_samples():
    long_text = "token " * 200
    source = GpuSource()
    app = frozen(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await populated(pilot)
        app.post_message(
            TopicPushed("samples", {"samples": [{"arm": "docs", "step": 7, "text": long_text}]})
        )
        await pilot.pause(0.3)
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, SamplesScreen), 10, "samples")
        await pilot.pause(0.2)
        body = str(app.screen.query_one("#samples-body").render())
        assert long_text.strip() in " ".join(body.split())
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, MainScreen), 10, "main again")


# ---------------------------------------------------------------- palette, mouse


async def test_palette_runs_an_action_typed_by_name():
    app = frozen()
    async with app.run_test(size=(80, 24)) as pilot:
        await populated(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"chart range")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: "loss · last 1k steps" in screen_text(app), 10, "the mode")
        assert chart(app).mode.range_index == 1

        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"samples")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SamplesScreen), 10, "samples")


def test_palette_lists_every_action():
    from trainwarden.tui.app import PALETTE

    actions = {action for _, _, action in PALETTE}
    assert actions >= {
        "save",
        "stop",
        "start",
        "pivot",
        "pin",
        "log",
        "help",
        "samples",
        "chart_range",
        "chart_scale",
        "quit",
    }
    for action in actions:
        assert callable(getattr(TrainwardenApp, f"action_{action}"))


async def test_mouse_clicks_on_panels():
    app = frozen()
    async with app.run_test(size=(80, 24)) as pilot:
        await populated(pilot)
        panel = app.main_screen.query_one(CheckpointsPanel)
        assert (panel.selected_checkpoint(app.model) or {}).get("step") == 12_000
        # Row 0 is the header; row 3 is the third checkpoint, 11,000.
        await pilot.click("#checkpoint-table", offset=(2, 3))
        await pilot.pause(0.2)
        assert (panel.selected_checkpoint(app.model) or {}).get("step") == 11_000

        await pilot.click("#chart", offset=(20, 3))
        await until(pilot, lambda: chart(app).mode.range_index == 1, 10, "next chart mode")

        await pilot.click("#events", offset=(10, 2))
        await pilot.pause(0.3)
        assert isinstance(app.screen, MainScreen)  # nothing harmful happens

        await pilot.click("#bandit", offset=(10, 2))
        await until(pilot, lambda: isinstance(app.screen, SamplesScreen), 10, "samples")


def test_the_palettes_quit_says_what_quitting_does_to_the_run():
    from trainwarden.supervisor.cli.demo import QUIT_STOPS_OWN_RUN

    def quit_help(app: TrainwardenApp) -> str:
        return next(c.help for c in app.get_system_commands(MainScreen()) if c.title == "Quit")

    assert quit_help(frozen()) == "Quit the TUI; the run goes on (q)"
    demo = TrainwardenApp(StaticSource(), clock=FrozenClock(), quit_means=QUIT_STOPS_OWN_RUN)
    assert quit_help(demo).startswith("Quit; the demo then stops the run it started")
