"""Leaving a Slurm job before its limit (core.requeue), the pure policy: a live run saves,
its save is verified, then the job is requeued and the daemon exits 75; a run that
finished or halted is not requeued; the job's deadline cuts a late save or verification
short and says so; with exit_when_ended a run that ends ends the job."""

from __future__ import annotations

from dataclasses import replace

from tests.supervisor.test_exit_codes import (
    RULES,
    crash_looped,
    diverged,
    exits,
    finished,
    operator,
    run,
    started,
)
from tests.support.policy import decide_all
from tests.support.policy import of as kinds
from trainwarden.supervisor.core import policy as p
from trainwarden.supervisor.core.exit_codes import ExitCode
from trainwarden.supervisor.core.phases import Phase

NAME = "step_000020.bin"


def requeue(t: float, left: float = 50.0, scontrol: bool = True) -> p.RequeueRequested:
    return p.RequeueRequested(t, "SIGUSR1", t + left, scontrol)


def records(actions: list, kind: str) -> list[dict]:
    return [a.fields for a in kinds(actions, p.Record) if a.kind == kind]


def test_a_live_run_saves_then_the_job_is_requeued_and_the_daemon_exits_75():
    state, actions = run([requeue(2.0)], started())
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == ["SIGTERM"]
    assert records(actions, "slurm_requeue_requested") == [
        {"why": "SIGUSR1", "seconds_left": 50.0, "scontrol": True}
    ]
    assert not exits(actions)
    # The trainer saves on SIGTERM and exits; the daemon waits for the verification.
    state, actions = run([p.CheckpointSeen(3.0, NAME, 20), p.TrainerExited(3.5, 100, 0)], state)
    assert not exits(actions) and not kinds(actions, p.Requeue)
    state, actions = run([p.CheckpointCommitted(4.0, 20, NAME, 100)], state)
    order = [type(a) for a in actions if isinstance(a, p.Requeue | p.Exit)]
    assert order == [p.Requeue, p.Exit], actions
    assert exits(actions) == [ExitCode.REQUEUE] and kinds(actions, p.Requeue)[0].scontrol
    (outcome,) = records(actions, "stop_outcome")
    assert outcome["outcome"] == "saved" and outcome["checkpoint_step"] == 20


def test_with_scontrol_off_the_requeue_is_left_to_the_batch_script():
    state, _ = run([requeue(2.0, scontrol=False)], started())
    _, actions = run(
        [p.CheckpointCommitted(3.0, 20, NAME, 100), p.TrainerExited(3.5, 100, 0)], state
    )
    assert [a.scontrol for a in kinds(actions, p.Requeue)] == [False]
    assert exits(actions) == [ExitCode.REQUEUE]


def test_a_run_waiting_to_restart_is_requeued_at_once():
    state, _ = decide_all(
        [p.Startup(0.0), p.TrainerSpawned(0.0, 100), p.TrainerExited(1.0, 100, 1)],
        None,
        replace(RULES, backoff_initial_s=30.0),
    )
    assert state.phase == Phase.BACKOFF
    _, actions = run([requeue(2.0)], state)
    assert exits(actions) == [ExitCode.REQUEUE] and kinds(actions, p.Requeue)


def test_a_finished_run_is_not_requeued():
    _, actions = run([requeue(3.0)], finished())
    assert exits(actions) == [ExitCode.FINISHED] and not kinds(actions, p.Requeue)
    (note,) = records(actions, "slurm_not_requeued")
    assert note["phase"] == "finished"


def test_a_halted_run_is_not_requeued_and_exits_halted():
    gpu_fault = replace(
        finished(), phase=Phase.GPU_FAULT, halt_reason="XID 79: the GPU fell off the bus"
    )
    for halted in (diverged(), crash_looped(), gpu_fault):
        _, actions = run([requeue(20.0)], halted)
        assert exits(actions) == [ExitCode.HALTED] and not kinds(actions, p.Requeue)
        assert records(actions, "slurm_not_requeued")[0]["phase"] == str(halted.phase)


def test_a_run_the_operator_stopped_is_not_requeued():
    state, _ = run([operator("stop", 2.0), p.TrainerExited(3.0, 100, 0)], started())
    _, actions = run([requeue(4.0)], state)
    assert exits(actions) == [ExitCode.STOPPED] and not kinds(actions, p.Requeue)
    assert records(actions, "slurm_not_requeued")[0]["reason"] == "the operator stopped the run"


def test_scancels_sigterm_first_means_no_requeue():
    state, _ = run([p.ShutdownRequested(2.0)], started())
    state, actions = run([requeue(2.5)], state)
    assert records(actions, "slurm_not_requeued")[0]["reason"] == "already shutting down"
    _, actions = run([p.TrainerExited(3.0, 100, 0)], state)
    assert exits(actions) == [ExitCode.STOPPED] and not kinds(actions, p.Requeue)


def test_the_signal_and_the_end_time_both_asking_leave_once():
    state, _ = run([requeue(2.0)], started())
    _, actions = run([p.RequeueRequested(2.5, "end_time", 40.0)], state)
    assert actions == []


def test_a_save_that_outlasts_the_job_is_killed_at_its_deadline_and_requeued_anyway():
    # stop_timeout_s is 10 s; the job has 3 s left.
    state, _ = run([requeue(2.0, left=3.0)], started())
    assert state.kill_at == 5.0
    assert p.deadline(state, RULES) == 5.0
    state, actions = run([p.Tick(5.0)], state)
    assert [a.signal for a in kinds(actions, p.SignalTrainer)] == ["SIGKILL"]
    (late,) = records(actions, "slurm_save_late")
    assert late["gave_up"] == "the trainer's save" and late["last_step"] == 1
    _, actions = run([p.TrainerExited(5.1, 100, -9)], state)
    assert exits(actions) == [ExitCode.REQUEUE] and kinds(actions, p.Requeue)
    (outcome,) = records(actions, "stop_outcome")
    assert outcome["outcome"] == "killed" and outcome["exit"] == "killed at the job's deadline"


