"""The verification barrier and content digests, in the policy alone (see core.barrier)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.policy import decide_all
from tests.support.policy import of as kinds
from trainwarden.supervisor.core import policy as p

RULES = p.Rules(keep_last=2, backoff_initial_s=1.0, stop_timeout_s=10.0, verify_timeout_s=30.0)


def name(step: int) -> str:
    return f"step_{step:06d}.bin"


def seen(step: int, t: float) -> p.CheckpointSeen:
    return p.CheckpointSeen(t, name(step), step)


def commit(step: int, t: float, digest: str = "") -> p.CheckpointCommitted:
    return p.CheckpointCommitted(t, step, name(step), 100, 0.0, digest or f"d{step}")


def run(events: list[object], state: p.State | None = None, rules: p.Rules = RULES):
    return decide_all(events, state, rules)


def records(actions: list[object], kind: str) -> list[p.Record]:
    return [a for a in actions if isinstance(a, p.Record) and a.kind == kind]


def running(pid: int = 7) -> p.State:
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, pid), p.StepLogged(0.5, 1, 3.0)])
    return state


def test_a_restart_waits_for_the_checkpoint_still_being_verified():
    """The trainer saved 50 and crashed; 50 is still being verified when the backoff ends:
    the new trainer starts from 50 once it is verified, not from 30."""
    state = running()
    state, _ = run([seen(30, 1.0), commit(30, 1.5), seen(50, 2.0)], state)
    state, _ = run([p.TrainerExited(2.1, 7, 1), p.Tick(3.2)], state)
    assert state.spawn_due and state.phase == "starting"
    state, actions = run([commit(50, 4.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 50 and not state.spawn_due


def test_stop_names_the_checkpoint_the_trainer_wrote_on_its_way_out():
    state = running()
    state, _ = run([seen(33, 1.0), commit(33, 1.2)], state)
    state, _ = run([p.Operator(2.0, 1, p.Stop())], state)
    state, actions = run([seen(57, 2.5), p.TrainerExited(2.6, 7, 0)], state)
    assert not kinds(actions, p.Reply) and state.stop_due
    state, actions = run([commit(57, 4.0)], state)
    (reply,) = kinds(actions, p.Reply)
    assert reply.ok and reply.result is not None and reply.result["checkpoint"]["step"] == 57


def test_start_answers_with_the_checkpoint_it_really_resumes_from():
    state = running()
    state, _ = run([p.Operator(1.0, 1, p.Stop()), p.TrainerExited(1.5, 7, 0)], state)
    assert state.phase == "stopped"
    state, _ = run([seen(50, 1.8), seen(57, 1.9), commit(57, 2.5)], state)
    state, actions = run([p.Operator(3.0, 2, p.Start())], state)
    assert not kinds(actions, p.Spawn) and not kinds(actions, p.Reply)
    state, actions = run([commit(50, 4.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 57
    state, actions = run([p.TrainerSpawned(4.1, 8)], state)
    (reply,) = kinds(actions, p.Reply)
    assert reply.result == {"state": "starting", "resume_step": 57}


def test_save_wait_names_the_checkpoint_the_save_wrote_not_a_later_one():
    state = running()
    state, _ = run([p.StepLogged(1.0, 55, 3.0), p.Operator(1.1, 1, p.Save(wait=True))], state)
    # The save's checkpoint (57) and a periodic one (60) are committed; 60 verifies first.
    state, actions = run([seen(57, 1.5), seen(60, 1.6), commit(60, 2.0)], state)
    assert not kinds(actions, p.Reply)
    state, actions = run([commit(57, 3.0)], state)
    (reply,) = kinds(actions, p.Reply)
    assert reply.result is not None and reply.result["step"] == 57


def test_a_save_of_the_step_already_on_disk_is_answered_by_the_unchanged_commit():
    state = running()
    state, _ = run([seen(50, 1.0), commit(50, 1.2), p.StepLogged(1.3, 50, 3.0)], state)
    state, _ = run([p.Operator(1.4, 1, p.Save(wait=True))], state)
    state, actions = run([seen(50, 1.5), p.CheckpointUnchanged(1.7, name(50))], state)
    (reply,) = kinds(actions, p.Reply)
    assert reply.result is not None and reply.result["step"] == 50


def test_a_verification_that_never_ends_is_given_up_on_and_named_unverified():
    state = running()
    state, _ = run([seen(30, 1.0), commit(30, 1.2), seen(40, 2.0)], state)
    state, _ = run([p.Operator(2.5, 1, p.Stop()), p.TrainerExited(3.0, 7, 0)], state)
    assert p.deadline(state, RULES) == 2.0 + RULES.verify_timeout_s
    state, actions = run([p.Tick(2.0 + RULES.verify_timeout_s)], state)
    assert records(actions, "verification_overdue")
    (reply,) = kinds(actions, p.Reply)
    assert reply.result is not None
    assert reply.result["checkpoint"]["step"] == 30 and reply.result["unverified"] == [name(40)]


def test_a_changed_checkpoint_is_quarantined_never_newest_and_the_mirror_keeps_its_copy():
    state = running()
    state, _ = run([seen(30, 1.0), commit(30, 1.2), seen(40, 2.0), commit(40, 2.2)], state)
    state, actions = run(
        [seen(40, 3.0), p.CheckpointChanged(3.5, 40, name(40), "weights differ")], state
    )
    (q,) = kinds(actions, p.Quarantine)
    assert q.step == 40 and q.reason.startswith("content changed since commit")
    assert not q.retract_mirror
    assert state.newest is not None and state.newest.step == 30 and not state.pending


def test_a_resume_refused_by_its_digest_falls_back_to_the_next_older_checkpoint():
    state = running()
    state, _ = run([seen(30, 1.0), commit(30, 1.2), seen(40, 2.0), commit(40, 2.2)], state)
    state, actions = run([p.TrainerExited(3.0, 7, 1), p.Tick(4.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 40
    seg = spawn.seg
    state, actions = run([p.ResumeRefused(4.1, 40, name(40), "its files read otherwise")], state)
    (q,) = kinds(actions, p.Quarantine)
    (again,) = kinds(actions, p.Spawn)
    assert q.step == 40 and again.resume is not None and again.resume.step == 30
    assert again.seg == seg


def test_a_checkpoint_changed_while_no_daemon_ran_is_quarantined_at_start_up():
    persisted = p.persisted(
        p.State(
            checkpoints=(p.Ckpt(30, name(30), 1, 0.0, "aa"), p.Ckpt(40, name(40), 1, 0.0, "bb"))
        )
    )
    state, _ = run([p.Restored(0.0, persisted)])
    scanned = (
        p.Scanned(name(30), 30, p.Outcome.VERIFIED, bytes=1, digest="aa"),
        p.Scanned(name(40), 40, p.Outcome.VERIFIED, bytes=1, digest="cc"),
    )
    state, actions = run([p.Startup(1.0, last_logged_step=45, scanned=scanned)], state)
    (q,) = kinds(actions, p.Quarantine)
    (spawn,) = kinds(actions, p.Spawn)
    assert q.step == 40 and "while no daemon was running" in q.reason
    assert spawn.resume is not None and spawn.resume.step == 30


def test_a_far_future_file_planted_while_no_daemon_ran_is_quarantined_at_start_up():
    steps = (100, 200, 300, 99_999_999)
    scanned = tuple(p.Scanned(name(s), s, p.Outcome.VERIFIED, bytes=1, digest="x") for s in steps)
    state, actions = run([p.Startup(1.0, last_logged_step=310, scanned=scanned)])
    (q,) = kinds(actions, p.Quarantine)
    (spawn,) = kinds(actions, p.Spawn)
    assert q.step == 99_999_999 and "max_step_jump" in q.reason
    assert spawn.resume is not None and spawn.resume.step == 300
    assert [c.step for c in state.checkpoints] == [200, 300]  # keep_last=2


# ----------------------------------------------------------------------------- property


@st.composite
def schedules(draw: st.DrawFn) -> list[tuple]:
    """A trainer's commits (each verifiable or not, its verification ending after any
    delay), interleaved with crashes, stops, starts, saves and ticks."""
    steps = draw(st.lists(st.integers(1, 40), min_size=1, max_size=12, unique=True))
    steps.sort()
    good = {s: draw(st.booleans()) or s == steps[0] for s in steps}
    ops: list[tuple] = []
    for s in steps:
        ops.append(("seen", s))
    ends = list(steps)
    order = draw(st.permutations(ends))
    # Each verification ends somewhere after its own seen.
    placed: list[tuple] = []
    for op in ops:
        placed.append(op)
    for s in order:
        position = placed.index(("seen", s))
        at = draw(st.integers(position + 1, len(placed)))
        placed.insert(at, ("end", s, good[s]))
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(placed)))
        placed.insert(at, (draw(st.sampled_from(["crash", "stop", "start", "save", "tick"])),))
    return placed


@given(schedules(), st.integers(1, 3))
@settings(max_examples=300, deadline=None)
def test_no_decision_names_a_checkpoint_older_than_one_verifiable_before_its_trigger(
    schedule: list[tuple], keep_last: int
):
    # Verifications end in time here (the give-up is tested above).
    rules = replace(RULES, keep_last=keep_last, verify_timeout_s=1e9)
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 1)], rules=rules)
    pid, t = 1, 0.0
    good_seen: set[int] = set()  # verifiable checkpoints seen committed so far
    gone: set[int] = set()  # deleted or quarantined by the policy
    quarantined: set[int] = set()
    saves: dict[int, int] = {}  # request id -> checkpoints seen when it was asked
    rid = 0
    outcome: dict[int, bool] = {op[1]: op[2] for op in schedule if op[0] == "end"}
    for op in schedule:
        t += 1.0
        kind = op[0]
        if kind == "seen":
            event: object = seen(op[1], t)
            if outcome[op[1]]:
                good_seen.add(op[1])
        elif kind == "end":
            step = op[1]
            event = (
                commit(step, t)
                if op[2]
                else p.CheckpointRejected(t, step, name(step), "does not verify")
            )
        elif kind == "crash":
            event = p.TrainerExited(t, pid, 1)
        elif kind == "stop":
            rid += 1
            event = p.Operator(t, rid, p.Stop())
        elif kind == "start":
            rid += 1
            event = p.Operator(t, rid, p.Start())
        elif kind == "save":
            rid += 1
            saves[rid] = max(good_seen, default=0)
            event = p.Operator(t, rid, p.Save(wait=True))
        else:
            t += rules.backoff_max_s
            event = p.Tick(t)
        trigger_good = good_seen - gone
        state, actions = p.decide(state, event, rules)  # type: ignore[arg-type]
        for action in actions:
            if isinstance(action, p.Spawn):
                # Every verifiable checkpoint seen before the trigger is verified by now.
                newest = max(trigger_good - quarantined, default=None)
                assert (action.resume.step if action.resume else None) == newest
                assert action.resume is None or action.resume.step not in quarantined
            elif isinstance(action, p.Delete):
                verified = [c.step for c in state.checkpoints]
                assert verified and action.step < max(verified)
                gone.add(action.step)
            elif isinstance(action, p.Quarantine) and action.step is not None:
                quarantined.add(action.step)
                gone.add(action.step)
            elif isinstance(action, p.Reply) and action.ok and action.result:
                named = action.result.get("checkpoint")
                if named is not None:
                    assert named["step"] == max(trigger_good - quarantined, default=None)
        if any(isinstance(a, p.Spawn) for a in actions):
            pid += 1
            state, _ = p.decide(state, p.TrainerSpawned(t, pid), rules)
        assert not (set(c.step for c in state.checkpoints) & quarantined)


def test_decisions_wait_a_little_longer_than_the_format_s_own_verify_timeout(tmp_path):
    from trainwarden.supervisor.config import load_config
    from trainwarden.supervisor.shell.boot import DEFAULT_VERIFY_WAIT_S, verify_wait_s

    def config(options: str) -> object:
        (tmp_path / "trainwarden.toml").write_text(
            f'[trainer]\ncommand = ["python", "train.py"]\n[checkpoints]\noptions = {{{options}}}\n'
        )
        return load_config(tmp_path, check_plugins=False)

    assert verify_wait_s(config("verify_timeout_s = 20")) == 50.0  # type: ignore[arg-type]
    assert verify_wait_s(config("")) == DEFAULT_VERIFY_WAIT_S  # type: ignore[arg-type]


def test_nothing_starts_while_the_last_start_s_processes_are_stopped_and_their_commit_is_stray():
    """The main process died; its worker saves on the SIGTERM containment sends it. The next
    trainer starts after that, from the last checkpoint of the start itself: the worker's
    is stray, like its log lines (quarantined, never counted)."""
    rules = replace(RULES, backoff_initial_s=0.0)
    state, _ = run(
        [p.Startup(0.0), p.TrainerSpawned(0.0, 7), p.StepLogged(0.5, 1, 3.0)], rules=rules
    )
    state, _ = run([seen(500, 1.0), commit(500, 1.1)], state, rules)
    state, actions = run([p.TrainerExited(2.0, 7, -9, "SIGKILL", contained=False)], state, rules)
    assert not kinds(actions, p.Spawn) and state.spawn_due and state.containing
    state, actions = run([seen(550, 2.5), commit(550, 2.7)], state, rules)
    assert not kinds(actions, p.Spawn)
    (q,) = kinds(actions, p.Quarantine)
    assert q.step == 550 and "after its main process exited" in q.reason
    state, actions = run([p.StartContained(3.0)], state, rules)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 500 and not state.containing


def test_a_stop_is_answered_once_the_start_s_other_processes_are_gone():
    state = running()
    state, _ = run([seen(40, 1.0), commit(40, 1.1), p.Operator(2.0, 1, p.Stop())], state)
    state, actions = run([p.TrainerExited(3.0, 7, 0, contained=False)], state)
    assert not kinds(actions, p.Reply)
    state, actions = run([p.StartContained(4.0)], state)
    (reply,) = kinds(actions, p.Reply)
    assert reply.ok and reply.result is not None and reply.result["checkpoint"]["step"] == 40


# --------------------------------------------------------------- divergence rollback target


def diverged_with_pending(rules: p.Rules = RULES) -> tuple[p.State, list[object]]:
    """360 verified, 380 committed but still being verified, then a NaN at 400."""
    state = running()
    events = [seen(360, 1.0), commit(360, 1.1), p.StepLogged(1.5, 390, 3.0), seen(380, 2.0)]
    state, _ = run(events, state, rules)
    return run([p.StepLogged(2.1, 400, float("nan"))], state, rules)


def test_a_divergence_names_no_rollback_target_a_verification_in_flight_may_change():
    """380 (before the NaN at 400, so not poisoned, and outside the suspect window of a
    fresh start) is verified after the divergence: the restart resumes from it. The
    divergence record cannot know that yet: it names no target and says what it awaits;
    the start names the divergence it rolls back from."""
    state, actions = diverged_with_pending()
    (divergence,) = records(actions, "divergence")
    assert "rollback_to" not in divergence.fields
    assert divergence.fields["awaiting_verification"] == [name(380)]
    state, actions = run([p.TrainerExited(2.2, 7, -9, "SIGKILL")], state)
    assert not kinds(actions, p.Spawn) and state.spawn_due
    state, actions = run([commit(380, 3.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 380
    assert spawn.rollback_from == 400


def test_a_rejected_checkpoint_in_flight_leaves_the_older_one_as_the_rollback_target():
    state, _ = diverged_with_pending()
    state, _ = run([p.TrainerExited(2.2, 7, -9, "SIGKILL")], state)
    state, actions = run([p.CheckpointRejected(3.0, 380, name(380), "torn")], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 360
    assert spawn.rollback_from == 400


def test_a_divergence_with_nothing_in_flight_names_the_checkpoint_the_restart_resumes_from():
    state = running()
    state, _ = run([seen(360, 1.0), commit(360, 1.1), seen(380, 1.2), commit(380, 1.3)], state)
    state, actions = run([seen(400, 1.9), p.StepLogged(2.1, 400, float("nan"))], state)
    (divergence,) = records(actions, "divergence")
    # 400 is in flight, but at the divergence's step: poisoned whatever its verification says.
    assert divergence.fields["rollback_to"] == 380
    assert "awaiting_verification" not in divergence.fields
    state, actions = run([p.TrainerExited(2.2, 7, -9, "SIGKILL"), commit(400, 3.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 380 and spawn.rollback_from == 400
    state, actions = run([p.TrainerSpawned(3.1, 8), p.TrainerExited(4.0, 8, 1), p.Tick(9.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.rollback_from is None  # a crash after the rollback started is no rollback


def checkpoints_with_fates(
    fates: list[str], log_steps: bool
) -> tuple[p.State, list[tuple[int, bool]], float]:
    """A running trainer that commits checkpoints at 10, 20, ...: each verified or rejected
    at once, or still in flight ("pending"; it will pass if its index is even). Returns the
    state, the in-flight (step, will pass) and the next free time."""
    state = running()
    in_flight: list[tuple[int, bool]] = []
    t = 1.0
    for i, fate in enumerate(fates):
        step = 10 * (i + 1)
        logged = [p.StepLogged(t, step, 3.0)] if log_steps else []
        state, _ = run([*logged, seen(step, t)], state)
        if fate == "pending":
            in_flight.append((step, i % 2 == 0))
        elif fate == "verified":
            state, _ = run([commit(step, t + 0.1)], state)
        else:
            state, _ = run([p.CheckpointRejected(t + 0.1, step, name(step), "torn")], state)
        t += 1.0
    return state, in_flight, t


@given(
    st.lists(st.sampled_from(["verified", "rejected", "pending"]), min_size=0, max_size=5),
    st.permutations(range(5)),
)
@settings(max_examples=200, deadline=None)
def test_a_divergence_s_rollback_target_is_the_checkpoint_the_restart_resumes_from(
    fates: list[str], order: list[int]
):
    """Checkpoints at 10, 20, ... before a NaN at 100, each verified or rejected before the
    divergence or still in flight (then verified or rejected after it, in any order): a
    rollback target the divergence record names is the one the restart resumes from."""
    state, in_flight, t = checkpoints_with_fates(fates, log_steps=False)
    state, actions = run([p.StepLogged(t, 100, float("nan"))], state)
    (divergence,) = records(actions, "divergence")
    state, actions = run([p.TrainerExited(t + 0.1, 7, -9, "SIGKILL")], state)
    spawns = kinds(actions, p.Spawn)
    for k in [k for k in order if k < len(in_flight)]:
        step, good = in_flight[k]
        t += 1.0
        end = commit(step, t) if good else p.CheckpointRejected(t, step, name(step), "torn")
        state, actions = run([end], state)
        spawns += kinds(actions, p.Spawn)
    (spawn,) = spawns
    assert spawn.rollback_from == 100
    resumed = spawn.resume.step if spawn.resume is not None else None
    if in_flight:
        assert "rollback_to" not in divergence.fields
        assert divergence.fields["awaiting_verification"] == [name(s) for s, _ in in_flight]
    else:
        assert divergence.fields["rollback_to"] == resumed


def test_a_divergence_that_halts_the_run_names_no_rollback():
    """The same divergence again (divergence_retries = 1): no restart follows, so the record
    names no checkpoint to roll back to; it says the run halts, as it then does."""
    state = running()
    state, _ = run([seen(20, 1.0), commit(20, 1.1), p.StepLogged(1.5, 25, float("nan"))], state)
    state, actions = run([p.TrainerExited(1.6, 7, -9, "SIGKILL")], state)
    (spawn,) = kinds(actions, p.Spawn)
    state, _ = run([p.TrainerSpawned(1.7, 8)], state)
    state, actions = run([p.StepLogged(2.0, 25, float("nan"))], state)
    (divergence,) = records(actions, "divergence")
    assert divergence.fields["halts"] is True and "rollback_to" not in divergence.fields
    state, actions = run([p.TrainerExited(2.1, 8, -9, "SIGKILL")], state)
    assert state.phase == "diverged" and not kinds(actions, p.Spawn) and records(actions, "halt")


# --------------------------------------------------- the resume step a restart is said to take


def test_a_scheduled_restart_names_no_resume_step_a_verification_in_flight_may_change():
    """The trainer saved 50 and crashed while 50 was being verified: the restart resumes
    from 50 once it is verified, so the restart_scheduled record cannot name 30."""
    state = running()
    state, _ = run([seen(30, 1.0), commit(30, 1.5), seen(50, 2.0)], state)
    state, actions = run([p.TrainerExited(2.1, 7, 1)], state)
    (scheduled,) = records(actions, "restart_scheduled")
    assert "resume_step" not in scheduled.fields
    assert scheduled.fields["awaiting_verification"] == [name(50)]
    state, actions = run([p.Tick(3.2), commit(50, 4.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 50


def test_a_scheduled_restart_with_nothing_in_flight_names_the_step_it_resumes_from():
    state = running()
    state, _ = run([seen(30, 1.0), commit(30, 1.5), seen(50, 2.0), commit(50, 2.1)], state)
    state, actions = run([p.TrainerExited(2.2, 7, 1)], state)
    (scheduled,) = records(actions, "restart_scheduled")
    assert scheduled.fields["resume_step"] == 50 and "awaiting_verification" not in scheduled.fields
    state, actions = run([p.Tick(3.3)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 50


@given(
    st.lists(st.sampled_from(["verified", "rejected", "pending"]), min_size=0, max_size=5),
    st.permutations(range(5)),
)
@settings(max_examples=200, deadline=None)
def test_a_scheduled_restart_s_resume_step_is_the_checkpoint_the_restart_resumes_from(
    fates: list[str], order: list[int]
):
    """Checkpoints at 10, 20, ... each verified or rejected before a crash or still in
    flight (then verified or rejected after it, before or after the backoff ends, in any
    order): a resume step the restart_scheduled record names is the one resumed from."""
    state, in_flight, t = checkpoints_with_fates(fates, log_steps=True)
    state, actions = run([p.TrainerExited(t, 7, 1)], state)
    (scheduled,) = records(actions, "restart_scheduled")
    spawns = kinds(actions, p.Spawn)
    for i, k in enumerate([k for k in order if k < len(in_flight)]):
        step, good = in_flight[k]
        t += 1.0
        end = commit(step, t) if good else p.CheckpointRejected(t, step, name(step), "torn")
        events: list[object] = [end]
        if i == 1:
            events.insert(0, p.Tick(t))  # the backoff (1 s) ends among the verifications
        state, actions = run(events, state)
        spawns += kinds(actions, p.Spawn)
    state, actions = run([p.Tick(t + 10.0)], state)
    (spawn,) = spawns + kinds(actions, p.Spawn)
    resumed = spawn.resume.step if spawn.resume is not None else None
    if in_flight:
        assert "resume_step" not in scheduled.fields
        assert scheduled.fields["awaiting_verification"] == [name(s) for s, _ in in_flight]
    else:
        assert scheduled.fields["resume_step"] == resumed


def respawned(state: p.State, t: float, pid: int) -> p.State:
    state, _ = run([p.TrainerSpawned(t, pid)], state)
    return state


def test_a_divergence_fallback_names_no_resume_step_a_verification_in_flight_may_change():
    """Resumed from 300, the loss diverges at 302 twice: 300 is abandoned. 301, committed
    before the NaN and still being verified, is not poisoned: once verified the restart
    resumes from it, so the fallback record cannot name 200 (nor the divergence record)."""
    ckpts = tuple(p.Ckpt(s, name(s), 1) for s in (100, 200, 300))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 7)], p.State(checkpoints=ckpts))
    nan = float("nan")
    events = [p.StepLogged(1.0, 301, 3.0), p.StepLogged(1.1, 302, nan), p.TrainerExited(1.2, 7, -9)]
    state, actions = run(events, state)
    state = respawned(state, 1.3, 8)
    events = [p.StepLogged(2.0, 301, 3.0), seen(301, 2.05), p.StepLogged(2.1, 302, nan)]
    state, actions = run(events, state)
    (fallback,) = records(actions, "fallback")
    assert fallback.fields["abandoned"] == 300
    assert "resume_step" not in fallback.fields
    assert fallback.fields["awaiting_verification"] == [name(301)]
    (divergence,) = records(actions, "divergence")
    assert divergence.fields["awaiting_verification"] == [name(301)]
    state, actions = run([p.TrainerExited(2.2, 8, -9), commit(301, 3.0)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 301


def test_a_divergence_fallback_with_nothing_in_flight_names_the_step_it_resumes_from():
    ckpts = tuple(p.Ckpt(s, name(s), 1) for s in (100, 200, 300))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 7)], p.State(checkpoints=ckpts))
    nan = float("nan")
    for pid, t in ((7, 1.0), (8, 2.0)):
        events = [p.StepLogged(t, 301, 3.0), p.StepLogged(t + 0.1, 302, nan)]
        state, actions = run([*events, p.TrainerExited(t + 0.2, pid, -9)], state)
        state = respawned(state, t + 0.3, pid + 1)
    (fallback,) = records(actions, "fallback")
    assert fallback.fields["resume_step"] == 200
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 200


def test_a_fallback_the_run_halts_after_names_no_resume_step():
    """The trainer dies twice resuming from 200 before a step: 200 is abandoned, and with
    max_restarts_without_progress = 1 the run halts in crash_loop instead of restarting
    from 100. The fallback record says it halts, as the run then does."""
    rules = replace(RULES, max_restarts_without_progress=1)
    ckpts = tuple(p.Ckpt(s, name(s), 1) for s in (100, 200))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 7)], p.State(checkpoints=ckpts), rules)
    state, _ = run(
        [p.TrainerExited(1.0, 7, 1, read_resume=True), p.Tick(2.5), p.TrainerSpawned(2.6, 8)],
        state,
        rules,
    )
    assert state.resume_step == 200
    state, actions = run([p.TrainerExited(3.0, 8, 1, read_resume=True)], state, rules)
    (fallback,) = records(actions, "fallback")
    assert fallback.fields["abandoned"] == 200
    assert fallback.fields["halts"] is True and "resume_step" not in fallback.fields
    assert state.phase == "crash_loop" and records(actions, "halt")
    assert not kinds(actions, p.Spawn) and not records(actions, "restart_scheduled")


def test_start_answers_with_the_checkpoint_resumed_from_after_a_refused_one():
    """57's files no longer read as they did at its commit: the start refuses it and resumes
    from 50. The reply comes once the trainer has started and names 50, not 57."""
    state = running()
    state, _ = run([seen(50, 1.0), commit(50, 1.1), seen(57, 1.2), commit(57, 1.3)], state)
    state, _ = run([p.Operator(2.0, 1, p.Stop()), p.TrainerExited(2.5, 7, 0)], state)
    state, actions = run([p.Operator(3.0, 2, p.Start())], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 57 and not kinds(actions, p.Reply)
    state, actions = run([p.ResumeRefused(3.1, 57, name(57), "content changed")], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 50 and not kinds(actions, p.Reply)
    state, actions = run([p.TrainerSpawned(3.2, 8)], state)
    (reply,) = kinds(actions, p.Reply)
    assert reply.ok and reply.result == {"state": "starting", "resume_step": 50}


def test_start_that_cannot_spawn_the_trainer_says_so():
    state = running()
    state, _ = run([seen(50, 1.0), commit(50, 1.1)], state)
    state, _ = run([p.Operator(2.0, 1, p.Stop()), p.TrainerExited(2.5, 7, 0)], state)
    state, actions = run([p.Operator(3.0, 2, p.Start()), p.SpawnFailed(3.1, "no such file")], state)
    (reply,) = kinds(actions, p.Reply)
    assert not reply.ok and "no such file" in reply.message
