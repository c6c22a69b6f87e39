"""The daemon's exit status as a contract (docs/exit-codes.md): each way the policy ends
the daemon gives the table's code, the docs' table is the enum's, and a real daemon's
process exits with it."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.support import PYTHON, make_run, running_daemon, scripted_run
from tests.support.policy import decide_all
from tests.support.policy import of as kinds
from trainwarden.supervisor.core import policy as p
from trainwarden.supervisor.core.exit_codes import RESTART_PREVENTED, ExitCode, exit_code_for
from trainwarden.supervisor.core.phases import HALTED, Phase
from trainwarden.supervisor.errors import ConfigError, PluginError, UnsafePath, UsageError

DOC = Path(__file__).resolve().parents[2] / "docs" / "exit-codes.md"
RULES = p.Rules(
    backoff_initial_s=0.0,
    max_restarts_without_progress=2,
    stop_timeout_s=10.0,
    max_loss=20.0,
    divergence_retries=1,
    dump_timeout_s=0.0,
    spikes=p.SpikeRules(enabled=False),
)
HALTS = sorted(HALTED - {Phase.STOPPED, Phase.FINISHED})


def run(events: list[object], state: p.State | None = None) -> tuple[p.State, list]:
    return decide_all(events, state, RULES)


def operator(cmd: str, t: float, rid: int = 9) -> p.Operator:
    command = p.parse_command(cmd, {})
    assert not isinstance(command, p.BadRequest), command
    return p.Operator(t, rid, command)


def shutdown_cmd(t: float) -> p.Operator:
    return operator("shutdown", t)


def exits(actions: list) -> list[int]:
    return [a.code for a in kinds(actions, p.Exit)]


def started() -> p.State:
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100), p.StepLogged(1.0, 1, 3.0)])
    return state


def finished() -> p.State:
    state, _ = run([p.TrainerExited(2.0, 100, 0)], started())
    assert state.phase == Phase.FINISHED
    return state


def crash_looped() -> p.State:
    state, pid = started(), 100
    for t in range(1, 10):
        state, _ = run([p.TrainerExited(float(t), pid, 1)], state)
        if state.phase == Phase.CRASH_LOOP:
            return state
        pid += 1
        state, _ = run([p.TrainerSpawned(float(t), pid)], state)
    raise AssertionError(f"no crash loop: {state.phase}")


def diverged() -> p.State:
    state, _ = run([p.CheckpointCommitted(1.5, 10, "step_000010.bin", 100)], started())
    pid = 100
    for t in (2.0, 4.0, 6.0):
        state, _ = run(
            [p.StepLogged(t, 20, float("nan")), p.TrainerExited(t + 0.1, pid, -9)], state
        )
        if state.phase == Phase.DIVERGED:
            return state
        pid += 1
        state, _ = run([p.TrainerSpawned(t + 0.2, pid)], state)
    raise AssertionError(f"not diverged: {state.phase}")


# ------------------------------------------------------------------ the policy's exits


@pytest.mark.parametrize("how", ["signal", "operator"])
def test_a_finished_run_exits_finished(how: str):
    stop = p.ShutdownRequested(3.0) if how == "signal" else shutdown_cmd(3.0)
    _, actions = run([stop], finished())
    assert exits(actions) == [ExitCode.FINISHED]


def test_a_sigterm_while_training_stops_the_trainer_then_exits_stopped():
    state, actions = run([p.ShutdownRequested(2.0)], started())
    assert not exits(actions) and kinds(actions, p.SignalTrainer)
    state, actions = run([p.TrainerExited(3.0, 100, 0)], state)
    assert exits(actions) == [ExitCode.STOPPED] and state.phase == Phase.STOPPED


@pytest.mark.parametrize("how", ["signal", "operator"])
def test_the_operators_stop_then_a_shutdown_exits_stopped(how: str):
    state, actions = run([operator("stop", 2.0), p.TrainerExited(3.0, 100, 0)], started())
    assert state.phase == Phase.STOPPED and not exits(actions)  # stopped, still up
    stop = p.ShutdownRequested(4.0) if how == "signal" else shutdown_cmd(4.0)
    _, actions = run([stop], state)
    assert exits(actions) == [ExitCode.STOPPED]


def test_a_shutdown_during_backoff_exits_stopped():
    rules_backoff = p.Rules(backoff_initial_s=5.0, spikes=p.SpikeRules(enabled=False))
    state, _ = decide_all(
        [p.Startup(0.0), p.TrainerSpawned(0.0, 100), p.TrainerExited(1.0, 100, 1)],
        None,
        rules_backoff,
    )
    assert state.phase == Phase.BACKOFF
    _, actions = decide_all([p.ShutdownRequested(2.0)], state, rules_backoff)
    assert exits(actions) == [ExitCode.STOPPED]


@pytest.mark.parametrize("how", ["signal", "operator"])
@pytest.mark.parametrize("halt", [crash_looped, diverged], ids=["crash_loop", "diverged"])
def test_a_halted_daemon_stays_up_and_exits_halted_when_told(how: str, halt):
    state = halt()
    _, idle = run([p.Tick(100.0)], state)
    assert not exits(idle)  # the halt alone does not end the daemon
    stop = p.ShutdownRequested(101.0) if how == "signal" else shutdown_cmd(101.0)
    _, actions = run([stop], state)
    assert exits(actions) == [ExitCode.HALTED]


@pytest.mark.parametrize("phase", HALTS)
def test_every_halt_phase_restored_from_the_journal_exits_halted(phase: Phase):
    state = p.State(phase=phase, halt_reason="from the journal")
    for stop in (p.ShutdownRequested(1.0), shutdown_cmd(1.0)):
        _, actions = run([stop], state)
        assert exits(actions) == [ExitCode.HALTED], stop


def test_exit_code_for_each_phase():
    assert exit_code_for(Phase.FINISHED) == ExitCode.FINISHED
    assert exit_code_for(Phase.STOPPED) == ExitCode.STOPPED
    assert {exit_code_for(ph) for ph in HALTS} == {ExitCode.HALTED}
    for ph in set(Phase) - HALTED:
        assert exit_code_for(ph) == ExitCode.STOPPED, ph


def test_the_codes_keep_clear_of_the_conventions():
    assert ExitCode.FINISHED == ExitCode.STOPPED == 0
    assert ExitCode.ERROR == 1 and ExitCode.CONFIG == 2
    for code in (ExitCode.HALTED, ExitCode.REQUEUE):
        assert code not in (0, 1, 2, 126, 127) and code < 128
    # The CLI's errors exit with the table's CONFIG.
    for error in (ConfigError, UsageError, PluginError, UnsafePath):
        assert error.exit_code == ExitCode.CONFIG
    assert set(RESTART_PREVENTED) == {ExitCode.CONFIG, ExitCode.HALTED}


# ------------------------------------------------------------------ the docs' table

ROW = re.compile(r"^\|\s*`?(\d+)`?\s*\|\s*`?([A-Z_]+)`?\s*\|")


def doc_rows(text: str) -> list[tuple[int, str, str]]:
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            rows.append((int(m.group(1)), m.group(2), line))
    return rows


def table_problems(text: str) -> list[str]:
    """How docs/exit-codes.md's table differs from ExitCode and RESTART_PREVENTED."""
    rows = doc_rows(text)
    documented = sorted((code, name) for code, name, _ in rows)
    defined = sorted((int(member), name) for name, member in ExitCode.__members__.items())
    problems = [] if documented == defined else [f"rows {documented} != enum {defined}"]
    for code, _name, line in rows:
        prevented = code in [int(c) for c in RESTART_PREVENTED]
        if ("RestartPreventExitStatus" in line) != prevented:
            problems.append(f"systemd column: {line}")
    return problems


