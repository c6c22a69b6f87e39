"""The header and the telemetry panel tell the truth, on frozen data at 80x24, 120x40 and
60x20: the progress bar, the next checkpoint on the cadence and never past the total, no
speed or ETA while the trainer is not stepping, the checkpoint's age from its file, stale
figures marked with their age, warnings marked with `!`, and a slow start's last line."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.tui.fakes import FrozenClock, StaticSource, status
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from tests.tui.test_snapshots import populated
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.messages import TopicPushed
from trainwarden.tui.widgets.header import progress_bar
from trainwarden.tui.widgets.telemetry import sparkline

SIZES = [(80, 24), (120, 40), (60, 20)]
NUMBER = re.compile(r"\d[\d,.]*")


def running() -> dict[str, Any]:
    return status()


def stopped() -> dict[str, Any]:
    """The operator stopped the trainer; its last frame's figures are what the daemon keeps."""
    s = status()
    s.update(
        state="stopped",
        trainer_pid=None,
        trainer_uptime_s=None,
        tokens_per_s=None,
        steps_per_min=None,
        eta_s=None,
        mfu=None,
        step_age_s=200.0,
        next_checkpoint_step=12_500,
    )
    return s


def stopped_stale_daemon() -> dict[str, Any]:
    """An older daemon that still reports its last speed and ETA after a stop."""
    s = status()
    s.update(state="stopped", trainer_pid=None, trainer_uptime_s=None, eta_s=7942.0)
    return s


def finished() -> dict[str, Any]:
    s = status()
    s.update(
        state="finished",
        trainer_pid=None,
        trainer_uptime_s=None,
        step=50_000,
        tokens_per_s=None,
        steps_per_min=None,
        eta_s=None,
        mfu=None,
        last_checkpoint_step=50_000,
        next_checkpoint_step=None,
    )
    return s


def after_daemon_restart() -> dict[str, Any]:
    """A daemon restarted a moment ago: the newest checkpoint's file is 1m 51s old."""
    s = status()
    s.update(daemon_started_at=1_767_225_596.0, last_checkpoint_age_s=111.0)
    return s


def starting_slowly() -> dict[str, Any]:
    s = status()
    s.update(
        state="starting",
        trainer_uptime_s=95.0,
        tokens_per_s=None,
        steps_per_min=None,
        eta_s=None,
        mfu=None,
        last_line="loading shard 3/8 of \x1b[31mtokens.bin\x1b[0m",
        last_line_age_s=4.0,
    )
    return s


def warned() -> dict[str, Any]:
    s = status()
    s["disk_low"] = True
    s["resume_audit"] = {"status": "drift", "step": 11_520}
    s["gpu"] = {**s["gpu"], "throttle_reasons": ["hw_thermal"], "alarming": True}
    return s


async def shown(app: TrainwardenApp, size: tuple[int, int]) -> str:
    async with app.run_test(size=size) as pilot:
        await populated(pilot)
        return screen_text(app)


def frozen(make: Callable[[], dict[str, Any]]) -> TrainwardenApp:
    return TrainwardenApp(StaticSource(status=make()), clock=FrozenClock())


def header_of(text: str) -> str:
    return text.splitlines()[0]


def telemetry_rows(text: str) -> dict[str, str]:
    """The telemetry panel's rows by label (the panel is the screen's left column, drawn
    without its border on a compact screen)."""
    rows = {}
    for line in text.splitlines()[2:]:
        cell = line.split("│")
        if len(cell) < 2:
            if "─" in line:
                continue
            cell = ["", line]
        words = cell[1].split(None, 1)
        if len(words) == 2:
            rows.setdefault(words[0], words[1].rstrip())
    return rows


def assert_numbers_whole(header: str) -> None:
    """No number on the header is cut: the line is not ellipsised inside one."""
    assert "…" not in header, header


# ----------------------------------------------------------------------------- pieces


def test_the_progress_bar_reads_without_colour():
    assert progress_bar(0.0, 10).plain == "─" * 10
    bar = progress_bar(0.45, 10).plain
    assert bar == "━━━━╸─────", bar
    assert progress_bar(1.0, 10).plain == "━" * 10


def test_the_sparkline_follows_the_shape_of_the_series():
    assert sparkline([1.0, 2.0, 3.0, 4.0], 4) == "▁▃▆█"
    assert sparkline([5.0] * 10, 4) == "▄▄▄▄"
    assert sparkline([], 8) == "" and sparkline([3.0], 8) == ""
    assert len(sparkline([float(i % 7) for i in range(500)], 12)) == 12


