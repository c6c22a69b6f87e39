"""The policy function alone: no processes, no files, time as a number in each event."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.policy import decide_all
from tests.support.policy import of as kinds
from trainwarden.supervisor.core import policy as p

RULES = p.Rules(
    keep_last=3,
    backoff_initial_s=1.0,
    backoff_max_s=8.0,
    max_restarts_without_progress=3,
    stall_timeout_s=60.0,
    stop_timeout_s=10.0,
    max_loss=20.0,
    divergence_retries=1,
    dump_timeout_s=0.0,  # a hang's SIGTERM at once; the dump before it: test_hang_dump.py
    # Retention keeps keep_last only; the checkpoints a spike rollback needs: test_spikes.py.
    spikes=p.SpikeRules(enabled=False),
)


def run(events: list[object], state: p.State | None = None, rules: p.Rules = RULES):
    return decide_all(events, state, rules)


def commit(step: int, t: float = 1.0) -> p.CheckpointCommitted:
    return p.CheckpointCommitted(t, step, f"step_{step:06d}.bin", 100)


def started(pid: int = 100, t: float = 0.0) -> tuple[p.State, list]:
    return run([p.Startup(t), p.TrainerSpawned(t, pid)])


# ------------------------------------------------------------------ life cycle


def test_startup_spawns_from_newest_checkpoint():
    state = p.State(
        checkpoints=(p.Ckpt(100, "step_000100.bin", 1), p.Ckpt(200, "step_000200.bin", 1))
    )
    state, actions = run([p.Startup(0.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 200
    assert spawn.seg == 1 and state.phase == "starting"


def test_first_step_line_makes_it_running_and_exit_zero_is_finished():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 1, 3.0)], state)
    assert state.phase == "running" and state.last_step == 1
    state, actions = run([p.TrainerExited(2.0, 100, 0)], state)
    assert state.phase == "finished"
    assert not kinds(actions, p.Spawn)


def test_crash_restarts_after_doubling_backoff_and_halts_in_crash_loop():
    state, _ = started()
    delays = []
    pid = 100
    t = 0.0
    for _ in range(RULES.max_restarts_without_progress):
        state, actions = run([p.TrainerExited(t, pid, 1)], state)
        assert state.phase == "backoff"
        delays.append(state.backoff_until - t)
        t = state.backoff_until
        state, actions = run([p.Tick(t)], state)
        assert kinds(actions, p.Spawn)
        pid += 1
        state, _ = run([p.TrainerSpawned(t, pid)], state)
    assert delays == [1.0, 2.0, 4.0]
    state, actions = run([p.TrainerExited(t, pid, 1)], state)
    assert state.phase == "crash_loop"
    assert any(isinstance(a, p.Record) and a.kind == "halt" for a in actions)
    assert not kinds(actions, p.Spawn)


def test_progress_resets_backoff_and_counter():
    state, _ = started()
    state, _ = run([p.TrainerExited(0.0, 100, 1), p.Tick(1.0), p.TrainerSpawned(1.0, 101)], state)
    assert state.restarts_without_progress == 1 and state.next_backoff_s == 2.0
    state, _ = run([p.StepLogged(2.0, 1, 3.0), commit(10, 3.0)], state)
    assert state.restarts_without_progress == 0 and state.next_backoff_s in (None, 1.0)


def test_zero_backoff_restarts_in_the_same_decision():
    rules = replace(RULES, backoff_initial_s=0.0)
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], rules=rules)
    state, actions = run([p.TrainerExited(1.0, 1, -9)], state, rules)
    assert kinds(actions, p.Spawn) and state.phase == "starting"


def test_checkpoint_the_trainer_dies_on_twice_is_quarantined_and_the_older_one_used():
    ckpts = (p.Ckpt(100, "step_000100.bin", 1), p.Ckpt(200, "step_000200.bin", 1))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], p.State(checkpoints=ckpts))
    assert state.resume_step == 200
    state, actions = run([p.TrainerExited(1.0, 1, 1, read_resume=True)], state)
    assert not kinds(actions, p.Quarantine)
    state, actions = run(
        [p.Tick(10.0), p.TrainerSpawned(10.0, 2), p.TrainerExited(11.0, 2, 1, read_resume=True)],
        state,
    )
    (q,) = kinds(actions, p.Quarantine)
    assert q.step == 200
    state, actions = run([p.Tick(100.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 100


def test_a_step_beyond_the_checkpoint_clears_its_suspicion():
    ckpts = (p.Ckpt(100, "step_000100.bin", 1),)
    state, _ = run(
        [p.Startup(0.0), p.TrainerSpawned(0.0, 1), p.TrainerExited(1.0, 1, 1, read_resume=True)],
        p.State(checkpoints=ckpts),
    )
    assert p.failures_of(state, 100) == 1
    state, _ = run([p.Tick(5.0), p.TrainerSpawned(5.0, 2), p.StepLogged(6.0, 101, 2.0)], state)
    assert p.failures_of(state, 100) == 0
    state, actions = run([p.TrainerExited(7.0, 2, 1)], state)
    assert not kinds(actions, p.Quarantine)


def test_deaths_before_the_checkpoint_was_read_are_the_trainers_never_the_checkpoints():
    """A broken train.py, a missing program: starts that die before reading the checkpoint
    they were given suspect no checkpoint; the crash loop says the trainer's last line."""
    ckpts = (p.Ckpt(100, "step_000100.bin", 1), p.Ckpt(200, "step_000200.bin", 1))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], p.State(checkpoints=ckpts))
    said = "SyntaxError: invalid syntax"
    t, pid = 1.0, 1
    while state.phase != "crash_loop":
        state, actions = run([p.TrainerExited(t, pid, 1, last_line=said)], state)
        assert not kinds(actions, p.Quarantine) and not state.suspects and not state.failures
        (crash,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "crash"]
        assert crash.fields["last_line"] == said
        failed = [
            a
            for a in actions
            if isinstance(a, p.Record) and a.kind == "trainer_failed_before_resume"
        ]
        assert failed and failed[0].fields["step"] == 200
        state, actions = run(
            [p.Tick(t + 100.0), p.SpawnFailed(t + 100.0, "./train.sh: not found")], state
        )
        assert not kinds(actions, p.Quarantine)
        if state.phase == "crash_loop":
            break
        t, pid = t + 200.0, pid + 1
        state, _ = run([p.Tick(t), p.TrainerSpawned(t, pid)], state)
        assert state.resume_step == 200
    assert [c.step for c in state.checkpoints] == [100, 200]
    assert "./train.sh: not found" in (state.halt_reason or "")
    # Started again once the cause is fixed: from the newest verified checkpoint.
    state, actions = run([p.Operator(9_000.0, 7, p.Start())], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 200


def test_the_crash_loop_names_the_trainers_last_line():
    state, _ = started()
    t, pid = 1.0, 100
    while state.phase != "crash_loop":
        state, _ = run([p.TrainerExited(t, pid, 1, last_line="ModuleNotFoundError: torch")], state)
        t, pid = t + 100.0, pid + 1
        if state.phase != "crash_loop":
            state, _ = run([p.Tick(t), p.TrainerSpawned(t, pid)], state)
    assert "the trainer's last line: ModuleNotFoundError: torch" in (state.halt_reason or "")


def test_a_run_that_had_checkpoints_never_starts_from_scratch_by_itself():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 10, 3.0), commit(10, 1.1)], state)
    assert state.verified_high == 10
    # Its only checkpoint is set aside (a divergence right after it, say), then a crash.
    state, _ = run([p.CheckpointChanged(2.0, 10, "step_000010.bin", "weights differ")], state)
    assert not state.checkpoints
    state, actions = run([p.TrainerExited(3.0, 100, 1), p.Tick(50.0)], state)
    assert not kinds(actions, p.Spawn)
    assert state.phase == "no_checkpoint" and "step 10" in (state.halt_reason or "")
    (halt,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "halt"]
    assert (
        halt.fields["state"] == "no_checkpoint" and "--from-scratch" in halt.fields["instruction"]
    )
    # A plain start is refused and says what to do; from scratch is the operator's choice.
    state, actions = run([p.Operator(60.0, 1, p.Start())], state)
    (reply,) = kinds(actions, p.Reply)
    assert not reply.ok and reply.code == "no_checkpoint" and "--from-scratch" in reply.message
    assert not kinds(actions, p.Spawn)
    state, actions = run([p.Operator(61.0, 2, p.Start(from_scratch=True))], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is None
    assert [a for a in actions if isinstance(a, p.Record) and a.kind == "start_from_scratch"]
    assert state.verified_high is None and not state.from_scratch


def test_from_scratch_is_refused_while_a_verified_checkpoint_is_there():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 10, 3.0), commit(10, 1.1)], state)
    state, _ = run([p.Operator(2.0, 1, p.Stop()), p.TrainerExited(3.0, 100, 0)], state)
    assert state.phase == "stopped"
    state, actions = run([p.Operator(4.0, 2, p.Start(from_scratch=True))], state)
    (reply,) = kinds(actions, p.Reply)
    assert not reply.ok and reply.code == "bad_argument" and "step 10" in reply.message
    assert not kinds(actions, p.Spawn)


