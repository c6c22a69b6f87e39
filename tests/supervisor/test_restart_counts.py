"""`restarts` counts every trainer start after the first, by cause; restarts_without_progress
keeps counting only what the crash-loop budget is about. The pure policy, then the views
and the status line built from it."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.supervisor.test_spikes import SPIKES
from tests.support.policy import decide_all
from tests.support.policy import of as kinds
from trainwarden.supervisor.cli.output import format_status
from trainwarden.supervisor.core import policy as p
from trainwarden.supervisor.shell.views import state_view

RULES = p.Rules(
    keep_last=10,
    backoff_initial_s=0.0,
    stall_timeout_s=60.0,
    dump_timeout_s=0.0,
    max_restarts_without_progress=3,
    spikes=SPIKES,
)


class Run:
    """A run driven through the policy, with a clock and the live trainer's pid."""

    def __init__(self, rules: p.Rules = RULES) -> None:
        self.rules = rules
        self.t = 0.0
        self.pid = 100
        self.state, _ = decide_all([p.Startup(0.0), p.TrainerSpawned(0.0, 100)], None, rules)

    def decide(self, *events: object) -> list[object]:
        self.state, actions = decide_all(list(events), self.state, self.rules)
        return actions

    def steps(self, n: int, loss: float = 1.0) -> None:
        """n step lines from the resume step on, a commit every 10th."""
        first = (self.state.last_step or self.state.resume_step or 0) + 1
        for s in range(first, first + n):
            self.t += 1.0
            self.decide(p.StepLogged(self.t, s, loss))
            if s % 10 == 0:
                self.decide(p.CheckpointCommitted(self.t, s, f"step_{s:06d}.bin", 100))

    def exits(self, returncode: int) -> list[object]:
        self.t += 1.0
        return self.decide(p.TrainerExited(self.t, self.pid, returncode))

    def daemon_restarts(self) -> None:
        """A new daemon: the persisted state, the checkpoints its scan finds, a start."""
        restored = p.restore(p.persisted(self.state), self.rules)
        restored = replace(restored, checkpoints=self.state.checkpoints)
        self.state, actions = decide_all([p.Startup(self.t)], restored, self.rules)
        assert kinds(actions, p.Spawn)
        self.started()

    def started(self) -> None:
        self.pid += 1
        self.t += 1.0
        self.decide(p.TrainerSpawned(self.t, self.pid))


def test_every_start_after_the_first_is_counted_by_its_cause():
    """The issue's run: a crash, a NaN, a hang and a spike rollback said "restarts 2"
    (only the crash and the hang counted). An operator's stop and start and a daemon
    restart are starts after the first too."""
    run = Run()
    run.steps(60)
    assert run.state.restarts == 0 and dict(run.state.restarts_by_cause) == {}

    run.exits(1)  # a crash: restarted at once (no backoff)
    run.started()
    run.steps(30)
    assert run.state.restarts == 1 and dict(run.state.restarts_by_cause) == {"crash": 1}
    assert run.state.restarts_without_progress == 0  # it committed since

    run.steps(1, loss=math.nan)  # a divergence: killed unsaved, rolled back
    run.exits(-9)
    run.started()
    run.steps(30)

    run.t += RULES.stall_timeout_s  # a hang: no step line for stall_timeout_s
    signals = kinds(run.decide(p.Tick(run.t)), p.SignalTrainer)
    assert [s.signal for s in signals] == ["SIGTERM"]
    run.exits(-15)
    run.started()
    run.steps(30)

    run.steps(3, loss=5.0)  # a loss spike: killed, rolled back past it
    assert run.state.stop_reason == "spike"
    run.exits(-9)
    run.started()
    run.steps(30)

    run.decide(p.Operator(run.t, 1, p.parse_command("stop", {})))
    run.exits(0)
    assert run.state.phase == "stopped"
    run.decide(p.Operator(run.t, 2, p.parse_command("start", {})))
    run.started()

    run.daemon_restarts()

    by_cause = dict(run.state.restarts_by_cause)
    assert by_cause == {
        "crash": 1,
        "divergence": 1,
        "hang": 1,
        "spike": 1,
        "operator": 1,
        "daemon": 1,
    }
    assert run.state.restarts == 6 == run.state.seg - 1
    # The crash-loop budget still counts only crashes and hangs without progress.
    assert run.state.restarts_without_progress == 0