# ----------------------------------------------------------------------------- screens


@pytest.mark.parametrize("size", SIZES)
async def test_running_shows_progress_eta_and_the_next_checkpoint(size: tuple[int, int]):
    text = await shown(frozen(running), size)
    header = header_of(text)
    assert len(header.rstrip()) <= size[0]
    assert "━" in header and "─" in header and " 24%" in header, header
    assert "ETA 2h 37m" in header, header
    assert_numbers_whole(header)
    rows = telemetry_rows(text)
    assert rows["ckpt"].startswith("12,000 42s ago  next 12,500"), rows
    assert "66.0k tok/s" in rows["speed"]
    assert rows["ETA"] == "2h 37m"
    if size[0] >= 120:
        assert "12,000/50,000" in header and "pid 4242" in header


@pytest.mark.parametrize("size", SIZES)
async def test_stopped_shows_no_speed_and_no_eta(size: tuple[int, int]):
    text = await shown(frozen(stopped), size)
    header = header_of(text)
    assert "STOPPED" in header and "ETA" not in header and " 24%" in header, header
    rows = telemetry_rows(text)
    assert "tok/s" not in rows["speed"] and "trainer stopped" in rows["speed"], rows
    assert rows["ETA"].startswith("- "), rows
    assert "run avg 39.9%" in rows["MFU"] and not rows["MFU"].startswith("41"), rows
    # The last loss is 3m 20s old: it says so.
    assert "(3m 20s ago)" in rows["loss"], rows
    assert "next 12,500" in rows["ckpt"]


async def test_a_stale_daemon_reply_is_not_shown_as_a_speed_after_a_stop():
    """Even when the reply still carries the last speed and ETA, a stopped trainer has none."""
    text = await shown(frozen(stopped_stale_daemon), (80, 24))
    rows = telemetry_rows(text)
    assert "tok/s" not in rows["speed"] and "2h 12m" not in text, rows
    assert "ETA" not in header_of(text)


@pytest.mark.parametrize("size", SIZES)
async def test_finished_is_full_and_has_no_next_checkpoint(size: tuple[int, int]):
    text = await shown(frozen(finished), size)
    header = header_of(text)
    assert "FINISHED" in header and "100%" in header and "╸" not in header, header
    assert "─" not in header.split("FINISHED")[1].split("100%")[0], header
    assert "ETA" not in header
    rows = telemetry_rows(text)
    assert "next" not in rows["ckpt"], rows
    assert rows["ETA"] == "done"
    assert "tok/s" not in rows["speed"]


@pytest.mark.parametrize("size", SIZES)
async def test_after_a_daemon_restart_the_checkpoint_age_is_the_files(size: tuple[int, int]):
    text = await shown(frozen(after_daemon_restart), size)
    rows = telemetry_rows(text)
    assert rows["ckpt"].startswith("12,000 1m 51s ago"), rows


async def test_the_next_checkpoint_is_never_past_the_total():
    def near_the_end() -> dict[str, Any]:
        s = status()
        s.update(step=49_900, next_checkpoint_step=50_000, eta_s=25.0)
        return s

    rows = telemetry_rows(await shown(frozen(near_the_end), (80, 24)))
    assert "next 50,000" in rows["ckpt"], rows
    for number in NUMBER.findall(rows["ckpt"]):
        assert int(number.replace(",", "").split(".")[0]) <= 50_000


async def test_a_slow_start_shows_the_trainers_last_line_cleaned():
    text = await shown(frozen(starting_slowly), (80, 24))
    rows = telemetry_rows(text)
    assert rows["start"].startswith("up 1m 35s: loading shard 3/8"), rows
    assert "\x1b" not in text and "ETA" not in header_of(text)
    wide = telemetry_rows(await shown(frozen(starting_slowly), (160, 48)))
    # The escape sequences are gone, the words stay.
    assert wide["start"].startswith("up 1m 35s: loading shard 3/8 of tokens.b"), wide


async def test_warnings_are_marked_so_they_read_without_colour():
    text = await shown(frozen(warned), (120, 40))
    header = header_of(text)
    assert "! DISK LOW" in header and "! resume drift @11520" in header, header
    assert "! GPU THROTTLED" in header, header


async def test_warnings_are_kept_before_lesser_fields_at_80_columns():
    text = await shown(frozen(warned), (80, 24))
    header = header_of(text)
    assert "! DISK LOW" in header and "! resume drift @11520" in header, header
    assert "pid" not in header and "restarts" not in header, header
    assert_numbers_whole(header)