def test_a_file_left_at_the_fixed_name_is_quarantined_by_the_start_made_again():
    # An in-place trainer's fresh start found a file at its fixed name and was not made.
    state, actions = run([p.Startup(0.0)])
    (refused,) = kinds(actions, p.Spawn)
    assert refused.resume is None and refused.leftover is None
    state, actions = run([p.FixedFileLeftover(0.5, "ckpt.bin")], state)
    # The same start again, moving that file to quarantine/ first: never resumed from,
    # never overwritten by the fresh trainer.
    (spawn,) = actions
    reason = (
        "a fresh start, from no snapshot: the fixed file left there is neither resumed from"
        " nor overwritten"
    )
    leftover = p.Quarantine(None, "ckpt.bin", reason, retract_mirror=False)
    assert spawn == replace(refused, leftover=leftover)
    assert state.seg == refused.seg and state.phase == "starting"
    state, _ = run([p.TrainerSpawned(1.0, 100)], state)
    assert state.phase == "starting" and state.trainer_pid == 100


def test_a_run_that_never_had_a_checkpoint_starts_from_scratch_as_before():
    state, _ = started()
    state, actions = run(
        [p.StepLogged(1.0, 5, 3.0), p.TrainerExited(2.0, 100, 1), p.Tick(10.0)], state
    )
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is None and state.phase == "starting"


def test_verified_high_survives_a_daemon_restart():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 10, 3.0), commit(10, 1.1)], state)
    restored, _ = run([p.Restored(0.0, p.persisted(state))])
    assert restored.verified_high == 10
    restored, actions = run([p.Startup(1.0, last_logged_step=12)], restored)
    assert restored.phase == "no_checkpoint" and not kinds(actions, p.Spawn)


def test_stall_sends_sigterm_then_sigkill_then_restarts():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 1, 3.0)], state)
    assert p.deadline(state, RULES) == 61.0
    state, actions = run([p.Tick(61.0)], state)
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == ["SIGTERM"]
    state, actions = run([p.Tick(71.0)], state)
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == ["SIGKILL"]
    state, actions = run([p.TrainerExited(71.1, 100, -9)], state)
    crash = [a for a in actions if isinstance(a, p.Record) and a.kind == "crash"]
    assert crash and "hang" in crash[0].fields["cause"]
    assert state.phase == "backoff"


def test_a_stop_while_a_hung_trainer_is_killed_stands_instead_of_the_restart():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 1, 3.0), p.Tick(61.0)], state)
    assert state.stop_reason == "stall"
    state, actions = run([p.Operator(62.0, 7, p.Stop(), None)], state)
    assert not replies(actions)  # answered at the exit, as any stop is
    (said,) = kinds(actions, p.Progress)
    assert "no restart" in said.message and "stopped logging steps" in said.message
    state, actions = run([p.Tick(71.0), p.TrainerExited(71.1, 100, -9)], state)
    assert not kinds(actions, p.Spawn) and state.phase == "stopped"
    (reply,) = replies(actions)
    assert reply.ok and reply.request_id == 7 and reply.result["outcome"] == "killed"
    state, actions = run([p.Tick(200.0)], state)
    assert not kinds(actions, p.Spawn)


def test_a_stop_during_the_kill_of_a_trainer_that_outlives_its_wait_still_stands():
    """A hung trainer stuck where SIGKILL cannot reach it (in a driver): the stop's wait
    ends with a timeout, and the run still stops when the trainer is finally gone."""
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 1, 3.0), p.Tick(61.0)], state)
    state, _ = run([p.Operator(62.0, 7, p.Stop(), None), p.Tick(71.0)], state)
    state, actions = run([p.Tick(500.0)], state)
    (reply,) = replies(actions)
    assert not reply.ok and reply.code == "timeout"
    assert reply.message == (
        "the trainer (pid 100) had not exited when the stop's wait ran out; the run still"
        " stops, with no restart, once it is gone"
    )
    state, actions = run([p.TrainerExited(900.0, 100, -9), p.Tick(1000.0)], state)
    assert not kinds(actions, p.Spawn) and state.phase == "stopped"


