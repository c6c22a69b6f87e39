"""The incident caption under the header: the newest crash, hang or divergence and what the
daemon did, built from the journal records the TUI receives (shapes as the daemon writes them)."""

from __future__ import annotations

from typing import Any

from tests.tui.fakes import NOW, FrozenClock, StaticSource
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.messages import TopicPushed
from trainwarden.tui.widgets.caption import IncidentCaption, caption_text


def rec(offset: float, kind: str, **fields: Any) -> dict[str, Any]:
    t = NOW - 1000 + offset
    return {"ts": f"2026-01-01T00:00:{offset:09.6f}Z", "t": t, "kind": kind, **fields}


def spawn(offset: float, seg: int, step: int | None, **fields: Any) -> dict[str, Any]:
    resume = {"step": step, "name": f"step_{step:06d}.bin"} if step is not None else None
    return rec(offset, "spawn", seg=seg, resume=resume, pivot=False, **fields)


CRASH = [
    rec(1, "crash", pid=10, returncode=3, last_step=340, cause="exit status 3"),
    rec(1.1, "restart_scheduled", backoff_s=1.0, attempt=1, resume_step=300),
    spawn(2, 2, 300),
    rec(2.1, "trainer_started", pid=11, seg=2),
]
DIVERGENCE = [
    rec(10, "signal", signal="SIGKILL", pid=11, reason="divergence: loss nan at step 1020"),
    rec(10.1, "divergence", step=1020, loss="nan", count=1, quarantined=[], rollback_to=1000),
    rec(10.2, "trainer_killed", pid=11, returncode=-9, last_step=1019, cause="divergence"),
    spawn(10.3, 3, 1000, rollback_from=1020),
]
HANG = [
    rec(30, "stall", last_step=1700, silent_s=15.002),
    rec(30.1, "signal", signal="SIGTERM", pid=12, reason="stall"),
    rec(35, "signal", signal="SIGKILL", pid=12, reason="did not exit within 5 s"),
    rec(35.1, "crash", pid=12, returncode=-9, last_step=1700, cause="hang (no step line)"),
    rec(35.2, "restart_scheduled", backoff_s=1.0, attempt=1, resume_step=1600),
    spawn(36, 4, 1600),
]


def caption(records: list[dict[str, Any]]) -> str | None:
    found = caption_text(records)
    return None if found is None else found[1]


def test_each_incident_says_what_happened_and_what_the_daemon_did():
    start = [rec(0, "daemon_start", pid=1), spawn(0.1, 1, None)]
    assert caption(start) is None
    assert caption(start + CRASH) == (
        "trainer crashed at step 340 (exit 3); daemon restarted it from step 300"
    )
    assert caption(start + CRASH + DIVERGENCE) == (
        "loss nan at step 1,020; daemon killed the trainer, rolled back to step 1,000"
    )
    assert caption(start + CRASH + DIVERGENCE + HANG) == (
        "trainer hung at step 1,700; daemon killed it, restarted it from step 1,600"
    )


def test_the_caption_follows_an_incident_as_it_unfolds():
    assert caption(HANG[:2]) == "trainer hung at step 1,700; daemon is stopping the trainer"
    assert caption(HANG[:5]) == (
        "trainer hung at step 1,700; daemon killed it, will restart it from step 1,600"
    )
    halted = [
        rec(1, "crash", returncode=1, last_step=5, cause="exit status 1"),
        rec(1.1, "halt", state="crash_loop"),
    ]
    assert caption(halted) == (
        "trainer crashed at step 5 (exit 1); daemon halted the run (crash_loop); r starts it again"
    )
    # A later crash after the restart is a new incident, not part of the old one.
    again = [*CRASH, rec(5, "crash", returncode=-11, last_step=420, cause="killed by SIGSEGV")]
    assert caption(again) == "trainer crashed at step 420 (killed by SIGSEGV); daemon is deciding"


def test_common_captions_fit_an_80_column_line():
    for records in (CRASH, DIVERGENCE, HANG):
        text = caption(records)
        assert text is not None and len(text) <= 78, text


async def test_caption_under_the_header_and_a_toast_only_for_news():
    source = StaticSource(journal=[rec(0, "daemon_start", pid=1), *CRASH])
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        shown = "trainer crashed at step 340 (exit 3); daemon restarted it from step 300"
        await until(pilot, lambda: shown in screen_text(app), 10, "the caption")
        lines = screen_text(app).splitlines()
        assert shown in lines[1]  # right under the header line
        # An incident that was in the journal before the TUI connected is not news.
        assert not app._notifications

        for record in DIVERGENCE:
            source._post(TopicPushed("events", record))  # type: ignore[misc]
        news = "loss nan at step 1,020; daemon killed the trainer, rolled back to step 1,000"
        await until(pilot, lambda: app.query_one(IncidentCaption).text == news, 10, "news")
        await pilot.pause(0.3)
        toasts = [n.message for n in app._notifications]
        assert len(toasts) == 1 and toasts[0].startswith("loss nan at step 1,020")
        assert "loss nan at step 1,020" in screen_text(app)


async def test_no_incident_no_caption_row():
    source = StaticSource(journal=[rec(0, "daemon_start", pid=1), spawn(0.1, 1, None)])
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: bool(app.model.events) and app.up_to_date, 10, "data")
        await pilot.pause(0.2)
        assert app.query_one(IncidentCaption).display is False


def test_a_long_cause_is_cut_by_whole_words_never_inside_a_number():
    from trainwarden.tui.widgets.caption import CAUSE_CHARS, _cause

    cause = _cause({"cause": "exit status 1: worker 123456789 lost"})
    assert len(cause) <= CAUSE_CHARS and cause.endswith("…"), cause
    assert not any(ch.isdigit() for ch in cause.split()[-2:-1][0][-1:]), cause  # no "1234…"
    assert "123456789" in cause or "1234" not in cause, cause
    assert _cause({"cause": "exit status 3"}) == "exit 3"
