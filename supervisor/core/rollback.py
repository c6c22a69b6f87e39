"""The response to a loss spike (see core.spikes): kill, roll back, skip its data.

On a spike the trainer is SIGKILLed (its weights may be poisoned; a save would only keep
them). The restart resumes from the newest verified checkpoint at least rollback_steps
before the spike's first step (none that far back: the newest before it; none at all: from
scratch), and every checkpoint after that one is set aside (quarantined, cause "rollback"):
it is the abandoned timeline and must never be resumed. A trainer that supports skip_data
gets one more window to skip (core.spikes.skip_window) on this and every later start, one
that supports lr_scale its learning rate scaled once more; one that supports neither gets
a plain rollback, and the rollback record says so. After max_rollbacks within
rollback_horizon steps, the next spike halts the run in `diverged`.

Each rollback is watched: the loss staying below the threshold until spike_window steps
past the spike's last step makes it `cured`, a spike before then `recurred`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from trainwarden.supervisor.core import pivot
from trainwarden.supervisor.core.actions import Action, Quarantine, Record, SignalTrainer
from trainwarden.supervisor.core.events import StepLogged
from trainwarden.supervisor.core.phases import Phase
from trainwarden.supervisor.core.spikes import (
    Detector,
    Outlier,
    Spike,
    SpikeLog,
    SpikeRules,
    observe,
    skip_window,
    with_detector,
)
from trainwarden.supervisor.core.state import Ckpt, Rules, State, without_checkpoints
from trainwarden.supervisor.core.transitions import fail_waiters, spawn

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import ExitFacts, Rollback, SpikeDetection

MAX_STEP = 2**31 - 1
"""The largest step a window may reach (contract.MAX_STEP; core imports no contract)."""


def _with_spikes(state: State, log: SpikeLog) -> State:
    """replace(state, spikes=log), on every step line: a copy of the instance dict (see
    progress._stepped)."""
    new = object.__new__(State)
    new.__dict__.update(state.__dict__)
    new.__dict__["spikes"] = log
    return new


def on_step(state: State, ev: StepLogged, rules: Rules, actions: list[Action]) -> State:
    """One step line of a trainer not being stopped: detect, and act on a spike."""
    log = state.spikes
    detector, verdict = observe(log.detector, ev.step, ev.loss, ev.grad_norm, rules.spikes)
    log = with_detector(log, detector)
    if log.watch is not None and ev.step >= log.watch[1] and not _is_spike(verdict):
        first, _ = log.watch
        actions.append(
            Record(
                {"kind": "spike_outcome", "first_step": first, "outcome": "cured", "step": ev.step}
            )
        )
        log = replace(log, watch=None)
    if isinstance(verdict, Outlier):
        steps = verdict.step - verdict.first + 1
        actions.append(Record({"kind": "spike_outlier", **verdict.to_json(), "steps": steps}))
    state = _with_spikes(state, log)
    if isinstance(verdict, Spike) and _is_spike(verdict):
        return _spiked(state, verdict, rules, actions)
    return state


def caught_up(state: State, ev: StepLogged, rules: Rules) -> State:
    """A step line the previous daemon's trainer logged after that daemon died, read at
    start-up: the detector goes on from the newest baseline before it (no warmup: it is no
    new start), so a spike that began while no daemon ran is found, and the checkpoints it
    wrote meanwhile get their baselines (see at_commit)."""
    log = state.spikes
    if state.caught_up_spike is not None:
        return state
    det = log.detector
    if det.ema is None and det.last_step is None:
        base = log.baseline(ev.step)
        if base is not None:
            det = Detector(
                base.ema, base.n, base.grad_ema, seen=rules.spikes.warmup, last_step=base.step
            )
    det, verdict = observe(det, ev.step, ev.loss, ev.grad_norm, rules.spikes)
    state = _with_spikes(state, with_detector(log, det))
    if isinstance(verdict, Spike) and _is_spike(verdict):
        state = replace(state, caught_up_spike=verdict)
    return state


def spiked_unseen(state: State, spike: Spike, rules: Rules, actions: list[Action]) -> State:
    """At start-up, a spike found among the lines caught up (see caught_up): as for one seen
    live, less the kill (that trainer is gone): set aside what came after the rollback's
    checkpoint and start from it with the spike's data skipped, or halt in diverged."""
    phase = state.phase
    decided: list[Action] = []
    state = _spiked(replace(state, caught_up_spike=None), spike, rules, decided)
    for action in decided:
        if isinstance(action, SignalTrainer):
            continue
        if isinstance(action, Record) and action.entry["kind"] == "spike":
            action = Record({**action.entry, "caught_up": True})
        actions.append(action)
    log = state.spikes
    if log.halting is not None:
        actions.append(
            Record({"kind": "halt", "state": "diverged", "cause": "spike", "reason": log.halting})
        )
        return replace(
            state,
            phase=Phase.DIVERGED,
            stop_reason=None,
            halt_reason=log.halting,
            spikes=replace(log, halting=None),
        )
    first = log.rolling_back[0] if log.rolling_back else None
    return replace(state, phase=phase, stop_reason=None, rollback_from=first)


