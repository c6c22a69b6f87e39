"""Loss spikes in the pure policy: the detector (core.spikes), the response (core.rollback)
and the skip windows they accumulate. No processes, no files, time as a number."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.policy import decide_all
from tests.support.policy import of as kinds
from trainwarden.supervisor.contract import MAX_STEP, data_step
from trainwarden.supervisor.core import policy as p
from trainwarden.supervisor.shell.telemetry import grad_norm_of

SPIKES = p.SpikeRules(
    factor=2.0,
    window=10,
    patience=3,
    warmup=5,
    rollback_steps=20,
    skip_extra=15,
    lr_scale=0.5,
    max_rollbacks=2,
    horizon=1000,
    skip_data=True,
    scales_lr=True,
)
RULES = p.Rules(keep_last=10, backoff_initial_s=0.0, spikes=SPIKES)


def run(events: list[object], state: p.State | None = None, rules: p.Rules = RULES):
    return decide_all(events, state, rules)


def records(actions: list[object], kind: str) -> list[dict]:
    return [a.fields for a in actions if isinstance(a, p.Record) and a.kind == kind]


def steps(first: int, last: int, loss: float = 1.0, every: int = 10) -> list[object]:
    """Step lines first..last at `loss`, a commit after every `every`-th."""
    events: list[object] = []
    for s in range(first, last + 1):
        events.append(p.StepLogged(float(s), s, loss))
        if s % every == 0:
            events.append(p.CheckpointCommitted(float(s), s, f"step_{s:06d}.bin", 100))
    return events


def healthy_run(last: int = 60, rules: p.Rules = RULES) -> tuple[p.State, list]:
    return run([p.Startup(0.0), p.TrainerSpawned(0.0, 100), *steps(1, last)], rules=rules)


def detect(losses: list[float], rules: p.SpikeRules = SPIKES) -> list[tuple[int, p.Spike]]:
    det = p.Detector()
    found = []
    for i, loss in enumerate(losses, start=1):
        det, verdict = p.observe(det, i, loss, None, rules)
        if verdict is not None:
            found.append((i, verdict))
    return found


# ------------------------------------------------------------------ the detector


def test_a_spike_is_detected_at_the_patience_th_step_above_the_threshold():
    found = detect([1.0] * 20 + [3.0] * 6)
    ((at, spike),) = found
    assert not isinstance(spike, p.Outlier)
    assert (spike.first, spike.step, at) == (21, 23, 23)
    assert spike.ema == 1.0 and spike.threshold == 2.0 and spike.peak == 3.0


def test_a_short_outlier_is_noted_once_and_not_a_spike():
    found = detect([1.0] * 20 + [9.0, 9.5] + [1.0] * 10)
    ((at, outlier),) = found
    assert isinstance(outlier, p.Outlier)
    assert (outlier.first, outlier.step, outlier.peak, at) == (21, 22, 9.5, 23)


def test_steps_above_the_threshold_do_not_raise_the_ema():
    det = p.Detector()
    for i in range(1, 21):
        det, _ = p.observe(det, i, 1.0, None, SPIKES)
    det, _ = p.observe(det, 21, 9.0, None, SPIKES)
    assert det.ema == 1.0 and det.above == 1


def test_no_spike_is_detected_in_the_warmup_of_a_start():
    assert detect([1.0, 5.0, 5.0, 5.0, 5.0]) == []


def test_a_grad_norm_spike_counts_only_when_grad_norm_factor_is_set():
    rules = replace(SPIKES, grad_norm_factor=3.0)
    for with_factor, expected in ((rules, 1), (SPIKES, 0)):
        det, found = p.Detector(), 0
        for i in range(1, 30):
            det, verdict = p.observe(det, i, 1.0, 10.0 if i > 20 else 1.0, with_factor)
            found += verdict is not None and not isinstance(verdict, p.Outlier)
        assert found == expected


def test_the_grad_norm_comes_from_the_step_line_extras():
    assert grad_norm_of({"grad_norm": 2.5}) == 2.5 and grad_norm_of({"norm": 1}) == 1.0
    assert grad_norm_of({"grad_norm": float("nan")}) is None and grad_norm_of({}) is None
    assert grad_norm_of({"grad_norm": True}) is None


@settings(max_examples=200, deadline=None)
@given(
    base=st.lists(st.floats(1.0, 2.0), min_size=8, max_size=60),
    scale=st.sampled_from([0.25, 1.0, 8.0]),
)
def test_bounded_noise_never_spikes_and_verdicts_do_not_depend_on_units(base, scale):
    """Every loss within factor x the smallest one: never above factor x the EMA (a mean
    of earlier losses). Scaling every loss by a power of two changes no verdict."""
    assert detect(base) == []
    spiky = [*base, 9.0, 9.0, 1.0, 9.0, 9.0, 9.0, 9.0]
    scaled = detect([x * scale for x in spiky])
    assert [(at, type(v), v.first, v.step) for at, v in detect(spiky)] == [
        (at, type(v), v.first, v.step) for at, v in scaled
    ]


@settings(max_examples=200, deadline=None)
@given(
    before=st.lists(st.floats(1.0, 2.0), min_size=6, max_size=50),
    length=st.integers(1, 8),
    height=st.floats(4.5, 1e6),
)
def test_a_block_above_twice_every_earlier_loss_is_a_spike_iff_it_lasts_patience_steps(
    before, length, height
):
    found = detect([*before, *([height] * length), 1.0])
    start = len(before) + 1
    if length >= SPIKES.patience:
        ((at, spike),) = found
        assert not isinstance(spike, p.Outlier)
        assert spike.first == start and at == spike.step == start + SPIKES.patience - 1
    else:
        ((at, outlier),) = found
        assert isinstance(outlier, p.Outlier) and at == start + length
        assert outlier.step - outlier.first + 1 == length


# ------------------------------------------------------------------ the response


def test_a_spike_kills_rolls_back_past_rollback_steps_and_skips_its_data():
    state, _ = healthy_run()
    state, actions = run(steps(61, 63, loss=5.0), state)
    (kill,) = kinds(actions, p.SignalTrainer)
    assert kill.signal == "SIGKILL" and state.stop_reason == "spike"
    (spike,) = records(actions, "spike")
    assert (spike["first_step"], spike["step"], spike["ema"], spike["threshold"]) == (
        61,
        63,
        1.0,
        2.0,
    )
    (rollback,) = records(actions, "rollback")
    # The newest checkpoint at least 20 steps before step 61 is 40; 50 and 60 are set aside.
    assert rollback["step"] == 40 and rollback["quarantined"] == [50, 60]
    assert rollback["window"] == [41, 63 + 1 + 15] and rollback["lr_scale"] == 0.5
    set_aside = kinds(actions, p.Quarantine)
    assert [(q.step, q.cause, q.cause_step) for q in set_aside] == [
        (50, "rollback", 61),
        (60, "rollback", 61),
    ]
    assert [c.step for c in state.checkpoints][-1] == 40
    # A late commit of the killed trainer belongs to the abandoned timeline too.
    state, actions = run([p.CheckpointCommitted(64.0, 64, "step_000064.bin", 100)], state)
    (late,) = kinds(actions, p.Quarantine)
    assert late.cause == "rollback" and state.newest is not None and state.newest.step == 40
    state, actions = run([p.TrainerExited(65.0, 100, -9, "SIGKILL")], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 40
    assert spawn.skip_data == ((41, 79),) and spawn.lr_scale == 0.5
    assert spawn.rollback_from == 61
    # Its replayed steps see other data from step 41 on: the resume audit leaves them out.
    assert spawn.timeline == (spawn.seg, 41)


def test_a_spike_with_no_checkpoint_before_it_halts_rather_than_start_over():
    """Checkpoints were verified (the run has history) but none is before the spike: a
    rollback would go to step 0 and set all of them aside. The run halts in diverged."""
    rules = replace(RULES, keep_last=1, spikes=replace(SPIKES, enabled=True))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100), *steps(1, 10)], rules=rules)
    state = replace(state, checkpoints=(), verified_high=10)  # e.g. quarantined by hand
    state, actions = run(steps(11, 13, loss=5.0), state, rules)
    (spike,) = records(actions, "spike")
    assert spike["halts"] is True and spike["rollback_to"] is None
    assert not records(actions, "rollback") and not kinds(actions, p.Quarantine)
    state, actions = run([p.TrainerExited(14.0, 100, -9)], state, rules)
    assert state.phase == "diverged" and "no verified checkpoint before it" in state.halt_reason
    assert not kinds(actions, p.Spawn)


def test_with_keep_last_1_retention_keeps_a_checkpoint_rollback_steps_back_for_a_spike():
    """keep_last=1 alone would leave only the newest checkpoint, after the spike's first
    step: retention keeps the newest one at least rollback_steps (20) before the newest,
    and the oldest after it, so the spike rolls back to a real checkpoint."""
    rules = replace(RULES, keep_last=1)
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100)], rules=rules)
    kept_at = {}
    for last in range(10, 201, 10):
        state, _ = run(steps(last - 9, last), state, rules)
        kept_at[last] = [c.step for c in state.checkpoints]
    # The oldest waits until it is 20 back; then the anchor moves up with the newest.
    assert kept_at[20] == [10, 20] and kept_at[30] == [10, 20, 30]
    assert kept_at[40] == [20, 30, 40] and kept_at[200] == [180, 190, 200]
    for last, kept in kept_at.items():
        # Never more than keep_last + 2; one at least 20 back once there was one to keep.
        assert len(kept) <= 3 and (last < 30 or min(kept) <= last - 20), (last, kept)
        assert last - min(kept) <= 2 * 20 + 10, (last, kept)
    state, actions = run(steps(201, 203, loss=5.0), state, rules)
    (rollback,) = records(actions, "rollback")
    assert rollback["step"] <= 201 - 20 and rollback["step"] in kept_at[200]
    state, actions = run([p.TrainerExited(204.0, 100, -9, "SIGKILL")], state, rules)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == rollback["step"]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 400), min_size=1, max_size=40, unique=True).map(sorted),
    st.integers(1, 4),
    st.integers(1, 60),
)
def test_retention_never_drops_the_last_checkpoint_rollback_steps_back(saves, keep_last, back):
    """Whatever the save steps: once a checkpoint at least rollback_steps before the newest
    was verified, one stays; never more than keep_last + 2 are kept."""
    rules = replace(RULES, keep_last=keep_last, spikes=replace(SPIKES, rollback_steps=back))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100)], rules=rules)
    for step in saves:
        before = [c.step for c in state.checkpoints]
        state, _ = run(steps(step, step, every=step), state, rules)
        kept = [c.step for c in state.checkpoints]
        reach = step - back
        if any(s <= reach for s in before):
            assert any(s <= reach for s in kept), (before, step, kept)
        assert len(kept) <= keep_last + 2, kept


def test_a_pinned_step_with_no_checkpoint_is_no_rollback_target():
    """`[checkpoints] pinned` may name a step never saved: it must not stand in for the
    checkpoint retention keeps rollback_steps back."""
    rules = replace(RULES, keep_last=1)
    state = replace(p.State(), pinned=frozenset({5}))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100), *steps(1, 100)], state, rules)
    kept = [c.step for c in state.checkpoints]
    assert min(kept) <= 100 - 20, kept


def test_with_spikes_off_retention_keeps_keep_last_only():
    rules = replace(RULES, keep_last=1, spikes=replace(SPIKES, enabled=False))
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100), *steps(1, 100)], rules=rules)
    assert [c.step for c in state.checkpoints] == [100]


def test_every_later_start_passes_the_same_windows_and_scale():
    state, _ = healthy_run()
    state, _ = run([*steps(61, 63, loss=5.0), p.TrainerExited(65.0, 100, -9)], state)
    state, _ = run([p.TrainerSpawned(66.0, 101), *steps(41, 50)], state)
    state, actions = run([p.TrainerExited(70.0, 101, 1)], state)  # a crash
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 50
    assert spawn.skip_data == ((41, 79),) and spawn.lr_scale == 0.5
    # The same timeline as the rollback's start (the one before this): its losses compare.
    assert spawn.timeline == (spawn.seg - 1, 41)


def test_without_skip_data_support_a_plain_rollback_and_the_record_says_so():
    rules = replace(RULES, spikes=replace(SPIKES, skip_data=False, scales_lr=False))
    state, _ = healthy_run(rules=rules)
    state, actions = run(steps(61, 63, loss=5.0), state, rules)
    (rollback,) = records(actions, "rollback")
    assert rollback["window"] is None and rollback["skip_data"] == []
    assert rollback["supported"] == {"skip_data": False, "lr_scale": False}
    assert "does not declare skip_data" in rollback["note"]
    assert "lr_scale" in rollback["note"]
    state, actions = run([p.TrainerExited(65.0, 100, -9)], state, rules)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.skip_data == () and spawn.lr_scale == 1.0


def test_a_spike_that_recurs_after_each_rollback_halts_in_diverged_after_max_rollbacks():
    state, _ = healthy_run()
    pid = 100
    outcomes = []
    for attempt in range(SPIKES.max_rollbacks + 1):
        state, actions = run(steps(61, 63, loss=5.0), state)
        outcomes += records(actions, "spike_outcome")
        assert state.stop_reason == "spike"
        state, actions = run([p.TrainerExited(65.0, pid, -9)], state)
        if attempt < SPIKES.max_rollbacks:
            assert kinds(actions, p.Spawn) and state.phase == "starting"
            pid += 1
            state, _ = run([p.TrainerSpawned(66.0, pid), *steps(41, 60)], state)
    assert state.phase == "diverged"
    (halt,) = records(actions, "halt")
    assert halt["cause"] == "spike" and "2 rollbacks" in state.halt_reason
    assert [o["outcome"] for o in outcomes] == ["recurred", "recurred"]


def test_a_rollback_is_cured_once_the_loss_stays_below_for_spike_window_steps():
    state, _ = healthy_run()
    state, _ = run([*steps(61, 63, loss=5.0), p.TrainerExited(65.0, 100, -9)], state)
    state, actions = run([p.TrainerSpawned(66.0, 101), *steps(41, 63 + SPIKES.window)], state)
    (outcome,) = records(actions, "spike_outcome")
    assert outcome == {"first_step": 61, "outcome": "cured", "step": 73}
    assert state.spikes.watch is None


def test_replayed_steps_are_not_counted_twice():
    """The restarted trainer's detector starts from the EMA as of its checkpoint's step,
    not the one that had already seen the abandoned steps."""
    state, _ = run([p.Startup(0.0), p.TrainerSpawned(0.0, 100), *steps(1, 40, loss=1.0)])
    state, _ = run(steps(41, 45, loss=1.9), state)  # below 2 x EMA: fed into the EMA
    state, _ = run([p.TrainerExited(50.0, 100, 1), p.TrainerSpawned(51.0, 101)], state)
    assert state.resume_step == 40 and state.spikes.detector.ema == 1.0
    state, _ = run(steps(41, 45, loss=1.9), state)
    assert state.spikes.detector.n == state.spikes.baseline(40).n + 5


def test_the_spike_log_survives_a_daemon_restart():
    state, _ = healthy_run()
    state, _ = run([*steps(61, 63, loss=5.0), p.TrainerExited(65.0, 100, -9)], state)
    state, _ = run([p.TrainerSpawned(66.0, 101), *steps(41, 50)], state)
    saved = p.persisted(state)
    fresh, actions = run([p.Restored(0.0, saved), p.Startup(0.0, scanned=_scanned(state))])
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.skip_data == ((41, 79),) and spawn.lr_scale == 0.5
    assert fresh.spikes.rollbacks == (61,) and fresh.spikes.watch == (61, 73)
    # The detector begins from the EMA as of step 50, as the old daemon's would have.
    assert fresh.spikes.detector.ema == state.spikes.baseline(50).ema


def _scanned(state: p.State) -> tuple[p.Scanned, ...]:
    return tuple(
        p.Scanned(c.name, c.step, p.Outcome.VERIFIED, bytes=c.bytes) for c in state.checkpoints
    )


def test_a_single_outlier_is_journaled_and_not_acted_on():
    state, _ = healthy_run()
    state, actions = run([p.StepLogged(61.0, 61, 50.0e-1), *steps(62, 64)], state)
    assert not kinds(actions, p.SignalTrainer) and state.stop_reason is None
    (outlier,) = records(actions, "spike_outlier")
    assert outlier["first_step"] == 61 and outlier["steps"] == 1


def test_a_non_finite_loss_keeps_its_immediate_kill():
    state, _ = healthy_run()
    state, actions = run([p.StepLogged(61.0, 61, float("nan"))], state)
    assert state.stop_reason == "divergence" and records(actions, "divergence")
    assert not records(actions, "spike")


# ------------------------------------------------------------------ windows


@settings(max_examples=300, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.integers(1, 400), st.integers(0, 4), st.integers(0, 60)),
        min_size=1,
        max_size=8,
    ),
    every=st.integers(5, 60),
    rollback_steps=st.integers(1, 150),
    extra=st.integers(0, 300),
)
def test_windows_skip_every_spike_and_any_checkpoint_resumes_to_the_same_data(
    plan, every, rollback_steps, extra
):
    """Simulate a run that spikes and rolls back again and again (each plan item: run that
    many steps, the spike's first step that many steps back, checkpoints every `every`
    steps kept for good). Then in the surviving timeline: every step consumed the data
    data_step(step, final windows) gives (so resuming any checkpoint with the final list
    reproduces it), no data twice, and none of any spike's data."""
    rules = replace(SPIKES, rollback_steps=rollback_steps, skip_extra=extra)
    windows: tuple[tuple[int, int], ...] = ()
    consumed: dict[int, int] = {}
    ckpts: list[p.Ckpt] = []
    bad: list[tuple[int, int]] = []
    step = 0
    for advance, back, _ in plan:
        for s in range(step + 1, step + advance + 1):
            consumed[s] = data_step(s, windows)
            if s % every == 0:
                ckpts.append(p.Ckpt(s, f"step_{s:06d}.bin", 1))
        step += advance
        first = max(step - back, 1)
        bad.append((data_step(first, windows), data_step(step, windows)))
        target = p.rollback_target(tuple(ckpts), first, rules)
        resume = target.step if target is not None else 0
        windows = (*windows, p.skip_window(windows, resume, step, extra, MAX_STEP))
        ckpts = [c for c in ckpts if c.step <= resume]
        consumed = {s: d for s, d in consumed.items() if s <= resume}
        step = resume
    for s in range(step + 1, step + 50):
        consumed[s] = data_step(s, windows)
    data = [consumed[s] for s in sorted(consumed)]
    assert all(consumed[s] == data_step(s, windows) for s in consumed)
    assert all(a < b for a, b in zip(data, data[1:], strict=False))
    assert not [d for d in data for lo, hi in bad if lo <= d <= hi]
    assert all(a < b for a, b in windows)


