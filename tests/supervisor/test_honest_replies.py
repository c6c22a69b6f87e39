"""Replies that say what happened: signal capability, stop outcomes, bounded and abandoned
waiters. The policy alone first, then real daemons over scripted trainers that lack a
handler, ignore one, or never exit."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import journal, running_daemon, scripted_run, wait_for
from tests.support.procs import pid_alive
from tests.support.runs import PYTHON
from trainwarden.supervisor.core import policy as p
from trainwarden.supervisor.errors import CommandRefused

RULES = p.Rules(stop_timeout_s=10.0, save_wait_timeout_s=600.0, dump_timeout_s=0.0)
"""A hang is stopped at once here: the stack dump before it is test_hang_dump.py's."""
BOTH = frozenset({"SIGTERM", "SIGUSR1"})


def decide(events: list[Any], state: p.State | None = None) -> tuple[p.State, list[Any]]:
    state = state or p.State()
    log: list[Any] = []
    for event in events:
        state, actions = p.decide(state, event, RULES)
        log.extend(actions)
    return state, log


def of(actions: list[Any], cls: type) -> list[Any]:
    return [a for a in actions if isinstance(a, cls)]


def running(last_step: int = 45, newest: int | None = 40) -> p.State:
    """A trainer (pid 100) at `last_step` with a verified checkpoint at `newest`."""
    ckpts = (p.Ckpt(newest, f"step_{newest:06d}.bin", 1),) if newest is not None else ()
    state, _ = decide([p.Startup(0.0, scanned=()), p.TrainerSpawned(0.0, 100)])
    state, _ = decide([p.StepLogged(1.0, last_step, 3.0)], state)
    from dataclasses import replace

    return replace(state, checkpoints=ckpts, resume_step=newest)


def ask(command: p.Command, rid: int = 1, t: float = 2.0, handles: Any = BOTH) -> p.Operator:
    return p.Operator(t, rid, command, handles=handles)


def signals(actions: list[Any]) -> list[str]:
    return [a.signal for a in of(actions, p.SignalTrainer)]


# ------------------------------------------------------------------ the policy


def test_save_is_refused_unsent_when_the_trainer_does_not_catch_sigusr1():
    _, actions = decide([ask(p.Save(wait=True), handles=frozenset({"SIGTERM"}))], running())
    (reply,) = of(actions, p.Reply)
    assert not reply.ok and reply.code == "unsupported"
    assert "does not handle SIGUSR1" in reply.message and "Saving on request" in reply.message
    assert "\n" not in reply.message and signals(actions) == []


def test_save_is_sent_when_the_handlers_are_unknown_or_present():
    for handles in (None, BOTH):
        _, actions = decide([ask(p.Save(), handles=handles)], running())
        assert signals(actions) == ["SIGUSR1"]


def test_a_save_timeout_beyond_save_wait_timeout_s_is_refused():
    _, actions = decide([ask(p.Save(wait=True, timeout_s=1e9))], running())
    (reply,) = of(actions, p.Reply)
    assert reply.code == "bad_argument" and "save_wait_timeout_s = 600 s" in reply.message
    assert signals(actions) == []


def test_stop_without_a_sigterm_handler_needs_force_and_says_what_is_lost():
    refused_state, actions = decide([ask(p.Stop(), handles=frozenset({"SIGUSR1"}))], running())
    (reply,) = of(actions, p.Reply)
    assert not reply.ok and reply.code == "unsupported" and signals(actions) == []
    assert "5 steps" in reply.message and "--force" in reply.message
    assert refused_state.trainer_alive and refused_state.stop_reason is None

    state, actions = decide([ask(p.Stop(force=True), handles=frozenset())], running())
    assert signals(actions) == ["SIGTERM"] and not of(actions, p.Reply)
    state, actions = decide([p.TrainerExited(3.0, 100, -15, "SIGTERM")], state)
    (reply,) = of(actions, p.Reply)
    assert reply.ok and reply.result["outcome"] == "exited_without_saving"
    assert reply.result["steps_lost"] == 5
    assert "exited without saving (steps lost: 5)" in reply.result["message"]
    (outcome,) = [a for a in of(actions, p.Record) if a.kind == "stop_outcome"]
    assert outcome.fields["outcome"] == "exited_without_saving"


def test_stop_needs_no_force_when_nothing_would_be_lost():
    _, actions = decide([ask(p.Stop(), handles=frozenset())], running(last_step=40))
    assert signals(actions) == ["SIGTERM"]