def test_a_verification_that_outlasts_the_job_is_given_up_and_the_job_requeued():
    state, _ = run([requeue(2.0, left=3.0)], started())
    state, actions = run([p.CheckpointSeen(2.5, NAME, 20), p.TrainerExited(3.0, 100, 0)], state)
    assert not exits(actions) and p.deadline(state, RULES) == 5.0
    _, actions = run([p.Tick(5.0)], state)
    assert records(actions, "verification_overdue")[0]["name"] == NAME
    assert records(actions, "slurm_save_late")[0]["gave_up"] == f"verification of {NAME}"
    assert exits(actions) == [ExitCode.REQUEUE] and kinds(actions, p.Requeue)


def test_a_trainer_that_diverges_while_leaving_is_not_restarted_and_the_job_requeued():
    # The NaN kills it, its suspect checkpoints are set aside, and the requeue stands: the
    # next segment resumes from what is left (it used to start the trainer again here).
    state, _ = run([p.CheckpointCommitted(1.5, 10, "step_000010.bin", 100)], started())
    state, _ = run([requeue(2.0)], state)
    state, actions = run([p.StepLogged(2.1, 20, float("nan"))], state)
    assert records(actions, "divergence")
    _, actions = run([p.TrainerExited(2.2, 100, -9)], state)
    assert not kinds(actions, p.Spawn)
    assert exits(actions) == [ExitCode.REQUEUE] and kinds(actions, p.Requeue)


def test_a_trainer_that_diverges_for_good_while_leaving_halts_and_is_not_requeued():
    # divergence_retries = 1: the second divergence in a row halts the run.
    state, _ = run([p.CheckpointCommitted(1.5, 10, "step_000010.bin", 100)], started())
    state, _ = run([p.StepLogged(2.0, 20, float("nan")), p.TrainerExited(2.1, 100, -9)], state)
    state, _ = run([p.TrainerSpawned(2.2, 101), p.StepLogged(2.5, 11, 3.0), requeue(3.0)], state)
    state, _ = run([p.StepLogged(3.1, 12, float("nan"))], state)
    state, actions = run([p.TrainerExited(3.2, 101, -9)], state)
    assert not kinds(actions, p.Spawn) and not kinds(actions, p.Requeue)
    assert state.phase == Phase.DIVERGED and exits(actions) == [ExitCode.HALTED]
    assert records(actions, "slurm_not_requeued")[0]["phase"] == "diverged"


def test_a_sigterm_then_a_nan_exits_instead_of_starting_the_trainer_again():
    state, _ = run([p.CheckpointCommitted(1.5, 10, "step_000010.bin", 100)], started())
    state, _ = run([p.ShutdownRequested(2.0), p.StepLogged(2.1, 20, float("nan"))], state)
    _, actions = run([p.TrainerExited(2.2, 100, -9)], state)
    assert not kinds(actions, p.Spawn) and exits(actions) == [ExitCode.STOPPED]


def test_the_operators_stop_then_a_nan_leaves_the_trainer_stopped():
    state, _ = run([p.CheckpointCommitted(1.5, 10, "step_000010.bin", 100)], started())
    state, _ = run([operator("stop", 2.0), p.StepLogged(2.1, 20, float("nan"))], state)
    state, actions = run([p.TrainerExited(2.2, 100, -9)], state)
    assert not kinds(actions, p.Spawn) and state.phase == Phase.STOPPED
    assert [r.request_id for r in kinds(actions, p.Reply)] == [9]


# ----------------------------------------------------------------- exit_when_ended

IN_JOB = replace(RULES, exit_when_ended=True)


def test_in_a_job_a_run_that_finishes_ends_the_daemon_with_0():
    state, _ = decide_all(
        [p.Startup(0.0), p.TrainerSpawned(0.0, 100), p.StepLogged(1.0, 1, 3.0)], None, IN_JOB
    )
    state, actions = decide_all([p.TrainerExited(2.0, 100, 0)], state, IN_JOB)
    assert state.phase == Phase.FINISHED and exits(actions) == [ExitCode.FINISHED]
    assert records(actions, "slurm_run_ended")[0]["code"] == 0


def test_in_a_job_a_run_that_crash_loops_ends_the_daemon_with_3():
    state, pid = p.State(), 100
    state, _ = decide_all([p.Startup(0.0), p.TrainerSpawned(0.0, pid)], state, IN_JOB)
    for t in range(1, 10):
        state, actions = decide_all([p.TrainerExited(float(t), pid, 1)], state, IN_JOB)
        if state.phase == Phase.CRASH_LOOP:
            assert exits(actions) == [ExitCode.HALTED]
            return
        pid += 1
        state, _ = decide_all([p.TrainerSpawned(float(t), pid)], state, IN_JOB)
    raise AssertionError("no crash loop")


def test_in_a_job_a_run_found_ended_at_the_start_waits_for_its_owner():
    persisted = p.persisted(finished())
    state, actions = decide_all(
        [p.Restored(0.0, persisted), p.Startup(0.1), p.Tick(1.0)], None, IN_JOB
    )
    assert state.phase == Phase.FINISHED and not exits(actions)


def test_outside_a_job_a_finished_run_keeps_the_daemon_up():
    state, actions = run([p.TrainerExited(2.0, 100, 0)], started())
    assert state.phase == Phase.FINISHED and not exits(actions)