async def test_the_speed_sparkline_is_drawn_from_the_frames_received():
    clock = FrozenClock()
    app = TrainwardenApp(StaticSource(status=running()), clock=clock)

    async with app.run_test(size=(120, 40)) as pilot:
        await populated(pilot)
        frame = {**(app.model.telemetry.value or {})}
        for i in range(60):
            clock.mono += 5.0
            frame["tokens_per_s"] = 40_000.0 + 1_000.0 * (i % 12)
            app.post_message(TopicPushed("telemetry", dict(frame)))
            await pilot.pause()
        await pilot.pause(0.3)
        rows = telemetry_rows(screen_text(app))
        assert any(c in rows["speed"] for c in "▁▂▃") and "█" in rows["speed"], rows
        # Bounded: only the last five minutes are kept.
        assert len(app.model.tokens_per_s) <= 5 * 60 / 2 + 2


# ----------------------------------------------------------------------------- looks


@pytest.mark.parametrize(
    ("make", "size"),
    [(running, (80, 24)), (stopped, (60, 20)), (finished, (120, 40))],
    ids=["running-80x24", "stopped-60x20", "finished-120x40"],
)
def test_header_and_telemetry_look(snap_compare, make, size):
    assert snap_compare(frozen(make), terminal_size=size, run_before=populated)


async def test_a_resized_terminal_gets_the_header_fitted_again():
    """The header drops fields for its width: after a resize it is fitted to the new one
    (with a frozen clock nothing else would draw it again)."""
    app = frozen(running)
    async with app.run_test(size=(160, 48)) as pilot:
        await populated(pilot)
        assert "pid 4242" in header_of(screen_text(app))
        await pilot.resize_terminal(60, 20)
        await until(pilot, lambda: "pid 4242" not in header_of(screen_text(app)), 10, "refit")
        header = header_of(screen_text(app))
        assert "━" in header and " 24%" in header, header
        assert_numbers_whole(header)


# ----------------------------------------------------------------------------- one format


def restarted_and_edited() -> dict[str, Any]:
    """Four restarts of three causes, and a config file edited since the daemon read it."""
    s = status()
    s.update(
        restarts=4,
        restarts_by_cause={"crash": 2, "divergence": 1, "spike": 1},
        config_changed=True,
        config_notice=(
            "trainwarden.toml changed since the daemon read it at 2026-12-05 09:00:00 UTC:"
            " the daemon still runs the old settings"
        ),
    )
    return s


async def test_status_and_the_tui_write_each_figure_the_same_way():
    """`trainwarden status` and the TUI: the same step, loss, speed, pace and ETA text,
    and the checkpoints newest first in both."""
    from trainwarden.supervisor.cli.output import format_status

    frame = running()
    printed = format_status(frame)  # type: ignore[arg-type]
    text = await shown(frozen(running), (120, 40))
    rows = telemetry_rows(text)
    for figure, row in (
        ("12,000", "step"),
        ("2.3187", "loss"),
        ("66.0k tok/s", "speed"),
        ("242", "speed"),
        ("2h 37m", "ETA"),
    ):
        assert figure in rows[row], (figure, rows)
        assert figure in printed, (figure, printed)
    assert "eta 2h 37m" in printed and "12,000/50,000" in printed, printed
    assert "ckpts     4 verified, newest first: 12,000  11,500  11,000  10,000*" in printed
    shown_steps = [int(n.replace(",", "")) for n in re.findall(r"\b\d{2},\d{3}\b", text)]
    panel = [n for n in shown_steps if n in (10_000, 11_000, 11_500)]
    assert panel == sorted(panel, reverse=True), text


@pytest.mark.parametrize("size", SIZES)
async def test_an_edited_config_is_on_screen_at_every_size(size: tuple[int, int]):
    text = await shown(frozen(restarted_and_edited), size)
    header = header_of(text)
    assert "! CONFIG CHANGED" in header and "! trainwarden.toml" not in header, header
    if size[0] >= 80:
        assert "ETA 2h 37m" in header, header
    # What to do, whole, in the telemetry panel (the first of its hints).
    assert telemetry_rows(text)["hint"].startswith("trainwarden.toml changed"), text


async def test_restarts_by_cause_where_there_is_room():
    header = header_of(await shown(frozen(restarted_and_edited), (200, 40)))
    assert "restarts 4 (crash 2, divergence 1, spike 1)" in header, header
    narrow = header_of(await shown(frozen(restarted_and_edited), (120, 40)))
    # Dropped whole before anything else when the line is short of room.
    assert "(crash" not in narrow and "restarts 4" in narrow, narrow