def test_a_first_start_stopped_before_any_step_or_checkpoint_says_so_in_words():
    """A stop that reaches a first trainer still starting (no step logged, no checkpoint):
    the SIGTERM kills it, nothing is lost, and the sentence says why."""
    state, _ = decide([p.Startup(0.0, scanned=()), p.TrainerSpawned(0.0, 100)])
    state, _ = decide([ask(p.Stop(), handles=frozenset())], state)
    _, actions = decide([p.TrainerExited(3.0, 100, -15, "SIGTERM")], state)
    (reply,) = of(actions, p.Reply)
    assert reply.result["outcome"] == "exited_without_saving" and reply.result["steps_lost"] == 0
    assert reply.result["message"] == (
        "killed by SIGTERM without saving; nothing lost: it had logged no step"
    ), reply.result["message"]


def test_a_trainer_the_sigterm_killed_is_never_said_to_have_saved():
    """Nothing lost (its last step is checkpointed) but it died of the SIGTERM: it saved
    nothing, and the reply says so; one that saved first and then died of it did save."""
    state, _ = decide([ask(p.Stop(force=True), handles=frozenset())], running(last_step=40))
    _, actions = decide([p.TrainerExited(3.0, 100, -15, "SIGTERM")], state)
    (reply,) = of(actions, p.Reply)
    assert reply.result["outcome"] == "exited_without_saving" and reply.result["steps_lost"] == 0
    assert reply.result["message"].startswith("killed by SIGTERM without saving; nothing lost")
    assert "saved" not in reply.result["message"].replace("without saving", "")

    state, _ = decide([ask(p.Stop())], running(last_step=40))
    state, _ = decide([p.StepLogged(2.5, 41, 2.0)], state)
    state, _ = decide([p.CheckpointCommitted(2.6, 41, "step_000041.bin", 1)], state)
    _, actions = decide([p.TrainerExited(3.0, 100, -15, "SIGTERM")], state)
    (reply,) = of(actions, p.Reply)
    assert reply.result["outcome"] == "saved"


def test_stop_streams_progress_and_reports_a_save_at_the_last_step():
    state, actions = decide([ask(p.Stop(), rid=7)], running())
    progress = [a.message for a in of(actions, p.Progress) if a.request_id == 7]
    assert progress[0] == "sent SIGTERM to pid 100"
    assert "stop_timeout_s = 10 s" in progress[1]
    state, actions = decide([p.CheckpointCommitted(3.0, 45, "step_000045.bin", 1)], state)
    assert [a.message for a in of(actions, p.Progress)] == ["checkpoint step 45 committed"]
    state, actions = decide([p.TrainerExited(3.5, 100, 0)], state)
    assert [a.message for a in of(actions, p.Progress)] == ["exited 0"]
    (reply,) = of(actions, p.Reply)
    assert reply.result["outcome"] == "saved" and reply.result["steps_lost"] == 0
    assert reply.result["checkpoint"]["step"] == 45


def test_a_trainer_killed_at_stop_timeout_is_reported_killed_with_its_lost_steps():
    state, _ = decide([ask(p.Stop())], running())
    state, actions = decide([p.Tick(2.0 + RULES.stop_timeout_s)], state)
    assert signals(actions) == ["SIGKILL"]
    state, actions = decide([p.TrainerExited(12.5, 100, -9, "SIGKILL")], state)
    (reply,) = of(actions, p.Reply)
    assert reply.result["outcome"] == "killed" and reply.result["steps_lost"] == 5
    assert "killed after 10 s (steps lost: 5)" in reply.result["message"]


def test_a_kill_that_was_no_stop_of_the_operators_is_not_reported_by_a_later_stop():
    state = running()
    stall_at = state.last_activity_t + RULES.stall_timeout_s
    state, actions = decide([p.Tick(stall_at), p.Tick(stall_at + RULES.stop_timeout_s)], state)
    assert signals(actions) == ["SIGTERM", "SIGKILL"]
    state, _ = decide([p.TrainerExited(stall_at + 11, 100, -9, "SIGKILL")], state)
    assert state.phase == "backoff"
    _, actions = decide([ask(p.Stop(), t=stall_at + 11.5)], state)
    (reply,) = of(actions, p.Reply)
    assert reply.result["outcome"] == "not_running"


