"""The TUI against a real daemon supervising the reference trainer on CPU.

One daemon serves the whole package (a trainer start costs seconds of torch import);
the tests run in file order and each leaves the run running for the next.
"""

from __future__ import annotations

import orjson
import pytest

from tests.support import pid_alive, trainer_pid
from tests.tui.conftest import LiveRun
from tests.tui.live import in_thread, until
from tests.tui.screen_text import screen_text
from trainwarden.plugins.formats.andrea_bin import checkpoint_name
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.screens.confirm import ConfirmScreen
from trainwarden.tui.screens.main import MainScreen
from trainwarden.tui.screens.pivot import PivotScreen

pytestmark = pytest.mark.timeout(180)

SIZE = (120, 36)


def newest_checkpoint_step(app: TrainwardenApp) -> int | None:
    ckpts = (app.model.checkpoints or {}).get("checkpoints") or []
    return max((c["step"] for c in ckpts), default=None)


def outcome(app: TrainwardenApp, start: str) -> str | None:
    return next((o for o in reversed(app.outcomes) if o.startswith(start)), None)


async def test_panels_fill_with_the_runs_real_values(live: LiveRun):
    app = live.app()
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot,
            lambda: app.model.populated and newest_checkpoint_step(app),
            90,
            "every panel to have data",
        )
        await until(pilot, lambda: app.model.latest_samples(), 60, "a sample")
        # The chart's history comes with the connection and then every poll: the first may
        # have been fetched before the trainer's first step.
        await until(
            pilot, lambda: (app.model.history or {}).get("count", 0) >= 1, 30, "the history"
        )
        await pilot.pause(0.6)
        text = screen_text(app)
        step = app.model.telemetry.value["step"]
        assert step > 0
        assert "RUNNING" in text
        assert f"/ {100_000:,}" in text  # step / total
        for arm in ("docs", "code", "tests"):
            assert arm in text
        newest = newest_checkpoint_step(app)
        assert (live.run_dir / "checkpoints" / checkpoint_name(newest)).exists()
        assert f"{newest:,}" in text
        assert "no NVIDIA GPU" in text or (app.model.gpu or {}).get("name", "?") in text
        assert "spawn" in text and "trainer_started" in text  # the journal
        assert f"pid {live.daemon.status()['trainer_pid']}" in text
        assert app.model.history["count"] >= 1
        # The chart asked for one point per braille dot column of its width.
        assert len(app.model.history["step"]) <= app.history_points()


async def test_save_key_commits_a_checkpoint_and_reports_its_step(live: LiveRun):
    app = live.app()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.model.phase == "running", 60, "running")
        await pilot.press("s")
        assert "saving…" in app.outcomes
        saved = await until(pilot, lambda: outcome(app, "checkpoint saved at step"), 60, "the save")
        step = int(saved.split("step ")[1].split()[0])
        assert (live.run_dir / "checkpoints" / checkpoint_name(step)).exists()
        assert checkpoint_name(step) in saved
        assert not app.model.saving


async def test_stop_asks_first_then_stops_and_start_brings_it_back(live: LiveRun):
    app = live.app()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.model.phase == "running", 60, "running")
        pid = app.model.state.value["trainer_pid"]
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert isinstance(app.screen, MainScreen)
        assert pid_alive(pid)

        await pilot.press("x")
        await pilot.press("y")
        stopped = await until(pilot, lambda: outcome(app, "trainer stopped"), 90, "the stop")
        step = int(stopped.split("step ")[1].split()[0])
        assert (live.run_dir / "checkpoints" / checkpoint_name(step)).exists()
        assert not pid_alive(pid)
        await until(pilot, lambda: "STOPPED" in screen_text(app), 10, "the stopped badge")
        assert live.daemon.status()["state"] == "stopped"

        await pilot.press("r")
        started = await until(pilot, lambda: outcome(app, "trainer starting"), 30, "the start")
        assert started == f"trainer starting from step {step}"
        await until(pilot, lambda: app.model.phase == "running", 60, "running again")
        assert trainer_pid(live.run_dir) not in (None, pid)


async def test_pivot_form_validates_live_and_shows_the_daemons_answer(live: LiveRun):
    app = live.app()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.model.arm_names(), 60, "the bandit's arms")
        await pilot.press("p")
        form = app.screen
        assert isinstance(form, PivotScreen)
        assert form.names == app.model.arm_names()
        form.query_one("#floor-0").value = "0.9"
        form.query_one("#floor-1").value = "0.5"
        await pilot.pause()
        assert form.query_one("#pivot-submit").disabled
        assert "floors sum to 1.4" in screen_text(app)
        form.query_one("#floor-1").value = "0.05"
        await pilot.pause()
        assert not form.query_one("#pivot-submit").disabled
        await pilot.click("#pivot-submit")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        answer = await until(
            pilot, lambda: outcome(app, "pivot done") or outcome(app, "pivot refused"), 120, "pivot"
        )
        # Until the daemon implements pivot it refuses; either way the operator is told.
        assert answer.startswith("pivot done at step") or "not_implemented" in answer


async def test_read_only_refuses_every_acting_key(live: LiveRun):
    app = live.app(read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.model.phase == "running", 60, "running")
        pid = app.model.state.value["trainer_pid"]
        journal_size = (live.run_dir / ".trainwarden" / "journal.jsonl").stat().st_size
        for key in ("s", "x", "r", "p", "P"):
            await pilot.press(key)
            assert isinstance(app.screen, MainScreen), key
        await pilot.pause(0.5)
        refused = [o for o in app.outcomes if o.startswith("read-only:")]
        assert [o.split()[1] for o in refused] == ["save", "stop", "start", "pivot", "pin"]
        text = screen_text(app)
        assert "READ-ONLY" in text
        assert "save" not in text.splitlines()[-1]  # the key bar offers no acting keys
        assert pid_alive(pid)
        journal = (live.run_dir / ".trainwarden" / "journal.jsonl").read_bytes()[journal_size:]
        # No operator's command was journaled, no signal sent (a state record may count
        # earlier starts by cause, "operator" among them: kinds, not bytes).
        kinds = [orjson.loads(line)["kind"] for line in journal.splitlines() if line.strip()]
        assert "operator" not in kinds and b"SIGUSR1" not in journal, kinds


async def test_daemon_killed_shows_disconnected_then_reconnects(live: LiveRun):
    app = live.app()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.model.phase == "running", 60, "running")
        await in_thread(live.daemon.kill)
        await until(
            pilot, lambda: "DISCONNECTED - retrying" in screen_text(app), 15, "disconnected"
        )
        assert app.screen.has_class("-stale")
        assert "RUNNING" not in screen_text(app)
        await pilot.pause(1.0)  # still retrying, still alive
        assert not app.model.connected

        await in_thread(live.start_daemon)
        await until(pilot, lambda: app.model.connected, 30, "the reconnect")

        # The new daemon stops the old trainer and starts its own (a few seconds of torch
        # import); connected and showing its state is what the TUI owes the operator.
        def shows_new_state() -> bool:
            header = screen_text(app).splitlines()[0]
            phase = app.model.phase or "?"
            return app.up_to_date and phase in ("starting", "running") and phase.upper() in header

        await until(pilot, shows_new_state, 30, "the new daemon's state in the header")
        assert not app.screen.has_class("-stale")
        assert "DISCONNECTED" not in screen_text(app)