def test_a_daemon_that_died_before_the_rollback_restarted_sets_aside_late_commits():
    """The killed trainer committed step 64 while no daemon watched: the next daemon finds
    it, and sets it aside instead of resuming the abandoned timeline from it."""
    state, _ = healthy_run()
    state, _ = run(steps(61, 63, loss=5.0), state)
    saved = p.persisted(state)
    scanned = (*_scanned(state), p.Scanned("step_000064.bin", 64, p.Outcome.VERIFIED, bytes=1))
    fresh, actions = run([p.Restored(0.0, saved), p.Startup(0.0, scanned=scanned)])
    (late,) = kinds(actions, p.Quarantine)
    assert (late.step, late.cause, late.cause_step) == (64, "rollback", 61)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 40
    assert spawn.skip_data == ((41, 79),) and spawn.rollback_from == 61


def test_a_shutdown_during_a_spike_s_kill_leaves_the_rollback_to_the_next_daemon():
    """SIGTERM while the spiking trainer is being killed: the daemon exits once it is gone
    (no restart of its own), and the next daemon's first start is the rollback, named."""
    state, _ = healthy_run()
    state, _ = run(steps(61, 63, loss=5.0), state)
    state, actions = run(
        [p.ShutdownRequested(64.0, "SIGTERM"), p.TrainerExited(65.0, 100, -9, "SIGKILL")], state
    )
    assert not kinds(actions, p.Spawn) and kinds(actions, p.Exit)
    fresh, actions = run(
        [p.Restored(0.0, p.persisted(state)), p.Startup(0.0, scanned=_scanned(state))]
    )
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 40
    assert spawn.skip_data == ((41, 79),) and spawn.lr_scale == 0.5
    assert spawn.rollback_from == 61


