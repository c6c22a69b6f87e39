"""Behaviour that needs exact control of the daemon's answers: a scripted data source."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.tui.fakes import FrozenClock, StaticSource, bandit, status
from tests.tui.live import until
from tests.tui.screen_text import screen_text
from trainwarden.supervisor.protocol import TELEMETRY_KEYS
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.messages import TopicPushed
from trainwarden.tui.screens.log import NOT_LOCAL, LogScreen
from trainwarden.tui.screens.main import MainScreen


class SlowSave(StaticSource):
    """Holds the save reply until the test releases it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = asyncio.Event()

    async def request(self, cmd: str, timeout: float | None = 30.0, **args: Any) -> Any:
        if cmd == "save":
            self.requests.append((cmd, args))
            await self.release.wait()
            return {"step": 12_003, "name": "step_012003.bin"}
        return await super().request(cmd, timeout, **args)


async def started(app: TrainwardenApp, pilot: Any) -> None:
    await until(pilot, lambda: app.model.populated and app.first_complete_frame_s, 10, "data")
    await pilot.pause(0.3)


async def test_save_shows_saving_until_the_reply_then_the_step():
    source = SlowSave()
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await started(app, pilot)
        await pilot.press("s")
        await until(pilot, lambda: "saving…" in screen_text(app), 5, "the saving indicator")
        await pilot.press("s")
        assert app.outcomes[-1] == "a save is already in progress"
        assert source.requests == [("save", {"wait": True})]
        source.release.set()
        await until(pilot, lambda: not app.model.saving, 5, "the reply")
        await pilot.pause(0.4)
        assert app.outcomes[-1] == "checkpoint saved at step 12003 (step_012003.bin)"
        assert "saving…" not in screen_text(app)


async def test_refusals_show_the_daemons_code_and_message():
    source = StaticSource()
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await started(app, pilot)
        await pilot.press("P")  # the newest checkpoint is selected
        await pilot.pause(0.2)
        assert source.requests[-1] == ("pin", {"step": 12_000})
        assert (
            app.outcomes[-1]
            == "pin refused (not_implemented): pin is not available in this version"
        )
        assert "pin refused" in screen_text(app)  # the toast, not only the record

        await pilot.press("down", "down", "down", "P")  # the pinned one: P unpins it
        await pilot.pause(0.2)
        assert source.requests[-1] == ("unpin", {"step": 10_000, "dry_run": True})

        await pilot.press("r")  # running: start is refused locally with the reason
        assert app.outcomes[-1] == "the run is running: start works after a stop or a halt"
        assert [cmd for cmd, _ in source.requests] == ["pin", "unpin"]


async def test_hostile_strings_are_shown_literally_and_cut_short():
    hostile = status()
    hostile["run"] = "[bold red]run[/] \x1b[2J\x1b]0;pwned\x07"
    hostile["detail"] = {}
    hostile["gpu"] = None
    hostile["gpu_status"] = "no NVIDIA GPU [link=x]" + "y" * 5000
    source = StaticSource(status=hostile)
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(160, 48)) as pilot:
        await started(app, pilot)
        evil = bandit()
        evil["arms"]["[i]x[/i]\x07"] = {"prob": "nope", "cap": None, "pulls": "9" * 9000}
        evil["zombies"] = ["[b]z[/b]"]
        app.post_message(TopicPushed("bandit", evil))
        app.post_message(TopicPushed("events", {"kind": "[red]k\x1b[31m", "ts": 5, "t": "x"}))
        app.post_message(
            TopicPushed("samples", {"samples": [{"arm": "docs", "step": 1, "text": "[blink]s"}]})
        )
        app.post_message(TopicPushed("telemetry", {"step": "NaN?", "loss": float("nan")}))
        await pilot.pause(0.6)
        text = screen_text(app)
        assert "[bold red]run[/]" in text
        assert "[i]x[/i]" in text and "[b]z[/b]" in text and "[red]k" in text
        assert "\x1b" not in text and "\x07" not in text
        assert "y" * 500 not in text
        assert isinstance(app.screen, MainScreen)


