"""Incidents as an operator sees them at 80x24, 120x40 and 60x20: the caption's action is
never cut, an incident stays in the events panel until a newer one replaces it, the newest
verified checkpoint stays on screen, the help and the chart's legend explain every key and
mark, toasts stay one line and off the events panel, a crash before any step shows the
trainer's last output line, and a rollback's set-aside checkpoints are told as the CLI
tells them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from textual.pilot import Pilot

from tests.tui.fakes import FrozenClock, StaticSource, checkpoint, status
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from tests.tui.test_caption import rec, spawn
from tests.tui.test_spike_views import ROLLBACK, SPIKE
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.messages import TopicPushed
from trainwarden.tui.screens.help import HelpScreen
from trainwarden.tui.widgets.caption import IncidentCaption
from trainwarden.tui.widgets.checkpoints import CheckpointsPanel
from trainwarden.tui.widgets.events import EventsPanel
from trainwarden.tui.widgets.loss_chart import LossChart

SIZES = [(80, 24), (120, 40), (60, 20)]
ids = pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")


async def drawn(app: TrainwardenApp, pilot: Pilot[Any]) -> None:
    await until(pilot, lambda: app.model.populated and app.up_to_date, 10, "every panel drawn")
    await pilot.pause(0.3)
    await until(pilot, lambda: app.up_to_date, 10, "every panel drawn")


def caption_rows(app: TrainwardenApp) -> str:
    caption = app.screen.query_one(IncidentCaption)
    top = caption.region.y
    lines = screen_text(app).splitlines()
    return "\n".join(lines[top : top + caption.region.height])


def panel_text(app: TrainwardenApp, widget: Any) -> str:
    region = widget.region
    lines = screen_text(app).splitlines()[region.y : region.y + region.height]
    return "\n".join(line[region.x : region.x + region.width] for line in lines)


# ------------------------------------------------------------------ 7: the caption's action

HANG = [
    rec(30, "stall", last_step=1_750, silent_s=15.002),
    rec(30.1, "signal", signal="SIGTERM", pid=12, reason="stall"),
    rec(
        30.5,
        "hang_dump",
        reason="hang",
        path="/runs/r/.trainwarden/hang-1750.txt",
        top_frames=["wait_for_the_data_loader_worker (loader.py:412)"],
    ),
    rec(35, "signal", signal="SIGKILL", pid=12, reason="did not exit within 5 s"),
    rec(35.1, "crash", pid=12, returncode=-9, last_step=1_750, cause="hang (no step line)"),
    rec(35.2, "restart_scheduled", backoff_s=1.0, attempt=1, resume_step=1_700),
    spawn(36, 4, 1_700),
]
BIG_SPIKE = [
    {**SPIKE, "first_step": 2_450, "step": 2_452},
    rec(20.1, "quarantine", step=2_400, name="step_002400.bin", cause="rollback"),
    {**ROLLBACK, "step": 2_300, "window": [2_301, 2_450], "spike_step": 2_450},
    spawn(20.4, 2, 2_300, rollback_from=2_450),
]


@ids
@pytest.mark.parametrize(
    ("records", "action"),
    [
        (HANG, ["restarted it from step 1,700"]),
        (BIG_SPIKE, ["rolled back to", "2,300", "2,301-2,449", "restarted"]),
    ],
    ids=["hang", "spike"],
)
async def test_the_caption_shows_what_the_daemon_did_whole(size, records, action):
    app = TrainwardenApp(StaticSource(journal=records), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        await pilot.pause(0.2)
        rows = caption_rows(app)
        assert all(piece in rows for piece in action), rows
        assert "daemon" in rows, rows
        # Under the caption the panels still show: it takes at most three rows.
        assert app.screen.query_one(IncidentCaption).region.height <= 3


# ------------------------------------------------------------------ 8: incidents stay put


def routine(start: float, count: int, first_step: int) -> list[dict[str, Any]]:
    """Checkpoints with their retention deletes, as a healthy run journals them."""
    records = []
    for i in range(count):
        step = first_step + 50 * i
        records.append(rec(start + i, "checkpoint", step=step, name=f"step_{step:06d}.bin"))
        records.append(rec(start + i + 0.5, "delete", step=step - 150, reason="retention"))
    return records


CRASH_THEN_ROUTINE = [
    rec(0, "daemon_start", pid=1),
    spawn(0.1, 1, None),
    rec(1, "crash", pid=10, returncode=3, last_step=340, cause="exit status 3"),
    rec(1.1, "restart_scheduled", backoff_s=1.0, attempt=1, resume_step=300),
    spawn(2, 2, 300),
    rec(2.1, "trainer_started", pid=11, seg=2),
    *routine(3, 12, 350),
]


@ids
async def test_an_incident_stays_in_the_events_panel_under_routine_records(size):
    app = TrainwardenApp(StaticSource(journal=CRASH_THEN_ROUTINE), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        events = panel_text(app, app.screen.query_one(EventsPanel))
        assert "crash" in events, events
        # Twelve checkpoints are one line, not twelve.
        assert events.count("checkpoint") <= 1, events
        # A newer incident replaces it.
        for record in [
            rec(40, "spike", first_step=990, step=992, peak=9.0, threshold=6.0, factor=2.0),
            *routine(41, 6, 1_000),
        ]:
            app.source._post(TopicPushed("events", record))  # type: ignore[attr-defined]
        await until(
            pilot,
            lambda: "spike" in panel_text(app, app.screen.query_one(EventsPanel)),
            10,
            "the spike",
        )


@ids
async def test_a_fast_crash_loops_folded_crashes_count_as_an_incident(size):
    repeated = rec(
        5,
        "repeated",
        cycles=7,
        ongoing=True,
        last={"crash": {"cause": "exit status 1", "last_line": "boom"}},
    )
    journal = [*CRASH_THEN_ROUTINE[:6], repeated, *routine(6, 10, 350)]
    app = TrainwardenApp(StaticSource(journal=journal), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        events = panel_text(app, app.screen.query_one(EventsPanel))
        assert "repeated" in events, events


# ------------------------------------------------------------------ 9: newest checkpoint


def many_checkpoints() -> dict[str, Any]:
    s = status()
    s["checkpoints"] = [checkpoint(9_000 + 500 * i, 3600 - 300 * i) for i in range(7)]
    s["quarantined"] = [
        {
            "name": "step_008000.bin",
            "step": 8_000,
            "why": "failed verification: size",
            "alarming": True,
        },
        {
            "name": "step_008500.bin",
            "step": 8_500,
            "why": "set aside by the pivot at step 8,400",
            "alarming": False,
        },
    ]
    return s


@ids
async def test_the_newest_checkpoint_stays_on_screen(size):
    app = TrainwardenApp(StaticSource(status=many_checkpoints()), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        panel = app.screen.query_one(CheckpointsPanel)
        assert "12,000" in panel_text(app, panel), panel_text(app, panel)
        # The operator walks down to an old checkpoint (to pin it) ...
        await pilot.press(*["down"] * 6)
        await pilot.pause(0.3)
        assert "12,000" in panel_text(app, panel), panel_text(app, panel)
        # ... and a newer one is committed meanwhile.
        view = {
            "checkpoints": [*many_checkpoints()["checkpoints"], checkpoint(12_500, 1)],
            "quarantined": many_checkpoints()["quarantined"],
        }
        app.source._post(TopicPushed("checkpoints", view))  # type: ignore[attr-defined]
        await until(pilot, lambda: app.up_to_date, 10, "drawn")
        await pilot.pause(0.3)
        assert "12,500" in panel_text(app, panel), panel_text(app, panel)


# ------------------------------------------------------------------ 10: help, legend, MFU, toasts


async def test_help_lists_every_key_and_mark():
    app = TrainwardenApp(StaticSource(), clock=FrozenClock())
    async with app.run_test(size=(120, 60)) as pilot:
        await until(pilot, lambda: app.model.populated, 10, "data")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the help screen")
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "ctrl+p" in text, text
        for mark in ("× validation", "S spike", "» skip"):
            assert mark in text, text


@ids
async def test_the_chart_legend_fits(size):
    app = TrainwardenApp(StaticSource(), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        chart = app.screen.query_one(LossChart)
        if not chart.display:
            return  # hidden below 80 columns
        bottom = screen_text(app).splitlines()[chart.region.bottom - 1]
        border = bottom[chart.region.x : chart.region.right]
        assert "…" not in border, border
        for mark in ("R ", "C ", "P "):
            assert mark in border, border


def unknown_gpu() -> dict[str, Any]:
    s = status()
    s.update(mfu=None, mfu_unknown_reason="unknown GPU 'NVIDIA L4': set [telemetry] peak_tflops")
    return s


@ids
async def test_the_mfu_hint_names_the_key_at_every_width(size):
    app = TrainwardenApp(StaticSource(status=unknown_gpu()), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        row = next(line for line in screen_text(app).splitlines() if "MFU" in line)
        assert "peak_tflops" in row, row


@ids
async def test_toasts_stay_one_line_and_off_the_events_panel(size):
    app = TrainwardenApp(StaticSource(), clock=FrozenClock())
    async with app.run_test(size=size, notifications=True) as pilot:
        await drawn(app, pilot)
        events_before = panel_text(app, app.screen.query_one(EventsPanel))
        app.tell("trainer crashed at step 340 (exit 3); daemon restarted it from step 300")
        app.tell("checkpoint saved at step 12000 (step_012000.bin)")
        await pilot.pause(0.5)
        toasts = list(app.screen.query("Toast"))
        assert toasts
        assert all(toast.region.height == 1 for toast in toasts), [t.region for t in toasts]
        events = app.screen.query_one(EventsPanel).region
        assert not any(toast.region.overlaps(events) for toast in toasts)
        assert panel_text(app, app.screen.query_one(EventsPanel)) == events_before


# ------------------------------------------------------------------ 11: crash before any step

NO_STEP = [
    rec(0, "daemon_start", pid=1),
    spawn(0.1, 1, None),
    rec(
        1,
        "crash",
        pid=10,
        returncode=1,
        last_step=None,
        cause="exit status 1",
        last_line="ModuleNotFoundError: No module named 'torch'",
    ),
    rec(1.1, "restart_scheduled", backoff_s=80.0, attempt=3, resume_step=None),
]


def backoff_without_a_step() -> dict[str, Any]:
    s = status()
    s.update(
        state="backoff",
        detail={"restart_in_s": 44.0},
        trainer_pid=None,
        step=None,
        loss=None,
        loss_ema=None,
        tokens_per_s=None,
        steps_per_min=None,
        eta_s=None,
        mfu=None,
        last_line="ModuleNotFoundError: No module named 'torch'",
        last_line_age_s=3.0,
    )
    return s


@ids
async def test_a_crash_before_any_step_shows_the_last_output_line_and_one_countdown(size):
    source = StaticSource(status=backoff_without_a_step(), journal=NO_STEP)
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.up_to_date and app.model.phase == "backoff", 10, "drawn")
        await pilot.pause(0.3)
        text = screen_text(app)
        rows = caption_rows(app)
        assert "step -" not in rows, rows
        assert "No module named 'torch'" in text, text
        assert "restart in 44s" in text, text
        # One countdown: the caption does not count a second one of its own.
        assert not re.search(r"in [\d.]+ ?s\b", rows), rows


# ------------------------------------------------------------------ 5: set aside by a rollback


def after_a_spike_rollback() -> dict[str, Any]:
    s = status()
    why = "set aside by the rollback before the loss spike at step 2,450"
    aside = {"cause": "rollback", "cause_step": 2_450, "alarming": False, "why": why}
    s["quarantined"] = [
        {"name": "step_002400.bin", "step": 2_400, **aside},
        {"name": "step_002400.json", "step": 2_400, **aside},
    ]
    s["last_checkpoint_step"] = 12_477
    s["last_checkpoint_age_s"] = 2.0
    s["quarantined"].append({"name": "step_012477.bin", "step": 12_477, **aside})
    return s


@ids
async def test_set_aside_checkpoints_are_told_as_the_cli_tells_them(size):
    app = TrainwardenApp(StaticSource(status=after_a_spike_rollback()), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        panel = panel_text(app, app.screen.query_one(CheckpointsPanel))
        assert "pivot" not in panel, panel
        assert "(3" not in panel and "(2" in panel, panel
        assert "set aside" in panel, panel
        if size[0] >= 80:
            assert "rollback" in panel, panel
        # The telemetry's newest checkpoint is one that may be resumed from.
        row = next(line for line in screen_text(app).splitlines() if "ckpt" in line)
        assert "12,477" not in row and "12,000" in row, row
