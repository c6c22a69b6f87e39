"""The events and checkpoints panels tell the truth at every size: no number sliced, long
kinds kept from pushing the detail off the screen, a pivot's set-aside checkpoints told
apart from a failed verification, and an unpin that lets retention delete asks first."""

from __future__ import annotations

import re
from typing import Any

import pytest
from textual.pilot import Pilot

from tests.tui.fakes import NOW, FrozenClock, StaticSource, events, status
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.messages import TopicPushed
from trainwarden.tui.screens.confirm import ConfirmScreen
from trainwarden.tui.widgets.events import EventsPanel

SIZES = [(80, 24), (120, 40), (60, 20)]
ROOM_FOR_THREE_COLUMNS = 34
"""Time, a shortened kind and a few cells of detail."""


def record(offset: float, kind: str, **fields: Any) -> dict[str, Any]:
    t = NOW - offset
    hms = f"{int(t // 3600 % 24):02d}:{int(t // 60 % 60):02d}:{int(t % 60):02d}"
    return {"ts": f"2025-12-31T{hms}.000000Z", "t": t, "kind": kind, **fields}


def restart_records() -> list[dict[str, Any]]:
    """A daemon restarted under a running trainer, then new checkpoints past 10,000."""
    digest = "sha256:9f2c4e1ab07d3c55e8a1f0b2c4d6e8f00112233445566778899aabbccddeeff0"
    return [
        record(40, "daemon_start", pid=5100, version="0.1.0"),
        record(39, "leftover_trainer", pid=4242, step=9_990),
        record(30, "leftover_trainer_stopped", pid=4242, processes=[4242, 4243, 4244]),
        record(29, "spawn", seg=4, resume={"step": 10_000}, pivot=False),
        record(
            2, "checkpoint", step=10_200, name="step_010200.bin", bytes=1_468_008, digest=digest
        ),
    ]