async def test_log_screen_over_a_forwarded_socket_says_why_it_is_empty():
    app = TrainwardenApp(StaticSource(log_path=None), clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await started(app, pilot)
        await pilot.press("l")
        assert isinstance(app.screen, LogScreen)
        assert NOT_LOCAL.split(":")[0] in screen_text(app)
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


async def test_log_screen_follows_a_local_log(tmp_path):
    log = tmp_path / "training.log"
    log.write_text("step: 1, loss: 5.0\n[red]markup[/red] \x1b[31mcolour\n")
    app = TrainwardenApp(StaticSource(log_path=log), clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await started(app, pilot)
        await pilot.press("l")
        await until(pilot, lambda: "step: 1, loss: 5.0" in screen_text(app), 5, "the log")
        assert "[red]markup[/red] colour" in screen_text(app)
        with open(log, "a") as f:
            f.write("step: 2, loss: 4.9\npartial")
        await until(pilot, lambda: "step: 2, loss: 4.9" in screen_text(app), 5, "appended lines")
        assert "partial" not in screen_text(app)  # a line is shown once it is complete


async def test_pivot_without_bandit_state_explains_instead_of_opening():
    class NoBandit(StaticSource):
        async def run(self, post, history_points):  # type: ignore[no-untyped-def]
            from trainwarden.tui.messages import Connected, StatusReceived

            post(Connected({"run": "r"}))
            post(StatusReceived(self.status))
            await asyncio.Event().wait()

    app = TrainwardenApp(NoBandit(), clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("p")
        assert isinstance(app.screen, MainScreen)
        assert app.outcomes[-1].startswith("no bandit state yet")


async def test_request_failure_when_daemon_is_gone_is_reported():
    class Gone(StaticSource):
        async def request(self, cmd: str, timeout: float | None = 30.0, **args: Any) -> Any:
            from trainwarden.supervisor.errors import DaemonNotRunning

            raise DaemonNotRunning("no trainwarden daemon answers on /x/control.sock")

    app = TrainwardenApp(Gone(), clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await started(app, pilot)
        await pilot.press("x", "y")
        await until(pilot, lambda: app.outcomes and "stop failed" in app.outcomes[-1], 5, "failure")
        assert "no trainwarden daemon answers on /x/control.sock" in app.outcomes[-1]


HEADER_CASES = [
    ({"state": "backoff", "detail": {"restart_in_s": 7.2}}, "BACKOFF restart in 7s"),
    (
        {
            "state": "crash_loop",
            "trainer_pid": None,
            "detail": {"reason": "5 restarts without progress"},
        },
        "CRASH LOOP   restarts 2   resume ✓   5 restarts without progress",
    ),
    (
        {"state": "pivoting", "detail": {"pivot_stage": "archiving", "pivot_step": 9000}},
        "PIVOTING: archiving @9000",
    ),
    ({"state": "finished", "trainer_pid": None}, "FINISHED   restarts 2"),
    (
        {"resume_audit": {"status": "drift", "step": 11_501, "old_loss": 2.1, "new_loss": 2.4}},
        "resume drift @11501",
    ),
    ({"disk_low": True}, "DISK LOW"),
    (
        {"disk_full": True, "disk_full_files": ["/r/.trainwarden/journal.jsonl", "/r/.loss.json"]},
        "DISK FULL: holding journal.jsonl, .loss.json",
    ),
]


@pytest.mark.parametrize(("fields", "shown"), HEADER_CASES)
async def test_header_shows_each_state_with_its_detail(fields: dict[str, Any], shown: str):
    app = TrainwardenApp(StaticSource(status={**status(), **fields}), clock=FrozenClock())
    async with app.run_test(size=(120, 24)) as pilot:
        await started(app, pilot)
        header = screen_text(app).splitlines()[0]
        assert shown in header, header


async def test_a_parser_that_matches_nothing_is_shown_until_a_line_matches():
    told = status()
    told["step"] = None
    told["parser_no_match"] = {
        "parser": "step-line",
        "sample": "iter 7: loss 3.1\x1b[31m",
        "seg": 1,
        "hint": "no line matched parser step-line; sample: iter 7: loss 3.1\x1b[31m; "
        "set [telemetry] parser",
    }
    app = TrainwardenApp(StaticSource(status=told), clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        # The telemetry panel shows it whole, a clause a row, even at 80 columns (the
        # header, drawn first, shows its start).
        await until(
            pilot,
            lambda: "hint   no line matched parser" in screen_text(app),
            10,
            "the hint in the telemetry panel",
        )
        text = screen_text(app)
        assert "step-line" in text
        assert "sample: iter 7: loss 3.1" in text
        assert "set [telemetry] parser" in text
        assert "\x1b" not in text
        frame = {**told, "step": 1, "parser_no_match": None}
        app.post_message(TopicPushed("telemetry", {k: frame.get(k) for k in TELEMETRY_KEYS}))
        await until(
            pilot, lambda: "no line matched" not in screen_text(app), 5, "the hint to clear"
        )


async def test_a_checkpoint_name_the_format_does_not_read_is_shown_with_its_fix():
    told = status()
    told["checkpoints_unrecognised"] = [
        {
            "name": "ckpt.pt",
            "hint": "ckpt.pt matches no checkpoint name of format torch-pt; "
            'a file saved in place: set [checkpoints] fixed = "ckpt.pt"',
        }
    ]
    app = TrainwardenApp(StaticSource(status=told), clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        # Wrapped to the panel at 80 columns, the fix included.
        await until(
            pilot,
            lambda: "hint   ckpt.pt matches no checkpoint" in screen_text(app),
            10,
            "the hint in the telemetry panel",
        )
        text = screen_text(app)
        assert "[checkpoints] fixed =" in text and '"ckpt.pt"' in text


NO_CHECKPOINT = {
    "state": "no_checkpoint",
    "trainer_pid": None,
    "detail": {
        "reason": "no verified checkpoint is left to resume from (the run had reached a"
        " checkpoint at step 12000); starting over is the operator's choice"
    },
}


@pytest.mark.parametrize("answer", ["n", "y"])
async def test_with_no_checkpoint_left_start_asks_before_it_starts_over(answer: str):
    source = StaticSource(
        status={**status(), **NO_CHECKPOINT},
        replies={"start": {"state": "starting", "resume_step": None}},
    )
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await started(app, pilot)
        assert "NO CHECKPOINT" in screen_text(app).splitlines()[0]
        await pilot.press("r")
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "Start over from step 0?" in text and "no verified checkpoint is left" in text
        assert source.requests == []  # nothing is sent before the answer
        await pilot.press(answer)
        await pilot.pause(0.2)
        if answer == "n":
            assert source.requests == []
            assert app.outcomes[-1].startswith("not started")
        else:
            assert source.requests == [("start", {"from_scratch": True})]
            assert app.outcomes[-1] == "trainer starting from scratch"