def test_stop_pre_empts_a_waiting_save_and_answers_it():
    state, _ = decide([ask(p.Save(wait=True), rid=1)], running())
    state, actions = decide([ask(p.Stop(), rid=2, t=3.0)], state)
    (reply,) = of(actions, p.Reply)
    assert reply.request_id == 1 and reply.code == "superseded"
    assert reply.message == "superseded by stop"
    assert [w.kind for w in state.waiters] == ["stop"] and signals(actions) == ["SIGTERM"]


def test_an_abandoned_waiter_is_dropped_at_once_and_journaled():
    state, _ = decide([ask(p.Save(wait=True), rid=1)], running())
    state, actions = decide([p.RequestAbandoned(3.0, 1)], state)
    assert state.waiters == () and not of(actions, p.Reply)
    (record,) = [a for a in of(actions, p.Record) if a.kind == "request_abandoned"]
    assert record.fields == {"request_id": 1, "command": "save"}


# ------------------------------------------------------------------ real daemons


def scripted(tmp_path: Path, *args: str, stop_timeout_s: float = 10.0) -> Path:
    return scripted_run(
        tmp_path / "run",
        *("--steps", "100000", "--dt", "0.02", "--save-every", "100000", *args),
        trainer={"stop_timeout_s": stop_timeout_s},
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", *args], capture_output=True, text=True, timeout=120
    )


def signals_sent(run: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in journal(run) if r["kind"] == "signal" and r.get("signal") == name]


def at_step(daemon: Any, step: int) -> dict[str, Any]:
    status: dict[str, Any] = wait_for(
        lambda: (s := daemon.status())["state"] == "running" and (s["step"] or 0) >= step and s,
        60,
        what=f"step {step}",
    )
    return status


def test_save_on_a_trainer_without_a_sigusr1_handler_is_refused_and_it_lives(tmp_path: Path):
    run = scripted(tmp_path)
    with running_daemon(run) as daemon:
        pid = at_step(daemon, 3)["trainer_pid"]
        assert daemon.status()["handles"] == ["SIGTERM"]
        with pytest.raises(CommandRefused) as refused:
            daemon.request("save", wait=True, timeout_s=5)
        assert refused.value.code == "unsupported"
        assert "does not handle SIGUSR1" in str(refused.value)
        with pytest.raises(CommandRefused) as too_long:
            daemon.request("save", wait=True, timeout_s=1e9)
        assert too_long.value.code == "bad_argument"
        assert "save_wait_timeout_s" in str(too_long.value)
        at_step(daemon, daemon.status()["step"] + 3)
        assert pid_alive(pid) and daemon.status()["trainer_pid"] == pid
        assert signals_sent(run, "SIGUSR1") == []
        assert "handles   SIGTERM" in cli("status", str(run)).stdout


def test_stop_without_a_sigterm_handler_is_refused_then_forced_and_reports_the_loss(
    tmp_path: Path,
):
    run = scripted(tmp_path, "--term", "default")
    with running_daemon(run) as daemon:
        pid = at_step(daemon, 3)["trainer_pid"]
        refused = cli("stop", str(run))
        assert refused.returncode == 1 and "--force" in refused.stderr, refused
        assert "killed without saving" in refused.stderr
        at_step(daemon, daemon.status()["step"] + 3)
        assert pid_alive(pid) and signals_sent(run, "SIGTERM") == []
        forced = cli("stop", "--force", str(run))
        assert forced.returncode == 1, forced
        lost = re.search(r"exited without saving \(steps lost: (\d+)\)", forced.stdout)
        assert lost and int(lost.group(1)) >= 3, forced.stdout
        assert f"sent SIGTERM to pid {pid}" in forced.stdout
        (outcome,) = [r for r in journal(run) if r["kind"] == "stop_outcome"]
        assert outcome["outcome"] == "exited_without_saving"
        assert outcome["steps_lost"] == int(lost.group(1))


def test_stop_on_a_trainer_that_never_exits_reports_the_kill_and_exits_1(tmp_path: Path):
    run = scripted(tmp_path, "--term", "ignore", stop_timeout_s=1.0)
    with running_daemon(run) as daemon:
        at_step(daemon, 3)
        stopped = cli("stop", str(run))
        assert stopped.returncode == 1, stopped
        assert re.search(r"killed after 1 s \(steps lost: \d+\)", stopped.stdout), stopped.stdout
        assert "waiting for the trainer to save and exit" in stopped.stdout
        assert daemon.status()["state"] == "stopped"