def test_a_stop_while_a_diverging_trainer_is_killed_stands_and_start_resumes_before_it():
    ckpts = tuple(p.Ckpt(s, f"step_{s:06d}.bin", 1) for s in (100, 200, 300))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], p.State(checkpoints=ckpts))
    state, _ = run([p.StepLogged(1.0, 250, math.nan)], state)
    state, actions = run([p.Operator(1.05, 7, p.Stop(), None), p.TrainerExited(1.1, 1, -9)], state)
    assert not kinds(actions, p.Spawn) and state.phase == "stopped"
    (reply,) = replies(actions)
    assert reply.ok and reply.result["state"] == "stopped"
    state, actions = run([p.Operator(5.0, 8, p.Start(), None)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 200  # 300 stays set aside


def test_a_stop_while_a_diverging_trainer_is_killed_for_good_is_answered_with_the_halt():
    ckpts = tuple(p.Ckpt(s, f"step_{s:06d}.bin", 1) for s in (100, 200, 300))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], p.State(checkpoints=ckpts))
    state, _ = run([p.StepLogged(1.0, 250, math.nan), p.TrainerExited(1.1, 1, -9)], state)
    state, _ = run([p.TrainerSpawned(2.0, 2), p.StepLogged(3.0, 250, 25.0)], state)
    state, actions = run([p.Operator(3.05, 7, p.Stop(), None), p.TrainerExited(3.1, 2, -9)], state)
    assert state.phase == "diverged" and not kinds(actions, p.Spawn)
    (reply,) = replies(actions)
    assert reply.ok and reply.result["state"] == "diverged"


def test_a_stop_while_nothing_runs_is_still_refused():
    state, _ = started()
    state, _ = run([p.TrainerExited(1.0, 100, 1)], state)
    assert state.phase == "backoff"
    state, actions = run([p.Operator(1.5, 7, p.Stop(), None)], state)
    assert state.phase == "stopped"
    state, actions = run([p.Operator(2.0, 8, p.Stop(), None)], state)
    (reply,) = replies(actions)
    assert not reply.ok and reply.code == "wrong_state"


def test_a_hang_while_no_line_matched_the_parser_says_so():
    state, _ = started()
    assert state.seg == 1
    state, actions = run([p.ParserNoMatch(30.0, 1, "step-line", "iter 1: loss 3.41")], state)
    assert actions == [] and state.parser_no_match == ("step-line", "iter 1: loss 3.41")
    state, actions = run([p.Tick(60.0)], state)
    (stall,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "stall"]
    assert stall.fields["parser_no_match"] == {"parser": "step-line", "sample": "iter 1: loss 3.41"}
    state, actions = run([p.TrainerExited(61.0, 100, -15)], state)
    (crash,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "crash"]
    assert "no line matched parser step-line" in crash.fields["cause"]
    # The next start begins without it; a report about the old start changes nothing.
    state, _ = run([p.Tick(100.0), p.TrainerSpawned(100.0, 101)], state)
    assert state.seg == 2 and state.parser_no_match is None
    state, _ = run([p.ParserNoMatch(101.0, 1, "step-line", "x")], state)
    assert state.parser_no_match is None


def test_a_step_line_clears_parser_no_match_and_a_later_hang_is_a_plain_one():
    state, _ = started()
    state, _ = run(
        [p.ParserNoMatch(30.0, 1, "step-line", "junk"), p.StepLogged(31.0, 1, 3.0)], state
    )
    assert state.parser_no_match is None
    state, actions = run([p.Tick(91.0)], state)
    (stall,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "stall"]
    assert "parser_no_match" not in stall.fields
    _, actions = run([p.TrainerExited(92.0, 100, -15)], state)
    (crash,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "crash"]
    assert crash.fields["cause"] == "hang (no step line)"


def test_checkpoint_writing_extends_the_stall_deadline():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 1, 3.0), p.CheckpointWriting(50.0)], state)
    state, actions = run([p.Tick(61.0)], state)
    assert not kinds(actions, p.SignalTrainer)
    assert p.deadline(state, RULES) == 110.0


def test_divergence_kills_at_once_quarantines_poisoned_and_rolls_back():
    ckpts = tuple(p.Ckpt(s, f"step_{s:06d}.bin", 1) for s in (100, 200, 300))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], p.State(checkpoints=ckpts))
    state, actions = run([p.StepLogged(1.0, 250, math.nan)], state)
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == ["SIGKILL"]
    assert [q.step for q in kinds(actions, p.Quarantine)] == [300]
    state, actions = run([p.TrainerExited(1.1, 1, -9)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 200
    # The same divergence again: halt.
    state, _ = run([p.TrainerSpawned(2.0, 2)], state)
    state, _ = run([p.StepLogged(3.0, 250, 25.0), p.TrainerExited(3.1, 2, -9)], state)
    assert state.phase == "diverged"


def test_divergence_counter_resets_once_a_checkpoint_passes_the_bad_step():
    state, _ = started()
    state, _ = run(
        [
            p.StepLogged(1.0, 50, math.inf),
            p.TrainerExited(1.1, 100, -9),
            p.TrainerSpawned(2.0, 101),
        ],
        state,
    )
    assert state.divergences == 1
    state, _ = run([p.StepLogged(3.0, 60, 2.0), commit(60, 3.0)], state)
    assert state.divergences == 0
    state, _ = run([p.StepLogged(4.0, 500, math.nan), p.TrainerExited(4.1, 101, -9)], state)
    assert state.phase == "starting"


def test_late_commit_from_a_diverged_trainer_is_quarantined():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 40, math.nan)], state)
    state, actions = run([commit(40, 1.05)], state)
    assert kinds(actions, p.Quarantine) and not state.checkpoints


# ------------------------------------------------------------------ operator


def op(cmd: str, t: float = 5.0, rid: int = 1, **args):
    command = p.parse_command(cmd, args)
    assert not isinstance(command, p.BadRequest), command
    return p.Operator(t, rid, command)


def replies(actions):
    return kinds(actions, p.Reply)


def test_save_wait_answers_when_the_checkpoint_commits():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 7, 3.0)], state)
    state, actions = run([op("save", wait=True)], state)
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == ["SIGUSR1"]
    assert not replies(actions) and state.phase == "saving"
    state, actions = run([commit(7, 6.0)], state)
    (reply,) = replies(actions)
    assert reply.ok and reply.result["step"] == 7
    assert state.phase == "running"


def test_save_is_refused_when_no_trainer_runs():
    state, _ = started()
    state, _ = run([p.TrainerExited(1.0, 100, 0)], state)
    _, actions = run([op("save")], state)
    (reply,) = replies(actions)
    assert not reply.ok and reply.code == "wrong_state" and "finished" in reply.message


def test_stop_then_start():
    state, _ = started()
    state, actions = run([op("stop")], state)
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == [
        "SIGTERM"
    ] and state.phase == "stopping"
    state, actions = run([commit(20, 6.0), p.TrainerExited(6.1, 100, 0)], state)
    (reply,) = replies(actions)
    assert reply.ok and reply.result["checkpoint"]["step"] == 20
    assert state.phase == "stopped"
    state, actions = run([op("start", t=7.0, rid=2)], state)
    assert kinds(actions, p.Spawn)[0].resume.step == 20
    assert not replies(actions)  # answered once the trainer has started
    state, actions = run([p.TrainerSpawned(7.1, 101)], state)
    (reply,) = replies(actions)
    assert reply.ok and reply.result["resume_step"] == 20
    _, actions = run([op("start", t=8.0, rid=3)], state)
    assert replies(actions)[0].code == "wrong_state"