def _is_spike(verdict: Spike | None) -> bool:
    return verdict is not None and not isinstance(verdict, Outlier)


def rollback_target(checkpoints: tuple[Ckpt, ...], first: int, rules: SpikeRules) -> Ckpt | None:
    """The newest verified checkpoint at least rollback_steps before `first`; else the
    newest before it; else none (from scratch)."""
    before = [c for c in checkpoints if c.step < first]
    far = [c for c in before if c.step <= first - rules.rollback_steps]
    chosen = far or before
    return chosen[-1] if chosen else None


def _spiked(state: State, spike: Spike, rules: Rules, actions: list[Action]) -> State:
    sr = rules.spikes
    log = state.spikes
    actions.append(
        SignalTrainer(
            "SIGKILL",
            f"loss spike: above {spike.threshold:.4g} from step {spike.first} to {spike.step}"
            f" (peak {spike.peak:.4g})",
        )
    )
    if log.watch is not None:
        actions.append(
            Record(
                {
                    "kind": "spike_outcome",
                    "first_step": log.watch[0],
                    "outcome": "recurred",
                    "step": spike.first,
                },
            )
        )
    fields: SpikeDetection = {
        **spike.to_json(),
        "factor": sr.factor,
        "patience": sr.patience,
        "detected_after": spike.step - spike.first + 1,
    }
    recent = log.recent_rollbacks(spike.first, sr)
    state = fail_waiters(
        state, actions, "wrong_state", "the loss spiked and the trainer was killed"
    )
    state = pivot.abort(state, actions, f"the loss spiked at step {spike.first}")
    if len(recent) >= sr.max_rollbacks:
        actions.append(Record({"kind": "spike", **fields, "halts": True, "rollbacks": len(recent)}))
        reason = (
            f"the loss spiked again at step {spike.first} after {len(recent)}"
            f" rollback{'' if len(recent) == 1 else 's'} within {sr.horizon} steps"
            f" (max_rollbacks = {sr.max_rollbacks})"
        )
        log = replace(log, watch=None, halting=reason)
        return replace(state, phase=Phase.STOPPING, stop_reason="spike", kill_at=None, spikes=log)
    target = rollback_target(state.checkpoints, spike.first, sr)
    if target is None and (state.checkpoints or state.verified_high is not None):
        # Rolling back would start the run over from step 0 and set aside all it saved.
        actions.append(Record({"kind": "spike", **fields, "halts": True, "rollback_to": None}))
        reason = (
            f"the loss spiked at step {spike.first} and no verified checkpoint before it is"
            " left to roll back to (start it again to train on)"
        )
        log = replace(log, watch=None, halting=reason)
        return replace(state, phase=Phase.STOPPING, stop_reason="spike", kill_at=None, spikes=log)
    actions.append(Record({"kind": "spike", **fields}))
    resume_step = target.step if target is not None else 0
    abandoned = [c for c in state.checkpoints if c.step > resume_step]
    rolling = replace(state, spikes=replace(log, rolling_back=(spike.first, resume_step)))
    for c in abandoned:
        quarantine = set_aside(rolling, c.step, c.name)
        assert quarantine is not None
        actions.append(quarantine)
    window = (
        skip_window(log.windows, resume_step, spike.step, sr.skip_extra, MAX_STEP)
        if sr.skip_data
        else None
    )
    windows = (*log.windows, window) if window is not None else log.windows
    lr_scale = log.lr_scale * sr.lr_scale if sr.scales_lr else log.lr_scale
    record: Rollback = {
        "kind": "rollback",
        "spike_step": spike.first,
        "checkpoint": target.name if target is not None else None,
        "step": target.step if target is not None else None,
        "steps_before": spike.first - resume_step,
        "window": list(window) if window is not None else None,
        "skip_data": [list(w) for w in windows],
        "lr_scale": lr_scale,
        "supported": {"skip_data": sr.skip_data, "lr_scale": sr.scales_lr},
        "quarantined": [c.step for c in abandoned],
        "rollbacks": len(recent) + 1,
        "max_rollbacks": sr.max_rollbacks,
    }
    unsupported = _unsupported(sr)
    if unsupported:
        record["note"] = unsupported
    actions.append(Record(record))
    log = replace(
        log,
        windows=windows,
        lr_scale=lr_scale,
        rollbacks=(*log.rollbacks, spike.first),
        watch=(spike.first, spike.step + sr.window),
        baselines=tuple(b for b in log.baselines if b.step <= resume_step),
        rolling_back=(spike.first, resume_step),
    )
    state = without_checkpoints(state, {c.step for c in abandoned})
    return replace(
        state,
        phase=Phase.STOPPING,
        stop_reason="spike",
        kill_at=None,
        spikes=log,
    )


