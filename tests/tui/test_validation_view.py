"""Held-out validation in the TUI: the telemetry panel's `val` row (the newest loss and its
step; a nan says it is not acted on) and the loss chart's `×` series, from a frozen run and
from a real daemon's history replies."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.support import running_daemon, scripted_run
from tests.tui.fakes import FrozenClock, StaticSource, status
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from tests.tui.test_snapshots import populated
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.chart import VALIDATION_GLYPH
from trainwarden.tui.source import DaemonSource
from trainwarden.tui.widgets.loss_chart import LossChart
from trainwarden.tui.widgets.telemetry import TelemetryPanel

VAL_STEPS = [2000, 4000, 6000, 8000, 10_000, 12_000]
SIZE = (120, 36)
"""The val row sits under the checkpoint row: at 80x24 the panel shows the six above it."""


def val_loss(step: int) -> float:
    """On the fakes' training curve, a little above it (held-out data)."""
    x = step / 12_000
    return round(2.3 + 3.4 * math.exp(-6 * x), 4)


class ValidatedSource(StaticSource):
    """The frozen run of the other snapshots, with evaluations in its history replies."""

    def __init__(self, newest_loss: float | str, **kwargs: Any) -> None:
        frozen = status()
        frozen.update(val_step=VAL_STEPS[-1], val_loss=newest_loss)
        super().__init__(status=frozen, **kwargs)

    def history(self) -> dict[str, Any]:
        reply = super().history()
        start = reply["first_step"] or 0
        steps = [s for s in VAL_STEPS if s >= start]
        reply["val"] = {"step": steps, "loss": [val_loss(s) for s in steps]}
        return reply


def frozen_app(newest_loss: float | str = 2.3084) -> TrainwardenApp:
    return TrainwardenApp(ValidatedSource(newest_loss), clock=FrozenClock())


def panel_text(app: TrainwardenApp, widget: type[Any]) -> str:
    """What the widget shows on screen (its border and title included), as text."""
    region = app.screen.query_one(widget).region
    lines = screen_text(app).splitlines()[region.y : region.bottom]
    return "\n".join(line[region.x : region.right] for line in lines)


def val_row(telemetry: str) -> str:
    return next(line for line in telemetry.splitlines() if line.lstrip("│ ").startswith("val "))


def test_validation_on_the_main_screen_120x36(snap_compare):
    assert snap_compare(frozen_app(), terminal_size=SIZE, run_before=populated)


async def test_the_panel_shows_the_newest_evaluation_and_the_chart_its_series():
    app = frozen_app()
    async with app.run_test(size=SIZE) as pilot:
        await populated(pilot)
        telemetry = panel_text(app, TelemetryPanel)
        chart = panel_text(app, LossChart)
        text = screen_text(app)
    row = val_row(telemetry)
    assert "2.3084 at 12,000" in row
    assert "not acted on" not in row
    assert chart.count(VALIDATION_GLYPH) >= 4, chart
    assert "× val" in text


async def test_a_nan_evaluation_is_shown_as_reported_not_acted_on():
    app = frozen_app("nan")
    async with app.run_test(size=SIZE) as pilot:
        await populated(pilot)
        telemetry = panel_text(app, TelemetryPanel)
    row = val_row(telemetry)
    assert "nan at 12,000  not acted on" in row


async def test_no_val_row_and_no_val_legend_before_the_first_evaluation():
    app = TrainwardenApp(StaticSource(), clock=FrozenClock())
    async with app.run_test(size=SIZE) as pilot:
        await populated(pilot)
        telemetry = panel_text(app, TelemetryPanel)
        text = screen_text(app)
    with pytest.raises(StopIteration):
        val_row(telemetry)
    assert "× val" not in text


@pytest.mark.timeout(180)
async def test_the_chart_draws_a_real_daemons_evaluations(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "400", "--dt", "0.02", "--eval-every", "50",
        trainer={"stop_timeout_s": 10.0, "total_steps": 400},
    )  # fmt: skip
    with running_daemon(run_dir):
        app = TrainwardenApp(
            DaemonSource(run_dir / ".trainwarden" / "control.sock", run_dir / "training.log")
        )
        async with app.run_test(size=SIZE) as pilot:
            # The last evaluation comes after the last step line: a later history fetch
            # brings it.
            history = await until(
                pilot,
                lambda: (
                    (h := app.model.history or {}).get("val", {}).get("step", [])[-1:] == [400]
                    and h
                ),
                120,
                "the final evaluation in the chart's history",
            )
            await pilot.pause(0.5)
            chart = panel_text(app, LossChart)
            telemetry = panel_text(app, TelemetryPanel)
            text = screen_text(app)
    assert history["val"]["step"] == list(range(50, 401, 50))
    assert history["val"]["loss"] == [pytest.approx(5.2 - 0.001 * s) for s in range(50, 401, 50)]
    assert VALIDATION_GLYPH in chart and "× val" in text
    row = val_row(telemetry)
    assert "4.8000 at 400" in row