def test_stop_during_backoff_cancels_the_restart():
    state, _ = started()
    state, _ = run([p.TrainerExited(1.0, 100, 1)], state)
    state, actions = run([op("stop", t=1.2)], state)
    assert state.phase == "stopped" and replies(actions)[0].ok
    _, actions = run([p.Tick(100.0)], state)
    assert not kinds(actions, p.Spawn)


def test_shutdown_stops_the_trainer_then_exits():
    state, _ = started()
    state, actions = run([p.ShutdownRequested(1.0)], state)
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == ["SIGTERM"]
    state, actions = run([p.TrainerExited(2.0, 100, 0)], state)
    assert kinds(actions, p.Exit) and state.phase == "stopped"


def test_pin_unknown_step_and_unpin_triggers_retention():
    state = p.State(checkpoints=tuple(p.Ckpt(s, f"step_{s:06d}.bin", 1) for s in (1, 2, 3)))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 9)], state)
    _, actions = run([op("pin", step=99)], state)
    assert replies(actions)[0].code == "bad_argument"
    state, _ = run([op("pin", step=1)], state)
    state, actions = run([commit(4, 2.0)], state)
    assert not kinds(actions, p.Delete)  # 1 is pinned; 2, 3, 4 are the newest three
    state, actions = run([op("unpin", step=1, rid=2)], state)
    assert [d.step for d in kinds(actions, p.Delete)] == [1]


def test_an_unpin_dry_run_names_what_retention_would_delete_and_changes_nothing():
    ckpts = tuple(p.Ckpt(s, f"step_{s:06d}.bin", 1) for s in (1, 2, 3, 4, 5))
    state = p.State(checkpoints=ckpts, pinned=frozenset({1, 5}))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 9)], state)
    after, actions = run([op("unpin", step=1, dry_run=True, rid=2)], state)
    (reply,) = replies(actions)
    assert reply.ok and reply.result == {
        "step": 1,
        "pinned": True,
        "dry_run": True,
        "would_delete": [1],
    }
    assert not kinds(actions, p.Delete) and after.pinned == {1, 5}
    assert not kinds(actions, p.Record)  # a question, not an action: not journaled
    # Unpinning the newest lets retention drop the oldest unpinned one it kept beside it.
    _, actions = run([op("unpin", step=5, dry_run=True, rid=3)], after)
    assert replies(actions)[0].result["would_delete"] == [2]
    # Within keep_last nothing goes, and it is said so.
    small = p.State(checkpoints=ckpts[:2], pinned=frozenset({1}))
    small, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 9)], small)
    _, actions = run([op("unpin", step=1, dry_run=True, rid=4)], small)
    assert replies(actions)[0].result["would_delete"] == []
    bad = p.parse_command("unpin", {"step": 1, "dry_run": "yes"})
    assert isinstance(bad, p.BadRequest) and bad.code == "bad_argument"


def test_resume_checkpoint_is_released_once_the_trainer_moves_past_it():
    rules = replace(RULES, keep_last=2)
    ckpts = (p.Ckpt(10, "step_000010.bin", 1),)
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], p.State(checkpoints=ckpts), rules)
    state, actions = run([commit(20, 1.0), commit(30, 2.0)], state, rules)
    assert not kinds(actions, p.Delete)  # 10 is still being loaded
    state, actions = run([p.StepLogged(3.0, 31, 2.0)], state, rules)
    assert [d.step for d in kinds(actions, p.Delete)] == [10]


def test_unknown_command_is_an_error_reply():
    bad = p.parse_command("frobnicate", {})
    assert isinstance(bad, p.BadRequest) and bad.code == "unknown_command"


def test_persisted_round_trip():
    state = p.State(
        phase="crash_loop",
        seg=4,
        restarts=7,
        restarts_without_progress=3,
        failures=((200, 1),),
        pinned=frozenset({100}),
        halt_reason="x",
    )
    restored = p.restore(p.persisted(state), RULES)
    assert p.persisted(restored) == p.persisted(state)
    running = p.restore(p.persisted(replace(state, phase="running")), RULES)
    assert running.phase == "starting"


def test_boot_recovery_reports_lost_steps():
    state = p.State(checkpoints=(p.Ckpt(100, "step_000100.bin", 1),))
    _, actions = run([p.Startup(0.0, last_logged_step=137, unclean=True)], state)
    (rec,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "boot_recovery"]
    assert rec.fields["steps_lost"] == 37 and rec.fields["resume_step"] == 100


# ------------------------------------------------------------------ properties

steps = st.integers(min_value=1, max_value=60)
events = st.one_of(
    st.builds(lambda s: ("commit", s), steps),
    st.builds(lambda s: ("step", s), steps),
    st.just(("nan",)),
    st.just(("crash",)),
    st.just(("exit0",)),
    st.just(("tick",)),
    st.builds(lambda s: ("pin", s), steps),
    st.builds(lambda s: ("unpin", s), steps),
    st.just(("stop",)),
    st.just(("start",)),
    st.just(("save",)),
    st.builds(lambda s: ("reject", s), steps),
)


def materialise(kind: tuple, state: p.State, t: float, pid: int) -> object:
    name = kind[0]
    if name == "commit":
        return commit(kind[1], t)
    if name == "step":
        return p.StepLogged(t, kind[1], 2.0)
    if name == "nan":
        return p.StepLogged(t, (state.last_step or 0) + 1, math.nan)
    if name == "crash":
        return p.TrainerExited(t, state.trainer_pid or -1, 1)
    if name == "exit0":
        return p.TrainerExited(t, state.trainer_pid or -1, 0)
    if name == "tick":
        return p.Tick(t)
    if name == "reject":
        return p.CheckpointRejected(t, kind[1], f"step_{kind[1]:06d}.bin", "bad")
    args = {"step": kind[1]} if len(kind) > 1 else {}
    command = p.parse_command(name, args)
    assert not isinstance(command, p.BadRequest)
    return p.Operator(t, int(t * 1000), command)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=60), st.integers(min_value=1, max_value=4))