def test_a_stop_during_a_spike_s_kill_stands_and_the_next_start_is_the_rollback():
    state, _ = healthy_run()
    state, _ = run(steps(61, 63, loss=5.0), state)
    state, actions = run(
        [p.Operator(64.0, 7, p.Stop(), None), p.TrainerExited(65.0, 100, -9, "SIGKILL")], state
    )
    assert not kinds(actions, p.Spawn) and state.phase == p.Phase.STOPPED
    (reply,) = kinds(actions, p.Reply)
    assert reply.ok and reply.request_id == 7
    state, actions = run([p.Operator(66.0, 8, p.Start(), None)], state)
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 40
    assert spawn.skip_data == ((41, 79),) and spawn.rollback_from == 61


def test_steps_above_the_threshold_in_the_warmup_do_not_raise_the_ema():
    """A restart straight into bad data: its warmup must not teach the EMA the bad loss,
    or the spike that follows would go unseen."""
    det = p.Detector.starting_from(p.Baseline(40, 1.0, 40))
    found = []
    for step in range(41, 41 + SPIKES.warmup + SPIKES.patience):
        det, verdict = p.observe(det, step, 5.0, None, SPIKES)
        found.append(verdict)
    assert det.ema == 1.0
    assert isinstance(found[-1], p.Spike) and found[-1].first == 41 + SPIKES.warmup


def test_a_checkpoint_no_daemon_saw_the_steps_of_resumes_with_the_newest_earlier_ema():
    """Committed while the daemon was down (inside bad data, say): the start resumed from it
    begins from the EMA as of the newest earlier step known, not from its own first loss."""
    state, _ = healthy_run(last=40)
    saved = p.persisted(state)
    scanned = (*_scanned(state), p.Scanned("step_000090.bin", 90, p.Outcome.VERIFIED, bytes=1))
    fresh, actions = run([p.Restored(0.0, saved), p.Startup(0.0, scanned=scanned)])
    (spawn,) = kinds(actions, p.Spawn)
    assert spawn.resume is not None and spawn.resume.step == 90
    assert fresh.spikes.detector.ema == state.spikes.baseline(40).ema
    events = [p.TrainerSpawned(1.0, 200), *steps(91, 91 + SPIKES.warmup + SPIKES.patience, 5.0)]
    fresh, actions = run(events, fresh)
    assert records(actions, "spike")