def _unsupported(sr: SpikeRules) -> str | None:
    """What the rollback record says when the trainer cannot do what the config asks."""
    notes = []
    if not sr.skip_data:
        notes.append("skip_data (a plain rollback: the same data again)")
    if not sr.scales_lr and sr.lr_scale != 1.0:
        notes.append(f"lr_scale (lr_scale = {sr.lr_scale:g} is not applied)")
    if not notes:
        return None
    return f"the trainer does not declare {' nor '.join(notes)} in [trainer] supports"


def after_kill(state: State, t: float, exit_fields: ExitFacts, actions: list[Action]) -> State:
    """The trainer killed for a spike has exited: restart from the rollback's checkpoint,
    or halt in diverged."""
    actions.append(Record({"kind": "trainer_killed", **exit_fields, "cause": "spike"}))
    log = state.spikes
    if log.halting is not None:
        actions.append(
            Record({"kind": "halt", "state": "diverged", "cause": "spike", "reason": log.halting})
        )
        return replace(
            state,
            phase=Phase.DIVERGED,
            stop_reason=None,
            halt_reason=log.halting,
            spikes=replace(log, halting=None),
        )
    first = log.rolling_back[0] if log.rolling_back else None
    return spawn(replace(state, rollback_from=first), t, actions, "spike")


def set_aside(state: State, ev_step: int, name: str) -> Quarantine | None:
    """The quarantine of a checkpoint committed while a rollback has not restarted the
    trainer yet, if it lies after the step rolled back to."""
    rolling = state.spikes.rolling_back
    if rolling is None or ev_step <= rolling[1]:
        return None
    first, resume_step = rolling
    return Quarantine(
        ev_step,
        name,
        f"written after step {resume_step}, the rollback before the loss spike at step {first}",
        cause="rollback",
        cause_step=first,
    )


def at_startup(state: State, actions: list[Action]) -> State:
    """A daemon that died between a rollback and its restart: what the killed trainer
    committed after the step rolled back to is set aside now."""
    late = [(c, set_aside(state, c.step, c.name)) for c in state.checkpoints]
    found = [(c, q) for c, q in late if q is not None]
    for _, quarantine in found:
        actions.append(quarantine)
    if not found:
        return state
    return without_checkpoints(state, {c.step for c, _ in found})


def at_commit(state: State, step: int) -> State:
    """A verified commit at `step`: it keeps the EMAs as of its step, for the starts that
    resume from it; baselines of checkpoints no longer kept are dropped."""
    log = state.spikes
    kept = {c.step for c in state.checkpoints}
    found = log.detector.baseline_at(step)
    baselines = [
        b for b in log.baselines if b.step in kept and not (found is not None and b.step == step)
    ]
    if found is not None and step in kept:
        baselines.append(found)
    baselines.sort(key=lambda b: b.step)
    if tuple(baselines) == log.baselines:
        return state
    return replace(state, spikes=replace(log, baselines=tuple(baselines)))