def test_stop_on_a_trainer_that_saves_reports_saved_and_exits_0(tmp_path: Path):
    run = scripted(tmp_path)
    with running_daemon(run) as daemon:
        at_step(daemon, 3)
        stopped = cli("stop", str(run))
        assert stopped.returncode == 0, stopped
        lines = stopped.stdout.splitlines()
        assert "exited 0" in lines and re.search(r"checkpoint step \d+ committed", stopped.stdout)
        assert "saved and exited" in lines[-1]


def test_an_abandoned_save_wait_is_dropped_and_does_not_block_stop(tmp_path: Path):
    run = scripted(tmp_path, "--usr1", "ignore")
    with running_daemon(run) as daemon:
        at_step(daemon, 3)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(daemon.socket))
            sock.sendall(orjson.dumps({"id": 1, "cmd": "save", "wait": True}) + b"\n")
            wait_for(lambda: signals_sent(run, "SIGUSR1"), 30, what="the save's SIGUSR1")
        wait_for(
            lambda: [r for r in journal(run) if r["kind"] == "request_abandoned"],
            30,
            what="the abandoned save dropped",
        )
        result = daemon.request("stop", timeout=60)
        assert result["state"] == "stopped" and result["outcome"] == "saved"


def stop_while_waiting(daemon: Any, run: Path, cmd: str, **args: Any) -> tuple[Any, Any]:
    """`cmd` sent from another client (a thread), a stop once its SIGUSR1 went out: the
    stop's result, and the answer the first client got (a result, or the refusal)."""
    answers: list[BaseException | Any] = []

    def ask() -> None:
        try:
            answers.append(daemon.request(cmd, timeout=60, **args))
        except CommandRefused as exc:
            answers.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    wait_for(lambda: signals_sent(run, "SIGUSR1"), 30, what=f"the {cmd}'s SIGUSR1")
    result = daemon.request("stop", timeout=60)
    asking.join(30)
    (answer,) = answers
    return result, answer


def test_stop_pre_empts_a_waiting_save_whose_client_is_still_there(tmp_path: Path):
    run = scripted(tmp_path, "--usr1", "ignore")
    with running_daemon(run) as daemon:
        at_step(daemon, 3)
        result, answer = stop_while_waiting(daemon, run, "save", wait=True)
        assert result["outcome"] == "saved"
        assert isinstance(answer, CommandRefused) and answer.code == "superseded"
        assert str(answer) == "superseded by stop"


def test_stop_pre_empts_a_pivot_waiting_for_its_checkpoint_and_the_old_policy_stays(
    tmp_path: Path,
):
    from tests.supervisor.test_pivot import BANDIT_ARGS, ready_for_pivot

    # The trainer ignores SIGUSR1: the pivot waits for a checkpoint that does not come.
    run = scripted_run(tmp_path / "run", *BANDIT_ARGS, "--arms", "docs,code", "--usr1", "ignore")
    with running_daemon(run) as daemon:
        ready_for_pivot(daemon)
        result, answer = stop_while_waiting(daemon, run, "pivot", caps={"docs": 0.2})
        assert result["state"] == "stopped" and result["outcome"] == "saved"
        assert isinstance(answer, CommandRefused) and answer.code == "wrong_state"
        assert str(answer) == "pivot abandoned: stopped by operator"
        assert not (run / "policy.json").exists() and not (run / "archive").exists()
        assert daemon.status()["state"] == "stopped"


# ------------------------------------------------------------------ the TUI's confirm


async def test_the_tui_asks_to_kill_a_trainer_without_a_sigterm_handler_and_forces_it():
    from tests.tui.fakes import FrozenClock, StaticSource, status
    from tests.tui.live import until
    from trainwarden.tui.app import TrainwardenApp

    stopped = {
        "state": "stopped",
        "checkpoint": None,
        "outcome": "exited_without_saving",
        "steps_lost": 12,
        "message": "exited without saving (steps lost: 12): killed by SIGTERM; newest none",
    }
    source = StaticSource(status={**status(), "handles": ["SIGUSR1"]}, replies={"stop": stopped})
    app = TrainwardenApp(source, clock=FrozenClock())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.model.populated and app.model.handles, 10, "the status")
        await pilot.pause(0.3)
        await pilot.press("x")
        await until(
            pilot, lambda: "without saving" in getattr(app.screen, "title_text", ""), 5, "confirm"
        )
        await pilot.press("y")
        await until(pilot, lambda: source.requests, 5, "the stop")
        assert source.requests == [("stop", {"force": True})]
        await until(pilot, lambda: "steps lost: 12" in (app.outcomes or [""])[-1], 5, "outcome")
