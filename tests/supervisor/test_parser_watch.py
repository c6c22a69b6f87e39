"""The parser watch alone, on a real event loop with a short bound."""

from __future__ import annotations

import asyncio
from typing import Any

from trainwarden.supervisor.shell.parser_watch import (
    SAMPLE_CHARS,
    ParserWatch,
    no_match_after_s,
)

AFTER_S = 0.05


def watch() -> tuple[ParserWatch, list[dict[str, Any]]]:
    reports: list[dict[str, Any]] = []
    w = ParserWatch(asyncio.get_running_loop(), "step-line", AFTER_S, reports.append)
    w.begin(1)
    return w, reports


async def settle() -> None:
    await asyncio.sleep(AFTER_S * 4)


def test_the_bound_is_half_the_stall_timeout_at_most_a_minute():
    assert no_match_after_s(600.0) == 60.0
    assert no_match_after_s(4.0) == 2.0


async def test_reports_once_per_start_with_the_latest_nonblank_line():
    w, reports = watch()
    w.unmatched(["banner\n", "iter 1: loss 3.4\n", "   \n"])
    await settle()
    w.unmatched(["iter 2: loss 3.3\n"])
    await settle()
    assert len(reports) == 1
    (notice,) = reports
    assert notice["parser"] == "step-line" and notice["seg"] == 1
    assert notice["sample"] == "iter 1: loss 3.4"
    assert notice["hint"] == (
        "no line matched parser step-line; sample: iter 1: loss 3.4; set [telemetry] parser"
    )
    assert w.notice == notice
    w.begin(2)
    assert w.notice is None
    w.unmatched(["x" * 1000])
    await settle()
    assert len(reports) == 2 and reports[1]["seg"] == 2
    assert len(reports[1]["sample"]) == SAMPLE_CHARS


async def test_a_match_clears_the_notice_and_ends_the_watch_for_the_start():
    w, reports = watch()
    w.unmatched(["junk"])
    await settle()
    assert w.notice is not None
    w.matched()
    assert w.notice is None and not w.open
    w, reports = watch()
    w.unmatched(["junk"])
    w.matched()  # before the bound: nothing is ever reported for this start
    await settle()
    assert reports == []


async def test_blank_lines_start_nothing_and_an_ended_start_reports_nothing():
    w, reports = watch()
    w.unmatched(["\n", "  \n"])
    await settle()
    assert reports == []
    w.unmatched(["junk"])
    w.end()
    await settle()
    assert reports == [] and not w.open