def test_restarts_without_progress_still_halts_the_crash_loop_alone():
    run = Run()
    for _ in range(RULES.max_restarts_without_progress):
        run.exits(1)
        run.started()
    assert run.state.restarts_without_progress == 3 and run.state.restarts == 3
    run.exits(1)
    assert run.state.phase == "crash_loop"
    run.decide(p.Operator(run.t, 1, p.parse_command("start", {})))
    run.started()
    assert run.state.restarts_without_progress == 0
    assert dict(run.state.restarts_by_cause) == {"crash": 3, "operator": 1}


def test_a_start_refused_for_its_checkpoint_is_counted_once():
    """The shell refuses a checkpoint whose files changed: no trainer started for that
    spawn, and the next older one is tried. One start, one count."""
    run = Run()
    run.steps(20)
    run.exits(1)
    assert run.state.resume_step == 20
    run.decide(p.ResumeRefused(run.t, 20, "step_000020.bin", "digest changed"))
    run.started()
    assert run.state.resume_step == 10
    assert run.state.restarts == 1 and dict(run.state.restarts_by_cause) == {"crash": 1}


def test_a_start_that_could_not_be_made_is_a_start_of_its_cause():
    run = Run()
    run.steps(10)
    run.exits(1)
    run.decide(p.SpawnFailed(run.t, "no such file"))  # the crash's restart: still a start
    run.started()
    assert run.state.restarts == 2
    assert dict(run.state.restarts_by_cause) == {"crash": 2}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["crash", "nan", "stop-start", "daemon"]), max_size=12))
def test_the_causes_add_up_to_the_starts_after_the_first(incidents):
    run = Run(replace(RULES, max_restarts_without_progress=100))
    for incident in incidents:
        run.steps(25)
        if incident == "crash":
            run.exits(1)
        elif incident == "nan":
            run.steps(1, loss=math.inf)
            run.exits(-9)
        elif incident == "stop-start":
            run.decide(p.Operator(run.t, 1, p.parse_command("stop", {})))
            run.exits(0)
            run.decide(p.Operator(run.t, 2, p.parse_command("start", {})))
        else:
            run.daemon_restarts()
            continue
        run.started()
    assert run.state.restarts == len(incidents) == run.state.seg - 1
    assert sum(n for _, n in run.state.restarts_by_cause) == len(incidents)


def test_the_counts_survive_a_daemon_restart():
    state = p.State(restarts=4, restarts_by_cause=(("crash", 1), ("hang", 1), ("spike", 2)))
    restored = p.restore(p.persisted(state), RULES)
    assert restored.restarts == 4
    assert dict(restored.restarts_by_cause) == {"crash": 1, "hang": 1, "spike": 2}


def test_the_state_view_and_the_status_line_give_the_total_and_its_causes():
    state = p.State(
        restarts=4,
        restarts_by_cause=(("crash", 1), ("hang", 1), ("divergence", 1), ("spike", 1)),
    )
    view = state_view(state, 0.0)
    assert view["restarts"] == 4
    assert view["restarts_by_cause"] == {"crash": 1, "divergence": 1, "hang": 1, "spike": 1}
    text = format_status({**view, "run": "r", "run_dir": "/r"})  # type: ignore[typeddict-item]
    assert "restarts 4 (crash 1, hang 1, divergence 1, spike 1)" in text
    none = format_status({**state_view(p.State(), 0.0), "run": "r"})  # type: ignore[typeddict-item]
    assert "restarts 0" in none and "restarts 0 (" not in none