# A restarted trainer still loading its checkpoint when a newer one commits.
@example([("commit", 5), ("crash",), ("tick",), ("commit", 10)], 1)
# Its first step past that checkpoint frees it in the same decision.
@example([("crash",), ("stop",), ("commit", 1), ("start",), ("commit", 2), ("step", 2)], 1)
def test_retention_invariants_hold_for_any_event_sequence(sequence, keep_last):
    rules = replace(RULES, keep_last=keep_last)
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 999)], rules=rules)
    on_disk: set[int] = set()
    t = 0.0
    pid = 1000
    loading_from: int | None = None
    """The checkpoint the live trainer was started from, until it logs a step past it."""
    for kind in sequence:
        t += 7.0
        spawns_before = state.seg
        event = materialise(kind, state, t, pid)
        if isinstance(event, p.CheckpointCommitted):
            on_disk.add(event.step)
        before = state
        state, actions = p.decide(state, event, rules)  # type: ignore[arg-type]
        deleted = {a.step for a in actions if isinstance(a, p.Delete)}
        quarantined = {a.step for a in actions if isinstance(a, p.Quarantine)}
        verified_before = {c.step for c in before.checkpoints}
        if isinstance(event, p.CheckpointCommitted) and event.step not in quarantined:
            verified_before.add(event.step)
        # Never the newest verified checkpoint, never a pinned one.
        if verified_before:
            newest = max(verified_before - quarantined, default=None)
            assert newest not in deleted
        assert not (deleted & state.pinned)
        # Only checkpoints older than keep_last newer verified unpinned ones.
        for step in deleted:
            newer = [c for c in state.checkpoints if c.step > step and c.step not in state.pinned]
            assert len(newer) >= rules.keep_last
        # Never the one a live trainer was started from, before it logged a step past it
        # (tracked from the spawns and step lines themselves, not the policy's fields); the
        # line that steps past it may free it at once.
        if (
            isinstance(event, p.StepLogged)
            and before.trainer_alive
            and loading_from is not None
            and event.step > loading_from
        ):
            loading_from = None
        if loading_from is not None:
            assert loading_from not in deleted
        remaining_unpinned = [c for c in state.checkpoints if c.step not in state.pinned]
        verified_unpinned = [s for s in verified_before - quarantined if s not in state.pinned]
        assert len(remaining_unpinned) >= min(rules.keep_last, len(verified_unpinned))
        on_disk -= deleted | quarantined
        if not state.trainer_alive:
            loading_from = None
        for spawn in (a for a in actions if isinstance(a, p.Spawn)):
            assert spawn.resume is None or spawn.resume.step in {c.step for c in state.checkpoints}
            pid += 1
            state, _ = p.decide(state, p.TrainerSpawned(t, pid), rules)
            loading_from = spawn.resume.step if spawn.resume is not None else None
        assert state.seg >= spawns_before
        assert state.restarts_without_progress <= rules.max_restarts_without_progress
        assert (state.next_backoff_s or 0) <= rules.backoff_max_s


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=0.0, max_value=50.0),
    st.floats(min_value=0.0, max_value=400.0),
    st.integers(min_value=1, max_value=12),
)
def test_backoff_is_monotone_bounded_and_starts_at_the_initial_delay(initial, ceiling, crashes):
    rules = replace(
        RULES,
        backoff_initial_s=initial,
        backoff_max_s=max(initial, ceiling),
        max_restarts_without_progress=crashes + 1,
    )
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], rules=rules)
    t, pid, delays = 0.0, 1, []
    for _ in range(crashes):
        state, actions = run([p.TrainerExited(t, pid, 1)], state, rules)
        (scheduled,) = [
            a for a in actions if isinstance(a, p.Record) and a.kind == "restart_scheduled"
        ]
        delays.append(scheduled.fields["backoff_s"])
        if state.phase == "backoff":
            t = state.backoff_until
            state, actions = run([p.Tick(t)], state, rules)
        assert kinds(actions, p.Spawn)
        pid += 1
        state, _ = run([p.TrainerSpawned(t, pid)], state, rules)
    assert delays[0] == initial
    assert all(a <= b for a, b in zip(delays, delays[1:], strict=False))
    assert all(d <= rules.backoff_max_s for d in delays)
    # Progress (a step past the checkpoint, then a new checkpoint) starts over.
    state, _ = run([p.StepLogged(t, 1, 2.0), commit(1, t)], state, rules)
    state, actions = run([p.TrainerExited(t, pid, 1)], state, rules)
    (scheduled,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "restart_scheduled"]
    assert scheduled.fields["backoff_s"] == initial


# ------------------------------------------------------------------ start-up, verdicts, mirror


def test_startup_restores_the_journal_state_and_quarantines_what_does_not_verify():
    state, _ = run(
        [p.Restored(0.0, {"phase": "stopped", "seg": 3, "pinned": [5]}, frozenset({10}))]
    )
    assert state.phase == "stopped" and state.seg == 3 and state.pinned == {5, 10}
    scanned = (
        p.Scanned("step_000010.bin", 10, p.Outcome.VERIFIED, bytes=7, mtime=1.5),
        p.Scanned("step_000020.bin", 20, p.Outcome.INVALID, reason="truncated"),
        p.Scanned("step_000030.bin", 30, p.Outcome.VANISHED, reason="vanished"),
    )
    state, actions = run([p.Startup(1.0, scanned=scanned)], state)
    assert state.checkpoints == (p.Ckpt(10, "step_000010.bin", 7, 1.5),)
    quarantined = kinds(actions, p.Quarantine)
    assert [(q.step, q.reason) for q in quarantined] == [(20, "truncated"), (30, "vanished")]
    # Found broken at start-up: the mirror's copy (verified when it was made) stays.
    assert not any(q.retract_mirror for q in quarantined)
    assert not kinds(actions, p.Spawn)  # stopped stays stopped


def test_a_checkpoint_that_vanished_before_verification_changes_nothing():
    state, _ = started()
    event = p.checkpoint_event(1.0, "step_000010.bin", 10, p.Outcome.VANISHED, "vanished")
    after, actions = run([event], state)
    assert isinstance(event, p.CheckpointVanished) and after == state and actions == []
    rejected = p.checkpoint_event(1.0, "step_000010.bin", 10, p.Outcome.INVALID, "bad")
    _, actions = run([rejected], state)
    (q,) = kinds(actions, p.Quarantine)
    assert q.step == 10 and q.reason == "bad" and q.retract_mirror


MIRRORED = replace(RULES, mirror=True, mirror_keep_last=2)


def test_each_new_checkpoint_is_mirrored_and_the_mirror_is_pruned_after_the_copy():
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], rules=MIRRORED)
    state, actions = run([commit(10, 1.0)], state, MIRRORED)
    assert [a.ckpt.step for a in kinds(actions, p.MirrorCopy)] == [10]
    _, actions = run([commit(10, 1.0)], state, MIRRORED)  # the same commit again
    assert not kinds(actions, p.MirrorCopy)
    _, actions = run([commit(20, 2.0)], state, RULES)  # no mirror configured
    assert not kinds(actions, p.MirrorCopy)
    copied = p.MirrorCopied(3.0, 30, True, mirrored=(10, 20, 30))
    _, actions = run([copied], state, MIRRORED)
    (record,) = kinds(actions, p.Record)
    assert record.kind == "mirrored" and record.fields["removed"] == [10]
    assert kinds(actions, p.PruneMirror) == [p.PruneMirror((10,))]
    # After a rollback the copy is older than the mirror's newest: latest.json names it.
    copied = p.MirrorCopied(4.0, 25, True, mirrored=(20, 25, 30))
    _, actions = run([copied], state, replace(MIRRORED, mirror_keep_last=1))
    assert kinds(actions, p.PruneMirror) == [p.PruneMirror((20,))]
    failed = p.MirrorCopied(5.0, 40, False, seconds=0.25, error="disk full")
    _, actions = run([failed], state, MIRRORED)
    (record,) = kinds(actions, p.Record)
    assert record.entry == {
        "kind": "mirror_failed",
        "step": 40,
        "seconds": 0.25,
        "error": "disk full",
    }
    assert not kinds(actions, p.PruneMirror)
    waiting = p.MirrorCopied(6.0, 50, False, seconds=0.0, superseded_by=60)
    _, actions = run([waiting], state, MIRRORED)
    (record,) = kinds(actions, p.Record)
    assert record.entry == {
        "kind": "mirror_superseded",
        "step": 50,
        "seconds": 0.0,
        "superseded_by": 60,
    }
    assert not kinds(actions, p.PruneMirror)


