"""The header names the Slurm job the daemon runs in, where the line has room: at 120
columns, where the trainer's uptime and step/total make room for it, and at 80 it is
dropped (`status` says it whole), before the pid. Outside a job there is none. The header alone, in a tiny app, on the frozen run's
status."""

from __future__ import annotations

from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.content import Content

from tests.tui.fakes import FrozenClock, status
from trainwarden.tui.model import RunModel
from trainwarden.tui.widgets.header import RunHeader

JOB = {
    "job_id": "4242",
    "name": "train-gpt",
    "node": "node01",
    "partition": "gpu",
    "restart_count": 2,
    "time_limit_s": 7200,
    "end_time": 1_767_229_920.0,
    "ends_in_s": 4320.0,
    "limit_note": None,
}


def in_a_job(**job: Any) -> dict[str, Any]:
    s = status()
    s["slurm"] = {**JOB, **job}
    return s


class HeaderApp(App[None]):
    CSS_PATH = "../../tui/trainwarden.tcss"

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        self.model = RunModel(clock=FrozenClock())
        self.model.set_connected({"protocol": 1, "run": s["run"]})
        self.model.apply_status(s)

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")

    def panel_resized(self, panel: str) -> None:
        self.query_one(RunHeader).show(self.model)


async def header(s: dict[str, Any], width: int) -> str:
    app = HeaderApp(s)
    async with app.run_test(size=(width, 3)) as pilot:
        widget = app.query_one(RunHeader)
        widget.show(app.model)
        await pilot.pause()
        rendered = widget.render()
        assert isinstance(rendered, Content)
        return rendered.plain


async def test_the_job_is_on_the_header_at_120_columns():
    line = await header(in_a_job(), 120)
    assert "job 4242 seg 3 ends 1h 12m" in line, line
    # The fields of higher rank stay; the uptime and step/total went first.
    assert "pid 4242" in line and "ETA 2h 37m" in line and "resume ✓" in line, line
    assert "up 3h 25m" not in line and "12,000/50,000" not in line, line
    wide = await header(in_a_job(), 160)
    assert "job 4242 seg 3 ends 1h 12m" in wide and "up 3h 25m" in wide, wide


async def test_a_job_with_no_known_end_shows_its_segment():
    line = await header(in_a_job(ends_in_s=None, end_time=None, time_limit_s=None), 120)
    assert "job 4242 seg 3" in line and "ends" not in line, line


@pytest.mark.parametrize("width", [80, 60])
async def test_the_job_is_dropped_when_the_line_is_short(width: int):
    line = await header(in_a_job(), width)
    assert "job 4242" not in line, line
    assert "…" not in line, line
    without = await header(status(), width)
    assert line == without


async def test_outside_a_job_the_header_has_no_job():
    assert "job " not in await header(status(), 120)
