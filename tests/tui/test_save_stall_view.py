"""The newest save's stall on the telemetry panel's checkpoint row: shown, muted, beside the
checkpoint it belongs to, and never beside another one (a frozen run and a real daemon)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import running_daemon, scripted_run
from tests.tui.fakes import FrozenClock, StaticSource, status
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from tests.tui.test_snapshots import populated
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.source import DaemonSource
from trainwarden.tui.widgets.telemetry import TelemetryPanel


def frozen_app(**fields: Any) -> TrainwardenApp:
    frozen = status()
    frozen.update(fields)
    return TrainwardenApp(StaticSource(status=frozen), clock=FrozenClock())


def ckpt_row(app: TrainwardenApp) -> str:
    region = app.screen.query_one(TelemetryPanel).region
    lines = screen_text(app).splitlines()[region.y : region.bottom]
    rows = [line[region.x : region.right].strip("│ ") for line in lines]
    return next(row for row in rows if row.startswith("ckpt "))


async def shown(app: TrainwardenApp, size: tuple[int, int]) -> str:
    async with app.run_test(size=size) as pilot:
        await populated(pilot)
        return ckpt_row(app)


async def test_the_newest_checkpoint_s_stall_is_shown_beside_it():
    app = frozen_app(
        last_save_name="step_012000.bin", last_save_stall_s=0.058, last_save_write_s=3.214
    )
    assert await shown(app, (120, 36)) == "ckpt   12,000 42s ago  next 12,500  stall 0.06 s"


async def test_a_synchronous_save_s_stall_is_its_whole_write():
    app = frozen_app(
        last_save_name="step_012000.bin", last_save_stall_s=3.214, last_save_write_s=3.2
    )
    assert (await shown(app, (160, 48))).endswith("next 12,500  stall 3.21 s")


async def test_at_80x24_the_stall_is_left_out_whole_rather_than_cut():
    app = frozen_app(last_save_name="step_012000.bin", last_save_stall_s=0.058)
    assert await shown(app, (80, 24)) == "ckpt   12,000 42s ago  next 12,500"


@pytest.mark.parametrize(
    "fields",
    [
        # An older save's report (the newest checkpoint's save said nothing).
        {"last_save_name": "step_011500.bin", "last_save_stall_s": 0.058},
        # A save the daemon has not verified yet: the row shows 12,000, not it.
        {"last_save_name": "step_012500.bin", "last_save_stall_s": 0.058},
        # A report without a stall.
        {"last_save_name": "step_012000.bin", "last_save_write_s": 3.214},
        {},
    ],
)
async def test_no_stall_is_shown_for_a_save_the_row_does_not_show(fields: dict[str, Any]):
    row = await shown(frozen_app(**fields), (120, 36))
    assert "stall" not in row, row


@pytest.mark.timeout(180)
async def test_a_real_daemon_s_save_report_shows_on_the_row(tmp_path: Path):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "30", "--save-every", "10", "--dt", "0.02", "--save-report"
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished")
        stall = daemon.status()["last_save_stall_s"]
        app = TrainwardenApp(
            DaemonSource(run_dir / ".trainwarden" / "control.sock", run_dir / "training.log")
        )
        async with app.run_test(size=(120, 36)) as pilot:
            row = await until(
                pilot, lambda: "stall" in (r := ckpt_row(app)) and r, 60, "the stall on the row"
            )
    assert row.startswith("ckpt   30 ") and row.endswith(f"stall {stall:.2f} s"), row