def test_a_mirror_behind_the_newest_checkpoint_catches_up_at_start():
    ckpts = (p.Ckpt(10, "step_000010.bin", 1), p.Ckpt(20, "step_000020.bin", 1))
    state, actions = run([p.Startup(0.0)], p.State(checkpoints=ckpts), MIRRORED)
    assert kinds(actions, p.ReadMirrorPointer)
    for pointed, copies in ((None, [20]), (10, [20]), (20, [])):
        _, actions = run([p.MirrorPointer(1.0, pointed)], state, MIRRORED)
        assert [a.ckpt.step for a in kinds(actions, p.MirrorCopy)] == copies


@settings(max_examples=300, deadline=None)
@given(
    st.sets(st.integers(min_value=0, max_value=100), min_size=1, max_size=15),
    st.integers(min_value=1, max_value=5),
    st.data(),
)
def test_mirror_retention_keeps_the_newest_and_the_pointed_step(mirrored, keep_last, data):
    pointed = data.draw(st.sampled_from(sorted(mirrored)))
    doomed = p.mirror_deletions(mirrored, pointed, keep_last)
    kept = mirrored - set(doomed)
    newest = sorted(mirrored)[-keep_last:]
    assert pointed in kept and set(newest) <= kept
    # Nothing else survives, and what goes is named oldest first.
    assert kept == set(newest) | {pointed} and doomed == sorted(doomed)


# ------------------------------------------------------------------ parsing the commands


def test_the_core_s_step_bound_is_the_contract_s():
    from trainwarden.supervisor.contract import MAX_STEP
    from trainwarden.supervisor.core.requests import MAX_STEP as CORE_MAX_STEP

    assert CORE_MAX_STEP == MAX_STEP == 2**31 - 1


def test_commands_are_parsed_once_into_typed_values():
    assert p.parse_command("save", {"wait": True, "timeout_s": 5}) == p.Save(True, 5.0)
    assert p.parse_command("pin", {"step": 3}) == p.Pin(3)
    assert p.parse_command("pivot", {"caps": {"docs": 0.5}}) == p.Pivot({"docs": 0.5}, {})
    for cmd, args, message in (
        ("pin", {}, "'pin' needs 'step'"),
        ("unpin", {"step": -1}, "'step' must be an integer between 0 and 2147483647"),
        ("pin", {"step": True}, "'step' must be an integer between 0 and"),
        ("pin", {"step": 2**31}, "'step' must be an integer between 0 and 2147483647, got"),
        ("save", {"wait": "yes"}, "'wait' must be true or false"),
        ("save", {"timeout_s": 0}, "'timeout_s' must be a positive number"),
        ("pivot", {}, "a pivot needs 'caps' or 'floors'"),
        ("pivot", {"caps": {"docs": "half"}}, "'caps' must map arm names to numbers"),
        ("pivot", {"caps": {"docs": 0.5}, "why": 1}, "unexpected argument(s) why"),
    ):
        bad = p.parse_command(cmd, args)
        assert isinstance(bad, p.BadRequest) and bad.code == "bad_argument"
        assert message in bad.message
    save = p.Save(wait=True)
    state, _ = started()
    _, actions = run([p.Operator(1.0, 1, save, uid=7)], state)
    (record,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "operator"]
    assert record.fields == {"cmd": "save", "args": {"wait": True}, "uid": 7}


# ------------------------------------------------------------------ plausible steps


def test_a_commit_far_beyond_the_logged_steps_is_quarantined_and_never_newest():
    rules = replace(RULES, keep_last=1)
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100)], rules=rules)
    state, _ = run(
        [p.StepLogged(1.0, 10, 3.0), commit(10), p.StepLogged(2.0, 20, 3.0), commit(20)],
        state,
        rules,
    )
    state, actions = run([p.StepLogged(3.0, 25, 3.0), commit(99_999_999, 3.0)], state, rules)
    (q,) = kinds(actions, p.Quarantine)
    assert q.step == 99_999_999 and "max_step_jump" in q.reason and "step 25" in q.reason
    assert not kinds(actions, p.Delete)
    assert state.newest is not None and state.newest.step == 20
    # Later real checkpoints are kept, and a crash resumes from the newest real one.
    state, actions = run([p.StepLogged(4.0, 30, 3.0), commit(30, 4.0)], state, rules)
    assert [d.step for d in kinds(actions, p.Delete)] == [20]
    assert [c.step for c in state.checkpoints] == [30]
    state, actions = run([p.TrainerExited(5.0, 100, -9), p.Tick(100.0)], state, rules)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 30


def test_a_commit_ahead_of_the_logged_steps_evicts_nothing_until_the_steps_reach_it():
    """Step 110 planted at logged step 87 (within max_step_jump), keep_last 1: the real 90
    and 100 are kept as they commit; once the trainer logs 110 the plant counts."""
    rules = replace(RULES, keep_last=1)
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100)], rules=rules)
    state, _ = run(
        [p.StepLogged(1.0, 80, 3.0), commit(80), p.StepLogged(2.0, 87, 3.0)], state, rules
    )
    state, actions = run([commit(110, 2.0)], state, rules)
    assert not kinds(actions, p.Quarantine) and not kinds(actions, p.Delete)
    state, actions = run([p.StepLogged(3.0, 90, 3.0), commit(90, 3.0)], state, rules)
    assert [d.step for d in kinds(actions, p.Delete)] == [80]
    state, actions = run([p.StepLogged(4.0, 100, 3.0), commit(100, 4.0)], state, rules)
    assert [d.step for d in kinds(actions, p.Delete)] == [90]
    assert [c.step for c in state.checkpoints] == [100, 110]
    state, actions = run([p.StepLogged(5.0, 110, 3.0)], state, rules)
    assert [d.step for d in kinds(actions, p.Delete)] == [100]


