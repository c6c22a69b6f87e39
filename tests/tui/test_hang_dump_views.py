"""A hang's stack dump as the TUI shows it: the caption names where the trainer was stuck,
the events panel the dump's file (records shaped as the daemon writes them)."""

from __future__ import annotations

from tests.tui.fakes import FrozenClock, StaticSource
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from tests.tui.test_caption import HANG, rec
from trainwarden.supervisor.journal_text import summary
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.widgets.caption import caption_text

PATH = "/runs/r/.trainwarden/hangs/20260101T000030Z-step1700.txt"
DUMP = rec(
    30.05,
    "hang_dump",
    reason="hang",
    step=1700,
    path=PATH,
    top_frames=["stuck_in_data_loader (train.py:41)", "train (train.py:90)"],
    error=None,
    pids=[12, 13],
    seconds=0.4,
)
DUMPED_HANG = [HANG[0], DUMP, *HANG[1:]]


def caption(records: list[dict]) -> str | None:
    found = caption_text(records)
    return None if found is None else found[1]


def test_the_caption_of_a_hang_names_the_function_it_was_stuck_in():
    assert caption(DUMPED_HANG) == (
        "trainer hung at step 1,700; daemon killed it, restarted it from step 1,600;"
        " stacks dumped: in stuck_in_data_loader"
    )


def test_the_caption_says_when_only_kernel_stacks_were_dumped():
    no_py_spy = {**DUMP, "top_frames": [], "error": "py-spy not found"}
    text = caption([HANG[0], no_py_spy, *HANG[1:]])
    assert text is not None
    assert text.endswith("; kernel stacks dumped, no Python stacks")


def test_an_operator_dump_during_a_hang_is_not_taken_for_its_dump():
    asked = {**DUMP, "reason": "request"}
    text = caption([HANG[0], asked, *HANG[1:]])
    assert text is not None and text.startswith("trainer hung at step 1,700;")


def test_the_events_line_names_the_dump_file_and_the_innermost_frame():
    assert summary(DUMP) == (
        ".trainwarden/hangs/20260101T000030Z-step1700.txt in stuck_in_data_loader (train.py:41)"
    )
    failed = {**DUMP, "top_frames": [], "error": "py-spy: Permission denied"}
    assert summary(failed).endswith("step1700.txt, no Python stacks: py-spy: Permission denied")


async def test_the_events_panel_shows_the_dump_line():
    source = StaticSource(journal=[rec(0, "daemon_start", pid=1), *DUMPED_HANG])
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(160, 40)) as pilot:
        await until(
            pilot,
            lambda: (
                "hangs/20260101T000030Z-step1700.txt" in (text := screen_text(app))
                and "stacks dumped: in stuck_in_data_loader" in text
            ),
            10,
            "the hang_dump line and the caption",
        )