def test_the_docs_table_is_the_enum():
    assert table_problems(DOC.read_text(encoding="utf-8")) == []


def test_the_docs_table_check_can_fail():
    text = DOC.read_text(encoding="utf-8")
    assert table_problems(text.replace("| 3 | HALTED |", "| 4 | HALTED |"))
    assert table_problems(text.replace("| 75 | REQUEUE |", "| 75 | REQUEUED |"))
    assert table_problems(text.replace("RestartPreventExitStatus", "Restart"))


# ------------------------------------------------------------------ a real daemon


@pytest.mark.timeout(120)
def test_a_real_daemon_exits_with_the_tables_code(tmp_path: Path):
    done = scripted_run(tmp_path / "done", "--steps", "5", "--save-every", "5")
    with running_daemon(done) as daemon:
        daemon.wait_state("finished", timeout=60)
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait_exit(60) == ExitCode.FINISHED
    looping = make_run(
        tmp_path / "loop",
        [PYTHON, "-c", "import sys; sys.exit(1)"],
        restart={"backoff_initial_s": 0.0, "max_restarts_without_progress": 2},
    )
    with running_daemon(looping) as daemon:
        daemon.wait_state("crash_loop", timeout=60)
        daemon.request("shutdown", timeout=60)
        assert daemon.wait_exit(60) == ExitCode.HALTED