def test_the_default_jump_is_ten_gaps_capped_by_the_planned_total():
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 10, 3.0), commit(10), commit(20)], state)
    assert state.max_commit_gap == 10
    state, _ = run([p.StepLogged(2.0, 20, 3.0)], state)
    assert p.step_jump_limit(state, RULES) == (100, "10 x the largest gap between commits, 10")
    assert p.implausible_step(state, 120, RULES) is None
    assert "more than max_step_jump = 100" in (p.implausible_step(state, 121, RULES) or "")
    capped = replace(RULES, total_steps=50)
    assert p.step_jump_limit(state, capped) == (50, "the planned total_steps")
    assert p.implausible_step(state, 70, capped) is None
    assert p.implausible_step(state, 71, capped) is not None
    assert p.step_jump_limit(state, replace(RULES, max_step_jump=7)) == (7, "configured")
    assert p.implausible_step(state, 28, replace(RULES, max_step_jump=7)) is not None


def test_before_a_gap_is_known_only_the_planned_total_bounds_a_commit():
    state, _ = started()
    assert p.step_jump_limit(state, RULES) is None
    state, actions = run([commit(5_000)], state)
    assert not kinds(actions, p.Quarantine) and state.newest is not None
    state, _ = started()
    rules = replace(RULES, total_steps=1_000)
    state, actions = run([commit(5_000)], state, rules)
    assert [q.step for q in kinds(actions, p.Quarantine)] == [5_000] and state.newest is None
    state, actions = run([commit(1_000)], state, rules)
    assert not kinds(actions, p.Quarantine)


def test_after_a_daemon_restart_the_history_and_the_scanned_gaps_set_the_bound():
    scanned = tuple(
        p.Scanned(f"step_{s:06d}.bin", s, p.Outcome.VERIFIED, bytes=1) for s in (400, 450)
    )
    state, _ = run([p.Startup(0.0, last_logged_step=480, scanned=scanned)])
    assert state.max_commit_gap == 50 and state.resume_step == 450
    state, _ = run([p.TrainerSpawned(1.0, 7)], state)
    state, actions = run([commit(981)], state)
    (q,) = kinds(actions, p.Quarantine)
    assert "step 981 is 501 steps beyond the newest logged step 480" in q.reason
    state, actions = run([commit(980)], state)
    assert not kinds(actions, p.Quarantine)
    assert state.newest is not None and state.newest.step == 980


# ------------------------------------------------------------------ divergence fallback


def resumed_from_newest(steps: tuple[int, ...], rules: p.Rules = RULES) -> p.State:
    ckpts = tuple(p.Ckpt(s, f"step_{s:06d}.bin", 1) for s in steps)
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], p.State(checkpoints=ckpts), rules)
    return state


def diverge_and_respawn(state: p.State, t: float, pid: int, rules: p.Rules = RULES):
    """The trainer logs a step, diverges on the next one, is killed; the next one starts."""
    resume = state.resume_step or 0
    state, actions = run(
        [
            p.StepLogged(t, resume + 1, 3.0),
            p.StepLogged(t + 0.1, resume + 2, math.nan),
            p.TrainerExited(t + 0.2, state.trainer_pid or -1, -9),
        ],
        state,
        rules,
    )
    if kinds(actions, p.Spawn):
        state, _ = run([p.TrainerSpawned(t + 0.3, pid)], state, rules)
    return state, actions


def test_a_divergence_right_after_resuming_twice_falls_back_past_the_checkpoint():
    state = resumed_from_newest((100, 200, 300))
    state, actions = diverge_and_respawn(state, 1.0, 2)
    assert not kinds(actions, p.Quarantine)
    assert p.suspicion_of(state, 300) == 1 and state.resume_step == 300
    state, actions = diverge_and_respawn(state, 2.0, 3)
    (q,) = kinds(actions, p.Quarantine)
    assert q.step == 300 and "diverged" in q.reason and "step 302" in q.reason
    (fallback,) = [a for a in actions if isinstance(a, p.Record) and a.kind == "fallback"]
    assert fallback.fields["abandoned"] == 300 and fallback.fields["resume_step"] == 200
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 200
    assert state.phase == "starting" and state.fallbacks == 1
    # The older checkpoint trains on: past the window, the run's fallbacks are over.
    state, _ = run([p.StepLogged(3.0, 201, 3.0), p.StepLogged(3.1, 211, 3.0)], state)
    assert state.fallbacks == 0 and state.phase == "running"


def test_the_run_halts_in_diverged_once_max_fallbacks_are_spent():
    rules = replace(RULES, max_fallbacks=2, keep_last=4)
    state = resumed_from_newest((100, 200, 300, 400), rules)
    t, pid = 1.0, 2
    resumed = []
    while state.phase != "diverged":
        resumed.append(state.resume_step)
        state, _ = diverge_and_respawn(state, t, pid, rules)
        t, pid = t + 1.0, pid + 1
        assert t < 20.0
    assert resumed == [400, 400, 300, 300, 200, 200]
    assert [c.step for c in state.checkpoints] == [100, 200]
    assert "2 fallbacks" in (state.halt_reason or "")