class Scenario(StaticSource):
    """The frozen run plus `records`, newer than its own journal."""

    def __init__(self, records: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.records = records

    async def run(self, post: Any, history_points: Any) -> None:
        def relay(message: Any) -> None:
            post(message)
            if isinstance(message, TopicPushed) and message.topic == "events":
                post(TopicPushed("events", self.records))

        await super().run(relay, history_points)


def sliced_numbers(text: str, records: list[dict[str, Any]]) -> list[str]:
    """`key=NUMBER` on the screen whose number is not the value some record holds for key."""
    true = {(k, str(v)) for r in records for k, v in r.items() if isinstance(v, int)}
    return [
        f"{key}={number}"
        for key, number in re.findall(r"(\w+)=(\d+)(?![\d.,])", text)
        if (key, number) not in true
    ]


async def drawn(app: TrainwardenApp, pilot: Pilot[Any]) -> None:
    await until(pilot, lambda: app.model.populated and app.up_to_date, 30, "every panel drawn")
    await pilot.pause(0.3)
    await until(pilot, lambda: app.up_to_date, 30, "every panel drawn")


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
async def test_event_details_drop_whole_fields_and_never_slice_a_number(size):
    records = restart_records()
    app = TrainwardenApp(Scenario(records), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        text = screen_text(app)
        assert not sliced_numbers(text, [*events(), *records]), text
        # The long kind is shortened: the detail column stays on the screen beside it,
        # wherever the layout gives the panel room for three columns.
        row = next((line for line in text.splitlines() if "leftover" in line), "")
        assert "leftover_trainer_stopped" not in text, text
        panel = app.screen.query_one(EventsPanel).content_region
        if panel.width >= ROOM_FOR_THREE_COLUMNS and panel.height >= 4:
            assert "step=10200" in text, text
            assert "pid=4242" in row, text


def test_fit_keeps_whole_fields_and_cuts_no_number():
    from trainwarden.tui.fmt import fit

    pieces = ["step=10200", "name=step_010200.bin", "bytes=1468008"]
    assert fit(pieces, 80) == "step=10200 name=step_010200.bin bytes=1468008"
    assert fit(pieces, 20) == "step=10200 …"
    assert fit(pieces, 8) == "step=…"
    assert fit(["exit", "status", "1:", "CUDA", "error"], 16) == "exit status 1: …"
    assert fit(["resume=12,345,678"], 14) == "resume=…"
    # A first field that fits alone but not with " …" after it (it took the TUI down once).
    fields = ["resume_step=226", "last_logged_step=226", "steps_lost=0"]
    assert fit(fields, 16) == "resume_step=…"
    assert fit(fields, 15) == "resume_step=…"


class Retention(StaticSource):
    """Answers unpin as a daemon whose retention would delete `would_delete` after it."""

    def __init__(self, would_delete: list[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.would_delete = would_delete

    async def request(self, cmd: str, timeout: float | None = 30.0, **args: Any) -> Any:
        if cmd != "unpin":
            return await super().request(cmd, timeout, **args)
        self.requests.append((cmd, args))
        if args.get("dry_run"):
            return {
                "step": args["step"],
                "pinned": True,
                "dry_run": True,
                "would_delete": self.would_delete,
            }
        return {"step": args["step"], "pinned": False}


async def press_unpin_on_the_pinned_checkpoint(app: TrainwardenApp, pilot: Pilot[Any]) -> None:
    await drawn(app, pilot)
    await pilot.press("down", "down", "down")  # newest first: 12,000 11,500 11,000 10,000 (pinned)
    await pilot.press("P")


async def test_unpin_that_lets_retention_delete_asks_and_yes_unpins():
    source = Retention(would_delete=[10_000])
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await press_unpin_on_the_pinned_checkpoint(app, pilot)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the confirmation")
        text = screen_text(app)
        assert "step_010000.bin" in text and "delete" in text, text
        assert source.requests == [("unpin", {"step": 10_000, "dry_run": True})]
        await pilot.press("y")
        await until(pilot, lambda: len(source.requests) == 2, 5, "the unpin")
        assert source.requests[-1] == ("unpin", {"step": 10_000})
        await until(pilot, lambda: app.outcomes, 5, "the outcome")
        assert app.outcomes[-1] == "checkpoint at step 10000 unpinned"


async def test_unpin_answered_no_leaves_it_pinned():
    source = Retention(would_delete=[10_000])
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await press_unpin_on_the_pinned_checkpoint(app, pilot)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the confirmation")
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 5, "the answer")
        await pilot.pause(0.3)
        assert source.requests == [("unpin", {"step": 10_000, "dry_run": True})]
        assert app.outcomes[-1] == "checkpoint at step 10,000 stays pinned"


@pytest.mark.parametrize("would_delete", [[], [11_000]])
async def test_unpin_of_a_checkpoint_that_stays_is_not_asked(would_delete):
    source = Retention(would_delete=would_delete)
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await press_unpin_on_the_pinned_checkpoint(app, pilot)
        await until(pilot, lambda: len(source.requests) == 2, 5, "the unpin")
        assert not isinstance(app.screen, ConfirmScreen)
        assert source.requests == [
            ("unpin", {"step": 10_000, "dry_run": True}),
            ("unpin", {"step": 10_000}),
        ]


def pivot_status() -> dict[str, Any]:
    """After a normal pivot at step 8,400 (its stop's checkpoint set aside), and one
    checkpoint that really failed verification."""
    pivoted = {"step": 8_489, "cause": "pivot", "cause_step": 8_400, "alarming": False}
    data = status()
    data["quarantined"] = [
        {"name": "step_008489.bin", "why": "set aside by the pivot at step 8,400", **pivoted},
        {"name": "step_008489.json", "why": "set aside by the pivot at step 8,400", **pivoted},
        {
            "name": "step_009500.bin",
            "step": 9_500,
            "cause": "verification",
            "cause_step": None,
            "why": "failed verification: size 1200 != header's 1468008",
            "alarming": True,
        },
    ]
    return data


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
async def test_a_pivots_set_aside_checkpoints_are_told_apart_from_a_failure(size):
    app = TrainwardenApp(StaticSource(status=pivot_status()), clock=FrozenClock())
    async with app.run_test(size=size) as pilot:
        await drawn(app, pilot)
        text = screen_text(app)
        assert "quarantined (3)" not in text, text
        if size[0] >= 80:
            # One checkpoint and its sidecar: one checkpoint set aside.
            assert "set aside by the pivot at step 8,400 (1)" in text or (
                "set aside (1, pivot at 8,400)" in text
            ), text
            assert "quarantined (1): step_009500.bin" in text, text
        # Whatever the width, a step is shown whole or not at all.
        # (4,000 and 3,900: the caption's crash at 4,000 and its restart from 3,900.)
        shown = {"8,400", "12,000", "11,500", "11,000", "10,000", "9000", "3900", "1"}
        shown |= {"4,000", "3,900"}
        for number in re.findall(r"(?:pivot|step) ([\d,]+)", text):
            assert number.rstrip(",") in shown, text


def restart_app() -> TrainwardenApp:
    return TrainwardenApp(Scenario(restart_records()), clock=FrozenClock())


def pivot_app() -> TrainwardenApp:
    return TrainwardenApp(StaticSource(status=pivot_status()), clock=FrozenClock())


async def settled(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, TrainwardenApp)
    await drawn(app, pilot)
    history = app.model.history or {}
    await until(
        pilot, lambda: len(history.get("step", [])) == app.history_points(), 10, "the chart"
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
def test_after_a_daemon_restart(snap_compare, size):
    assert snap_compare(restart_app(), terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
def test_after_a_pivot(snap_compare, size):
    assert snap_compare(pivot_app(), terminal_size=size, run_before=settled)
