"""Every decision the daemon makes, as a pure function: decide(state, event) -> (state, actions).

No clocks, files, processes or signals in here: time arrives as `event.t`, the outside
world arrives as events, and what should happen leaves as actions for the executor.
That is what lets the retention and restart rules be checked by property tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Phase = Literal[
    "starting",
    "running",
    "saving",
    "stopping",
    "stopped",
    "finished",
    "backoff",
    "crash_loop",
    "diverged",
    "pivoting",
]
HALTED: frozenset[str] = frozenset({"stopped", "finished", "crash_loop", "diverged"})
TRAINER_UP: frozenset[str] = frozenset({"starting", "running", "saving", "stopping", "pivoting"})
StopReason = Literal["operator", "shutdown", "stall", "divergence", "pivot"]


# ----------------------------------------------------------------------------- config/state


@dataclass(frozen=True)
class Rules:
    """The numbers the policy works with (from the run's config)."""

    keep_last: int = 3
    backoff_initial_s: float = 5.0
    backoff_max_s: float = 300.0
    max_restarts_without_progress: int = 5
    stall_timeout_s: float = 600.0
    stop_timeout_s: float = 120.0
    max_loss: float = 20.0
    divergence_retries: int = 1
    fallback_after_failures: int = 2
    save_wait_timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Ckpt:
    """A committed, verified checkpoint."""

    step: int
    name: str
    bytes: int
    mtime: float = 0.0


@dataclass(frozen=True, slots=True)
class Waiter:
    """An operator request answered later (save --wait, stop, shutdown)."""

    request_id: int
    kind: Literal["save", "stop"]
    step: int
    """For save: the checkpoint must be at this step or later."""
    deadline: float


@dataclass(frozen=True)
class PivotPlan:
    """A pivot's progress; persisted so a restarted daemon can finish or undo it."""

    stage: Literal["saving", "stopping", "archiving", "writing_policy"]
    old_policy: dict[str, Any]
    new_policy: dict[str, Any]
    utc: str
    """When it started, for the archive folder's name."""
    save_after_step: int
    step: int | None = None
    """The pivot checkpoint, once committed."""
    was_pinned: bool = False
    zombies: tuple[str, ...] = ()
    """Arms in the bandit state whose data source is gone (reported, never nameable)."""
    request_id: int | None = None
    deadline: float | None = None

    @property
    def archive(self) -> str:
        return f"archive/pivot-{self.step or 0:06d}-{self.utc}"

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "old_policy": self.old_policy,
            "new_policy": self.new_policy,
            "utc": self.utc,
            "save_after_step": self.save_after_step,
            "step": self.step,
            "was_pinned": self.was_pinned,
            "zombies": list(self.zombies),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PivotPlan:
        return cls(
            stage=data["stage"],
            old_policy=data["old_policy"],
            new_policy=data["new_policy"],
            utc=data["utc"],
            save_after_step=int(data["save_after_step"]),
            step=data.get("step"),
            was_pinned=bool(data.get("was_pinned", False)),
            zombies=tuple(data.get("zombies", ())),
        )


@dataclass(frozen=True)
class State:
    phase: Phase = "starting"
    seg: int = 0
    """Trainer starts so far (the `seg` of .loss.json lines)."""
    trainer_pid: int | None = None
    trainer_started_t: float | None = None
    resume_step: int | None = None
    """The checkpoint the current (or next) trainer loads."""
    last_step: int | None = None
    """Last step logged by the current trainer."""
    last_activity_t: float = 0.0
    """Last step line, trainer start or checkpoint write: what stall detection measures."""
    stop_reason: StopReason | None = None
    kill_at: float | None = None
    backoff_until: float | None = None
    next_backoff_s: float | None = None
    """Delay before the next restart; None means backoff_initial_s."""
    restarts: int = 0
    restarts_without_progress: int = 0
    progress_since_start: bool = False
    checkpoints: tuple[Ckpt, ...] = ()
    """Verified checkpoints, oldest first."""
    pinned: frozenset[int] = frozenset()
    failures: tuple[tuple[int, int], ...] = ()
    """(checkpoint step, trainer deaths before logging a step beyond it)."""
    divergences: int = 0
    """Divergences since the run last got past the previous one with a checkpoint."""
    divergence_step: int | None = None
    poisoned_from: int | None = None
    """Checkpoints at or after this step belong to a diverged trainer."""
    waiters: tuple[Waiter, ...] = ()
    shutdown: bool = False
    halt_reason: str | None = None
    pivot: PivotPlan | None = None
    """The pivot in progress, if any (see supervisor.pivot)."""
    last_pivot_step: int | None = None
    """Checkpoints at or before this step carry a bandit from before the last pivot."""

    @property
    def trainer_alive(self) -> bool:
        return self.trainer_pid is not None

    @property
    def newest(self) -> Ckpt | None:
        return self.checkpoints[-1] if self.checkpoints else None


# ----------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Startup:
    """The daemon has restored its state and scanned the checkpoint directory."""

    t: float
    last_logged_step: int | None = None
    unclean: bool = False
    """The previous daemon did not shut down cleanly (power cut, SIGKILL)."""


@dataclass(frozen=True)
class CheckpointCommitted:
    t: float
    step: int
    name: str
    bytes: int
    mtime: float = 0.0


@dataclass(frozen=True)
class CheckpointRejected:
    t: float
    step: int | None
    name: str
    reason: str


@dataclass(frozen=True)
class CheckpointWriting:
    """A checkpoint .tmp file grew: the trainer is busy saving, not hung."""

    t: float


@dataclass(frozen=True)
class StepLogged:
    t: float
    step: int
    loss: float


@dataclass(frozen=True)
class TrainerSpawned:
    t: float
    pid: int


@dataclass(frozen=True)
class SpawnFailed:
    t: float
    error: str


@dataclass(frozen=True)
class TrainerExited:
    t: float
    pid: int
    returncode: int
    """Negative: killed by that signal (as subprocess reports it)."""


@dataclass(frozen=True)
class Tick:
    t: float


@dataclass(frozen=True)
class Operator:
    t: float
    request_id: int
    cmd: str
    args: dict[str, Any] = field(default_factory=dict)
    uid: int | None = None


@dataclass(frozen=True)
class ShutdownRequested:
    """SIGTERM or SIGINT to the daemon (what systemd sends)."""

    t: float
    signal: str = "SIGTERM"


@dataclass(frozen=True)
class PivotProgress:
    """The executor finished (or failed) a pivot stage's file work."""

    t: float
    done: Literal["archived", "policy_written"]
    error: str | None = None


Event = (
    PivotProgress
    | Startup
    | CheckpointCommitted
    | CheckpointRejected
    | CheckpointWriting
    | StepLogged
    | TrainerSpawned
    | SpawnFailed
    | TrainerExited
    | Tick
    | Operator
    | ShutdownRequested
)


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Spawn:
    seg: int
    resume: Ckpt | None
    pivot: bool = False


@dataclass(frozen=True)
class SignalTrainer:
    signal: Literal["SIGTERM", "SIGUSR1", "SIGKILL"]
    reason: str


@dataclass(frozen=True)
class Delete:
    step: int
    name: str
    reason: str


@dataclass(frozen=True)
class Quarantine:
    step: int | None
    name: str
    reason: str


@dataclass(frozen=True)
class Record:
    """A journal entry that is only a record (the decision itself, a warning)."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    request_id: int
    ok: bool
    result: dict[str, Any] | None = None
    code: str = ""
    message: str = ""


@dataclass(frozen=True)
class Exit:
    code: int = 0


@dataclass(frozen=True)
class Archive:
    """Move the trainer's bandit and sample files and policy.json into `directory`."""

    directory: str
    step: int
    old_policy: dict[str, Any]
    new_policy: dict[str, Any]


@dataclass(frozen=True)
class WritePolicy:
    policy: dict[str, Any]


Action = Spawn | SignalTrainer | Delete | Quarantine | Record | Reply | Exit | Archive | WritePolicy


# ----------------------------------------------------------------------------- helpers


def is_divergent(loss: float, max_loss: float) -> bool:
    return not math.isfinite(loss) or loss > max_loss


def failures_of(state: State, step: int) -> int:
    return dict(state.failures).get(step, 0)


def with_failures(state: State, step: int, count: int) -> State:
    table = dict(state.failures)
    if count:
        table[step] = count
    else:
        table.pop(step, None)
    return replace(state, failures=tuple(sorted(table.items())))


def without_checkpoints(state: State, steps: set[int]) -> State:
    return replace(state, checkpoints=tuple(c for c in state.checkpoints if c.step not in steps))


def ckpt_json(c: Ckpt | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"step": c.step, "name": c.name, "bytes": c.bytes}


def retention_deletions(state: State, rules: Rules) -> list[Ckpt]:
    """Verified checkpoints that retention removes now, oldest first.

    Keeps the newest keep_last unpinned ones, every pinned one, and the one the running
    trainer resumed from while it has not yet logged a step past it.
    """
    unpinned = [c for c in state.checkpoints if c.step not in state.pinned]
    if len(unpinned) <= rules.keep_last:
        return []
    loading = state.last_step is None or (
        state.resume_step is not None and state.last_step <= state.resume_step
    )
    busy = state.trainer_alive or state.phase == "backoff"
    in_use = state.resume_step if busy and loading else None
    return [c for c in unpinned[: -rules.keep_last] if c.step != in_use]


def next_to_delete(state: State, rules: Rules) -> int | None:
    """The step retention would delete after the next committed checkpoint."""
    unpinned = [c for c in state.checkpoints if c.step not in state.pinned]
    if len(unpinned) < rules.keep_last:
        return None
    return unpinned[0].step


def deadline(state: State, rules: Rules) -> float | None:
    """When the daemon must send the next Tick, if no other event arrives first."""
    times = [state.kill_at, state.backoff_until]
    if state.phase in ("starting", "running", "saving", "pivoting") and state.trainer_alive:
        times.append(state.last_activity_t + rules.stall_timeout_s)
    times.extend(w.deadline for w in state.waiters)
    if state.pivot is not None and state.pivot.stage == "saving":
        times.append(state.pivot.deadline)
    pending = [t for t in times if t is not None]
    return min(pending) if pending else None


def _apply_retention(state: State, rules: Rules, actions: list[Action]) -> State:
    doomed = retention_deletions(state, rules)
    for c in doomed:
        actions.append(Delete(c.step, c.name, f"retention: keep_last={rules.keep_last}"))
    return without_checkpoints(state, {c.step for c in doomed}) if doomed else state


def _spawn(state: State, t: float, actions: list[Action]) -> State:
    resume = state.newest
    seg = state.seg + 1
    # A checkpoint from before the last pivot carries the old policy's bandit: the trainer
    # must start its bandit fresh under the new policy.json (weights and moments stay).
    pivot = (
        resume is not None
        and state.last_pivot_step is not None
        and resume.step <= state.last_pivot_step
    )
    actions.append(Spawn(seg=seg, resume=resume, pivot=pivot))
    return replace(
        state,
        phase="starting",
        seg=seg,
        resume_step=resume.step if resume else None,
        last_step=None,
        last_activity_t=t,
        stop_reason=None,
        kill_at=None,
        backoff_until=None,
        progress_since_start=False,
        poisoned_from=None,
        halt_reason=None,
    )


def _stop_trainer(
    state: State, t: float, rules: Rules, reason: StopReason, actions: list[Action]
) -> State:
    actions.append(SignalTrainer("SIGTERM", reason))
    return replace(state, phase="stopping", stop_reason=reason, kill_at=t + rules.stop_timeout_s)


def _reply_error(actions: list[Action], request_id: int, code: str, message: str) -> None:
    actions.append(Reply(request_id, ok=False, code=code, message=message))


def _settle_waiters(
    state: State, actions: list[Action], *, kind: str, result: dict[str, Any]
) -> State:
    """Answer every waiter of `kind` with `result`."""
    done = [w for w in state.waiters if w.kind == kind]
    for w in done:
        actions.append(Reply(w.request_id, ok=True, result=result))
    return replace(state, waiters=tuple(w for w in state.waiters if w.kind != kind))


def _fail_waiters(state: State, actions: list[Action], code: str, message: str) -> State:
    for w in state.waiters:
        _reply_error(actions, w.request_id, code, message)
    return replace(state, waiters=())


# ----------------------------------------------------------------------------- decide


def decide(state: State, event: Event, rules: Rules) -> tuple[State, list[Action]]:
    """The policy: the next state and what to do, for one event."""
    actions: list[Action] = []
    handler = _HANDLERS[type(event)]
    state = handler(state, event, rules, actions)
    return state, actions


def _on_startup(state: State, ev: Startup, rules: Rules, actions: list[Action]) -> State:
    newest = state.newest
    if ev.unclean:
        lost = None
        if ev.last_logged_step is not None:
            lost = ev.last_logged_step - (newest.step if newest else 0)
        actions.append(
            Record(
                "boot_recovery",
                {
                    "resume_step": newest.step if newest else None,
                    "last_logged_step": ev.last_logged_step,
                    "steps_lost": max(lost, 0) if lost is not None else None,
                },
            )
        )
    if state.pivot is not None and state.phase not in HALTED:
        return _pivot.resume_after_restart(state, ev, rules, actions)
    state = _apply_retention(state, rules, actions)
    if state.phase in HALTED:
        actions.append(Record("idle", {"state": state.phase, "reason": state.halt_reason}))
        return state
    return _spawn(state, ev.t, actions)


def _on_committed(
    state: State, ev: CheckpointCommitted, rules: Rules, actions: list[Action]
) -> State:
    if state.poisoned_from is not None and ev.step >= state.poisoned_from:
        actions.append(
            Quarantine(
                ev.step, ev.name, f"written at or after divergence at step {state.poisoned_from}"
            )
        )
        return state
    ckpt = Ckpt(ev.step, ev.name, ev.bytes, ev.mtime)
    state, consumed = _pivot.on_commit(state, ckpt, ev.t, rules, actions)
    if consumed:
        return state
    others = tuple(c for c in state.checkpoints if c.step != ev.step)
    state = replace(state, checkpoints=tuple(sorted((*others, ckpt), key=lambda c: c.step)))
    state = replace(state, last_activity_t=max(state.last_activity_t, ev.t))
    if state.trainer_alive and (state.resume_step is None or ev.step > state.resume_step):
        state = replace(state, progress_since_start=True)
        if state.restarts_without_progress:
            actions.append(Record("progress", {"step": ev.step}))
        state = replace(state, restarts_without_progress=0, next_backoff_s=rules.backoff_initial_s)
    if state.divergence_step is not None and ev.step > state.divergence_step:
        state = replace(state, divergences=0, divergence_step=None)
    actions.append(Record("checkpoint", {"step": ev.step, "name": ev.name, "bytes": ev.bytes}))
    if state.phase == "saving":
        state = replace(state, phase="running")
    state = _settle_save_waiters(state, ckpt, actions)
    return _apply_retention(state, rules, actions)


def _settle_save_waiters(state: State, ckpt: Ckpt, actions: list[Action]) -> State:
    ready = [w for w in state.waiters if w.kind == "save" and ckpt.step >= w.step]
    for w in ready:
        actions.append(Reply(w.request_id, ok=True, result={"step": ckpt.step, "name": ckpt.name}))
    return replace(state, waiters=tuple(w for w in state.waiters if w not in ready))


def _on_rejected(
    state: State, ev: CheckpointRejected, rules: Rules, actions: list[Action]
) -> State:
    actions.append(Quarantine(ev.step, ev.name, ev.reason))
    if ev.step is not None:
        state = without_checkpoints(state, {ev.step})
    return state


def _on_writing(state: State, ev: CheckpointWriting, rules: Rules, actions: list[Action]) -> State:
    return replace(state, last_activity_t=max(state.last_activity_t, ev.t))


def _stepped(state: State, step: int, t: float) -> State:
    """replace(state, last_step=step, last_activity_t=t), for every step line: a copy of
    the instance dict instead of dataclasses.replace's walk through all ~40 fields."""
    new = object.__new__(State)
    new.__dict__.update(state.__dict__)
    new.__dict__["last_step"] = step
    new.__dict__["last_activity_t"] = t
    return new


def _on_step(state: State, ev: StepLogged, rules: Rules, actions: list[Action]) -> State:
    if not state.trainer_alive or state.stop_reason == "divergence":
        return state
    if is_divergent(ev.loss, rules.max_loss):
        return _diverge(state, ev, rules, actions)
    was_loading = state.last_step is None or (
        state.resume_step is not None and state.last_step <= state.resume_step
    )
    state = _stepped(state, ev.step, ev.t)
    if state.phase == "starting":
        state = replace(state, phase="running")
    suspect = state.resume_step
    if suspect is not None and ev.step > suspect:
        if failures_of(state, suspect):
            state = with_failures(state, suspect, 0)
        if was_loading:
            # The checkpoint it resumed from is no longer in use: retention may take it now.
            state = _apply_retention(state, rules, actions)
    return state


def _diverge(state: State, ev: StepLogged, rules: Rules, actions: list[Action]) -> State:
    actions.append(SignalTrainer("SIGKILL", f"divergence: loss {ev.loss} at step {ev.step}"))
    recurring = state.divergence_step is not None
    divergences = state.divergences + 1 if recurring else 1
    first_bad = (
        min(ev.step, state.divergence_step) if state.divergence_step is not None else ev.step
    )
    poisoned = [c for c in state.checkpoints if c.step >= ev.step]
    for c in poisoned:
        actions.append(
            Quarantine(c.step, c.name, f"written at or after divergence at step {ev.step}")
        )
    state = without_checkpoints(state, {c.step for c in poisoned})
    actions.append(
        Record(
            "divergence",
            {
                "step": ev.step,
                "loss": ev.loss if math.isfinite(ev.loss) else str(ev.loss),
                "max_loss": rules.max_loss,
                "count": divergences,
                "quarantined": [c.step for c in poisoned],
                "rollback_to": state.newest.step if state.newest else None,
            },
        )
    )
    state = _fail_waiters(state, actions, "wrong_state", "the trainer diverged and was killed")
    state = _pivot.abort(state, actions, f"the loss diverged at step {ev.step}")
    return replace(
        state,
        phase="stopping",
        stop_reason="divergence",
        kill_at=None,
        divergences=divergences,
        divergence_step=first_bad,
        poisoned_from=ev.step,
    )


def _on_spawned(state: State, ev: TrainerSpawned, rules: Rules, actions: list[Action]) -> State:
    return replace(state, trainer_pid=ev.pid, trainer_started_t=ev.t, last_activity_t=ev.t)


def _on_spawn_failed(state: State, ev: SpawnFailed, rules: Rules, actions: list[Action]) -> State:
    return _crashed(state, ev.t, rules, actions, cause=f"could not start the trainer: {ev.error}")


def _on_exited(state: State, ev: TrainerExited, rules: Rules, actions: list[Action]) -> State:
    if ev.pid != state.trainer_pid:
        return state
    reason = state.stop_reason
    state = replace(state, trainer_pid=None, kill_at=None)
    exit_fields = {"pid": ev.pid, "returncode": ev.returncode, "last_step": state.last_step}
    if reason == "pivot" and state.pivot is not None:
        actions.append(Record("trainer_stopped", {**exit_fields, "cause": "pivot"}))
        return _pivot.on_trainer_stopped(state, ev.t, rules, actions)
    if state.pivot is not None:
        state = _pivot.abort(state, actions, f"the trainer exited ({describe_exit(ev.returncode)})")
    if reason in ("operator", "shutdown"):
        actions.append(Record("trainer_stopped", exit_fields))
        state = replace(state, phase="stopped", stop_reason=None, halt_reason="stopped by operator")
        state = _settle_waiters(
            state,
            actions,
            kind="stop",
            result={"state": "stopped", "checkpoint": ckpt_json(state.newest)},
        )
        state = _fail_waiters(state, actions, "wrong_state", "the trainer stopped")
        if reason == "shutdown" or state.shutdown:
            actions.append(Exit(0))
        return state
    if reason == "divergence":
        actions.append(Record("trainer_killed", {**exit_fields, "cause": "divergence"}))
        if state.divergences > rules.divergence_retries:
            actions.append(Record("halt", {"state": "diverged", "step": state.divergence_step}))
            return replace(
                state,
                phase="diverged",
                stop_reason=None,
                halt_reason=f"loss diverged again at step {state.divergence_step}",
            )
        return _spawn(state, ev.t, actions)
    if reason is None and ev.returncode == 0:
        actions.append(Record("trainer_finished", exit_fields))
        state = _fail_waiters(state, actions, "wrong_state", "the trainer finished")
        return replace(state, phase="finished", halt_reason="the trainer finished")
    cause = "hang (no step line)" if reason == "stall" else describe_exit(ev.returncode)
    return _crashed(state, ev.t, rules, actions, cause=cause, exit_fields=exit_fields)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _crashed(
    state: State,
    t: float,
    rules: Rules,
    actions: list[Action],
    *,
    cause: str,
    exit_fields: dict[str, Any] | None = None,
) -> State:
    actions.append(Record("crash", {**(exit_fields or {}), "cause": cause}))
    state = _fail_waiters(state, actions, "wrong_state", f"the trainer crashed: {cause}")
    state = replace(state, trainer_pid=None, stop_reason=None, kill_at=None)
    suspect = state.resume_step
    if suspect is not None and (state.last_step is None or state.last_step <= suspect):
        count = failures_of(state, suspect) + 1
        state = with_failures(state, suspect, count)
        if count >= rules.fallback_after_failures:
            bad = next((c for c in state.checkpoints if c.step == suspect), None)
            if bad is not None:
                actions.append(
                    Quarantine(
                        bad.step,
                        bad.name,
                        f"the trainer died {count} times resuming from it before logging a step",
                    )
                )
                state = without_checkpoints(state, {bad.step})
            state = with_failures(state, suspect, 0)
    if state.progress_since_start:
        state = replace(state, restarts_without_progress=0, next_backoff_s=rules.backoff_initial_s)
    if state.restarts_without_progress >= rules.max_restarts_without_progress:
        actions.append(
            Record(
                "halt",
                {
                    "state": "crash_loop",
                    "restarts_without_progress": state.restarts_without_progress,
                },
            )
        )
        return replace(
            state,
            phase="crash_loop",
            halt_reason=f"{state.restarts_without_progress} restarts without progress; last: {cause}",
        )
    delay = rules.backoff_initial_s if state.next_backoff_s is None else state.next_backoff_s
    actions.append(
        Record(
            "restart_scheduled",
            {
                "backoff_s": delay,
                "attempt": state.restarts_without_progress + 1,
                "resume_step": state.newest.step if state.newest else None,
            },
        )
    )
    state = replace(
        state,
        phase="backoff",
        backoff_until=t + delay,
        next_backoff_s=min(max(delay * 2, 0.0), rules.backoff_max_s),
        restarts=state.restarts + 1,
        restarts_without_progress=state.restarts_without_progress + 1,
        resume_step=state.newest.step if state.newest else None,
    )
    if delay <= 0:
        return _spawn(state, t, actions)
    return state


def _on_tick(state: State, ev: Tick, rules: Rules, actions: list[Action]) -> State:
    t = ev.t
    expired = [w for w in state.waiters if w.deadline <= t]
    for w in expired:
        _reply_error(
            actions, w.request_id, "timeout", f"no checkpoint was committed for {w.kind} in time"
        )
    if expired:
        state = replace(state, waiters=tuple(w for w in state.waiters if w not in expired))
    plan = state.pivot
    if (
        plan is not None
        and plan.stage == "saving"
        and plan.deadline is not None
        and t >= plan.deadline
    ):
        return _pivot.abort(
            state, actions, "no checkpoint was committed in time; the old policy stays", "timeout"
        )
    if state.phase == "backoff" and state.backoff_until is not None and t >= state.backoff_until:
        return _spawn(state, t, actions)
    if state.kill_at is not None and t >= state.kill_at and state.trainer_alive:
        actions.append(SignalTrainer("SIGKILL", f"did not exit within {rules.stop_timeout_s:g} s"))
        return replace(state, kill_at=None)
    if (
        state.phase in ("starting", "running", "saving", "pivoting")
        and state.stop_reason is None
        and state.trainer_alive
        and t - state.last_activity_t >= rules.stall_timeout_s
    ):
        state = _pivot.abort(state, actions, "the trainer stopped logging steps")
        actions.append(
            Record(
                "stall",
                {"last_step": state.last_step, "silent_s": round(t - state.last_activity_t, 3)},
            )
        )
        return _stop_trainer(state, t, rules, "stall", actions)
    return state


def _on_shutdown(state: State, ev: ShutdownRequested, rules: Rules, actions: list[Action]) -> State:
    actions.append(Record("shutdown", {"signal": ev.signal}))
    state = replace(state, shutdown=True)
    if state.trainer_alive:
        if state.stop_reason in ("operator", "shutdown", "pivot"):
            return state
        if state.stop_reason in ("divergence", "stall"):
            # Already on its way down; exit once it is gone rather than restarting it.
            return replace(state, stop_reason="shutdown")
        return _stop_trainer(state, ev.t, rules, "shutdown", actions)
    actions.append(Exit(0))
    return state


# ----------------------------------------------------------------------------- operator


def _on_operator(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    command = _COMMANDS.get(ev.cmd)
    if command is None:
        _reply_error(actions, ev.request_id, "unknown_command", f"unknown command '{ev.cmd}'")
        return state
    actions.append(Record("operator", {"cmd": ev.cmd, "args": ev.args, "uid": ev.uid}))
    return command(state, ev, rules, actions)


def _cmd_save(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    if state.phase not in ("running", "saving") or not state.trainer_alive:
        _reply_error(
            actions,
            ev.request_id,
            "wrong_state",
            f"cannot save while the run is {state.phase}: a save needs a running trainer",
        )
        return state
    actions.append(SignalTrainer("SIGUSR1", "operator save"))
    target = (state.last_step or 0) if state.last_step is not None else (state.resume_step or 0)
    if ev.args.get("wait"):
        timeout = float(ev.args.get("timeout_s") or rules.save_wait_timeout_s)
        waiter = Waiter(ev.request_id, "save", target, ev.t + timeout)
        return replace(state, phase="saving", waiters=(*state.waiters, waiter))
    actions.append(Reply(ev.request_id, ok=True, result={"requested": True, "step": target}))
    return replace(state, phase="saving")


def _cmd_stop(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    if state.phase == "backoff":
        actions.append(Record("restart_cancelled", {}))
        actions.append(
            Reply(
                ev.request_id,
                ok=True,
                result={"state": "stopped", "checkpoint": ckpt_json(state.newest)},
            )
        )
        return replace(
            state, phase="stopped", backoff_until=None, halt_reason="stopped by operator"
        )
    if not state.trainer_alive or state.phase not in ("starting", "running", "saving"):
        _reply_error(
            actions, ev.request_id, "wrong_state", f"nothing to stop: the run is {state.phase}"
        )
        return state
    waiter = Waiter(ev.request_id, "stop", 0, ev.t + rules.stop_timeout_s + 60.0)
    state = _stop_trainer(state, ev.t, rules, "operator", actions)
    return replace(state, waiters=(*state.waiters, waiter))


def _cmd_start(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    if state.phase not in HALTED:
        _reply_error(
            actions,
            ev.request_id,
            "wrong_state",
            f"the run is {state.phase}; start works from stopped, finished, crash_loop or diverged",
        )
        return state
    state = replace(
        state,
        restarts_without_progress=0,
        next_backoff_s=rules.backoff_initial_s,
        divergences=0,
        divergence_step=None,
    )
    if state.pivot is not None:
        state = _pivot.resume_after_restart(state, Startup(ev.t), rules, actions)
        actions.append(Reply(ev.request_id, ok=True, result={"state": state.phase}))
        return state
    state = _spawn(state, ev.t, actions)
    actions.append(
        Reply(
            ev.request_id, ok=True, result={"state": "starting", "resume_step": state.resume_step}
        )
    )
    return state


def _step_arg(ev: Operator, actions: list[Action]) -> int | None:
    step = ev.args.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        _reply_error(
            actions,
            ev.request_id,
            "bad_argument",
            f"'step' must be a non-negative integer, got {step!r}",
        )
        return None
    return step


def _cmd_pin(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    step = _step_arg(ev, actions)
    if step is None:
        return state
    if all(c.step != step for c in state.checkpoints):
        known = ", ".join(str(c.step) for c in state.checkpoints) or "none"
        _reply_error(
            actions,
            ev.request_id,
            "bad_argument",
            f"no verified checkpoint at step {step} (have: {known})",
        )
        return state
    actions.append(Reply(ev.request_id, ok=True, result={"step": step, "pinned": True}))
    return replace(state, pinned=state.pinned | {step})


def _cmd_unpin(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    step = _step_arg(ev, actions)
    if step is None:
        return state
    if step not in state.pinned:
        _reply_error(actions, ev.request_id, "bad_argument", f"step {step} is not pinned")
        return state
    actions.append(Reply(ev.request_id, ok=True, result={"step": step, "pinned": False}))
    state = replace(state, pinned=state.pinned - {step})
    return _apply_retention(state, rules, actions)


def _cmd_shutdown(state: State, ev: Operator, rules: Rules, actions: list[Action]) -> State:
    state = replace(state, shutdown=True)
    if state.trainer_alive:
        waiter = Waiter(ev.request_id, "stop", 0, ev.t + rules.stop_timeout_s + 60.0)
        if state.stop_reason is None:
            state = _stop_trainer(state, ev.t, rules, "shutdown", actions)
        else:
            state = replace(state, stop_reason="shutdown")
        return replace(state, waiters=(*state.waiters, waiter))
    actions.append(
        Reply(
            ev.request_id,
            ok=True,
            result={"state": "stopped", "checkpoint": ckpt_json(state.newest)},
        )
    )
    actions.append(Exit(0))
    return replace(state, phase="stopped" if state.phase == "backoff" else state.phase)


_COMMANDS = {
    "save": _cmd_save,
    "stop": _cmd_stop,
    "start": _cmd_start,
    "pin": _cmd_pin,
    "unpin": _cmd_unpin,
    "shutdown": _cmd_shutdown,
}

_HANDLERS: dict[type, Any] = {
    Startup: _on_startup,
    CheckpointCommitted: _on_committed,
    CheckpointRejected: _on_rejected,
    CheckpointWriting: _on_writing,
    StepLogged: _on_step,
    TrainerSpawned: _on_spawned,
    SpawnFailed: _on_spawn_failed,
    TrainerExited: _on_exited,
    Tick: _on_tick,
    Operator: _on_operator,
    ShutdownRequested: _on_shutdown,
}


# ----------------------------------------------------------------------------- persistence

PERSISTED = (
    "phase",
    "seg",
    "restarts",
    "restarts_without_progress",
    "next_backoff_s",
    "failures",
    "divergences",
    "divergence_step",
    "halt_reason",
    "last_pivot_step",
)


def persisted(state: State) -> dict[str, Any]:
    """What survives a daemon restart (written to the journal as `state` records)."""
    data = {name: getattr(state, name) for name in PERSISTED}
    data["failures"] = [list(pair) for pair in state.failures]
    data["pinned"] = sorted(state.pinned)
    data["pivot"] = state.pivot.to_json() if state.pivot else None
    return data


def restore(data: dict[str, Any], rules: Rules) -> State:
    """A fresh State carrying the persisted fields of a previous daemon."""
    phase = data.get("phase", "starting")
    if phase not in HALTED:
        phase = "starting"
    return State(
        phase=phase,
        seg=int(data.get("seg", 0)),
        restarts=int(data.get("restarts", 0)),
        restarts_without_progress=int(data.get("restarts_without_progress", 0)),
        next_backoff_s=data.get("next_backoff_s"),
        failures=tuple((int(a), int(b)) for a, b in data.get("failures", [])),
        divergences=int(data.get("divergences", 0)),
        divergence_step=data.get("divergence_step"),
        halt_reason=data.get("halt_reason"),
        pinned=frozenset(int(s) for s in data.get("pinned", [])),
        last_pivot_step=data.get("last_pivot_step"),
        pivot=PivotPlan.from_json(data["pivot"]) if data.get("pivot") else None,
    )


# The pivot's stages live in their own module; it builds on the helpers above.
from trainwarden.supervisor.core import pivot as _pivot  # noqa: E402

_COMMANDS["pivot"] = _pivot.cmd_pivot
_HANDLERS[PivotProgress] = _pivot.on_progress