def test_a_divergence_then_a_death_before_a_step_falls_back_too():
    state = resumed_from_newest((100, 200))
    state, _ = diverge_and_respawn(state, 1.0, 2)
    state, actions = run([p.TrainerExited(2.0, 2, 1, read_resume=True)], state)
    (q,) = kinds(actions, p.Quarantine)
    assert q.step == 200 and "diverged or died 2 times" in q.reason
    assert p.failures_of(state, 200) == 0 and not state.suspects
    state, actions = run([p.Tick(100.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 100


def test_a_divergence_beyond_the_window_is_not_the_checkpoint_s_fault():
    state = resumed_from_newest((100, 200))
    for pid in (2, 3):
        state, actions = run(
            [
                p.StepLogged(1.0, 250, 3.0),
                p.StepLogged(1.1, 251, math.nan),
                p.TrainerExited(1.2, state.trainer_pid or -1, -9),
                p.TrainerSpawned(1.3, pid),
            ],
            state,
        )
        assert not kinds(actions, p.Quarantine) and not state.suspects
    assert state.phase == "diverged"


def pivot_requested() -> p.State:
    """A running trainer at step 85 asked to pivot (docs capped at 0.2, request 7): the
    daemon waits for the pivot's checkpoint."""
    from trainwarden.supervisor.core.requests import PivotContext

    old = {"arms": {"docs": {"cap": 1.0, "floor": 0.0}}}
    new = {"arms": {"docs": {"cap": 0.2, "floor": 0.0}}}
    context = PivotContext(("docs",), (), old, new, (), "20261205T000000Z")
    state, _ = started()
    state, _ = run([p.StepLogged(1.0, 85, 2.0)], state)
    state, _ = run([p.Operator(2.0, 7, p.Pivot(caps={"docs": 0.2}), pivot=context)], state)
    assert state.pivot is not None and state.pivot.stage == "saving"
    return state


def pivoting() -> p.State:
    """The pivot's checkpoint (step 86) is committed: the daemon is stopping the trainer to
    archive the old policy, write the new one and start again."""
    state, _ = run(
        [p.CheckpointSeen(3.0, "step_000086.bin", 86), commit(86, 3.1)], pivot_requested()
    )
    assert state.pivot is not None and state.pivot.stage == "stopping" and state.trainer_alive
    return state


SAVED_ON_ITS_WAY_OUT = [
    p.CheckpointSeen(4.0, "step_000088.bin", 88),
    p.TrainerExited(4.1, 100, 0),
    p.PivotProgress(4.2, "archived"),
    p.PivotProgress(4.3, "policy_written"),
]
"""The trainer stopped for a pivot saves once more on SIGTERM, after the pivot's own
checkpoint, under the old policy: seen before its exit, verified only after the pivot's
file work."""


def test_a_checkpoint_the_old_trainer_wrote_after_the_pivot_step_is_set_aside_when_its_verification_ends_after_the_pivot():
    """Still being verified when the pivot ends, the old trainer's last save is set aside
    then, like those verified in time, and the new start resumes from the pivot's checkpoint
    with a fresh bandit."""
    state, actions = run(SAVED_ON_ITS_WAY_OUT, pivoting())
    assert not kinds(actions, p.Spawn)  # waits for the verification in flight
    state, actions = run([commit(88, 4.4)], state)
    (set_aside,) = kinds(actions, p.Quarantine)
    assert (set_aside.step, set_aside.cause, set_aside.cause_step) == (88, "pivot", 86)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 86 and spawn.pivot
    assert 88 not in {c.step for c in state.checkpoints}


def test_a_stop_during_a_pivots_stop_lets_the_pivot_finish_then_stands():
    state, actions = run([p.Operator(3.5, 9, p.Stop(), None)], pivoting())
    assert not replies(actions)  # answered when the pivot is done, with no restart
    (said,) = kinds(actions, p.Progress)
    assert "no restart" in said.message and "pivot" in said.message
    state, actions = run(
        [
            p.TrainerExited(4.1, 100, 0),
            p.PivotProgress(4.2, "archived"),
            p.PivotProgress(4.3, "policy_written"),
        ],
        state,
    )
    pivot_reply, stop_reply = replies(actions)
    assert pivot_reply.request_id == 7 and pivot_reply.ok and pivot_reply.result["step"] == 86
    assert stop_reply.request_id == 9 and stop_reply.ok
    assert stop_reply.result["state"] == "stopped" and stop_reply.result["checkpoint"]["step"] == 86
    assert not kinds(actions, p.Spawn) and state.phase == "stopped" and state.pivot is None
    state, actions = run([p.Tick(100.0)], state)
    assert not kinds(actions, p.Spawn)
    # The next start is the pivot's: from its checkpoint, under the new policy.
    state, actions = run([p.Operator(101.0, 10, p.Start(), None)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 86


def test_a_stop_while_a_pivot_archives_stands_once_the_pivot_is_done():
    state, _ = run([p.TrainerExited(4.1, 100, 0)], pivoting())
    assert state.phase == "pivoting" and not state.trainer_alive
    state, actions = run([p.Operator(4.15, 9, p.Stop(), None)], state)
    assert not replies(actions)
    # A wait that runs out does not bring the restart back.
    state, actions = run([p.Tick(600.0), p.PivotProgress(601.0, "archived")], state)
    (late,) = replies(actions)
    assert late.request_id == 9 and late.code == "timeout"
    assert late.message.startswith("the pivot was still at archiving when the stop's wait")
    state, actions = run([p.PivotProgress(602.0, "policy_written")], state)
    assert not kinds(actions, p.Spawn) and state.phase == "stopped"
    (pivot_reply,) = replies(actions)
    assert pivot_reply.request_id == 7 and pivot_reply.ok


def test_a_stop_during_a_pivot_that_fails_is_answered_stopped():
    state, _ = run([p.TrainerExited(4.1, 100, 0)], pivoting())
    state, _ = run([p.Operator(4.15, 9, p.Stop(), None)], state)
    state, actions = run([p.PivotProgress(4.2, "archived", "disk full")], state)
    answered = {r.request_id: r for r in replies(actions)}
    assert not answered[7].ok and answered[9].ok and answered[9].result["state"] == "stopped"
    assert state.phase == "stopped" and not kinds(actions, p.Spawn)


def test_a_stop_before_the_pivots_checkpoint_gives_the_pivot_up_and_stops():
    state, actions = run([p.Operator(2.5, 9, p.Stop(), None)], pivot_requested())
    (given_up,) = replies(actions)
    assert given_up.request_id == 7 and not given_up.ok
    assert "pivot abandoned: stopped by operator" in given_up.message
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == ["SIGTERM"]
    state, actions = run([commit(86, 2.8), p.TrainerExited(3.0, 100, 0)], state)
    (stopped,) = replies(actions)
    assert stopped.request_id == 9 and stopped.ok and stopped.result["outcome"] == "saved"
    assert state.phase == "stopped" and state.pivot is None
    assert not kinds(actions, p.Spawn) and not kinds(actions, p.Archive)


def test_a_stop_during_a_pivot_answers_once_the_old_trainers_last_save_is_set_aside():
    state, _ = run([p.Operator(3.5, 9, p.Stop(), None)], pivoting())
    state, actions = run(SAVED_ON_ITS_WAY_OUT, state)
    assert [r.request_id for r in replies(actions)] == [7]  # the stop waits for the check
    state, actions = run([commit(88, 4.4)], state)
    (set_aside,) = kinds(actions, p.Quarantine)
    assert set_aside.step == 88 and set_aside.cause == "pivot"
    (reply,) = replies(actions)
    assert reply.request_id == 9 and reply.ok and reply.result["checkpoint"]["step"] == 86
    assert state.phase == "stopped" and not kinds(actions, p.Spawn)


def test_a_shutdown_during_a_pivots_stop_gives_the_pivot_up_and_says_why():
    state, actions = run([p.Operator(3.5, 9, p.Shutdown(), None)], pivoting())
    state, actions = run([p.TrainerExited(4.0, 100, 0)], state)
    answered = {r.request_id: r for r in replies(actions)}
    assert answered[7].message == "pivot abandoned: the daemon is shutting down"
    assert answered[9].ok and kinds(actions, p.Exit) and not kinds(actions, p.Spawn)


def test_a_stop_after_a_failed_pivot_is_refused_as_with_nothing_running():
    state, _ = run([p.TrainerExited(4.1, 100, 0)], pivoting())
    state, _ = run([p.PivotProgress(4.2, "archived", "disk full")], state)
    assert state.phase == "stopped" and state.pivot is not None  # `start` completes it
    state, actions = run([p.Operator(5.0, 9, p.Stop(), None)], state)
    (reply,) = replies(actions)
    assert not reply.ok and reply.code == "wrong_state"
    assert reply.message == "nothing to stop: the run is stopped"
    assert state.pivot is not None and not state.waiters
