"""The policy's state and rules (what of the state survives a daemon restart: core.persist)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from trainwarden.supervisor.core.phases import Phase
from trainwarden.supervisor.core.spikes import Spike, SpikeLog, SpikeRules

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import CkptRef, PersistedPivot

StopReason = Literal["operator", "shutdown", "stall", "divergence", "spike", "pivot", "gpu_fault"]
KILLS_TO_RESTART: dict[StopReason, str] = {
    "stall": "it stopped logging steps",
    "divergence": "its loss diverged",
    "spike": "its loss spiked",
}
"""The daemon's own stops of a trainer that a restart follows, unless a stop or shutdown
asked meanwhile stands; each with why, in words."""
RestartCause = Literal[
    "crash", "hang", "disk_full", "divergence", "spike", "gpu_fault", "pivot", "operator", "daemon"
]
"""Why a trainer start after the run's first was made: the trainer died (crash; hang: killed
for no step line; disk_full: died on a full disk), the daemon killed it for a non-finite or
too high loss (divergence) or a loss spike and rolled back, it was started again after a GPU
fault or a pivot, by the operator's `start`, or by a new daemon (daemon)."""
RESTART_CAUSES: tuple[RestartCause, ...] = get_args(RestartCause)
PivotStage = Literal["saving", "stopping", "archiving", "writing_policy"]


@dataclass(frozen=True)
class Rules:
    """The numbers the policy works with (from the run's config)."""

    keep_last: int = 3
    backoff_initial_s: float = 5.0
    backoff_max_s: float = 300.0
    max_restarts_without_progress: int = 5
    stall_timeout_s: float = 600.0
    dump_timeout_s: float = 10.0
    """How long a hang's stack dump may delay its SIGTERM (0: no dump)."""
    stop_timeout_s: float = 120.0
    max_loss: float = 20.0
    divergence_retries: int = 1
    fallback_after_failures: int = 2
    save_wait_timeout_s: float = 600.0
    mirror: bool = False
    """A mirror is configured: each new checkpoint is copied there."""
    mirror_keep_last: int = 3
    """Mirrored checkpoints the mirror keeps, besides the one its latest.json names."""
    max_step_jump: int | None = None
    """How far beyond the newest logged step a commit may be (None: see step_jump_limit)."""
    total_steps: int | None = None
    """The run's planned steps, when known: no plausible jump is larger."""
    suspect_window_steps: int = 10
    """A divergence this few steps after resuming from a checkpoint makes it suspect."""
    max_fallbacks: int = 3
    """Suspect checkpoints abandoned in a row before the run halts in diverged."""
    verify_timeout_s: float = 180.0
    """How long a decision that names a checkpoint waits for a verification in flight."""
    spikes: SpikeRules = SpikeRules()
    """Loss spike detection and rollback ([divergence], see core.spikes and core.rollback)."""
    gpu_devices: tuple[int, ...] | None = None
    """[gpu] devices: the GPUs whose faults concern this run (None: every GPU)."""
    gpu_reset: bool = False
    """[gpu] reset: after a reset-class XID, reset the GPU and resume instead of halting."""
    gpu_idle_timeout_s: float = 60.0
    """How long a GPU fault waits for every process to let go of the GPU."""
    exit_when_ended: bool = False
    """Inside a Slurm job ([slurm] exit_when_ended): exit when the run finishes or halts,
    so the job ends and gives its allocation back (see core.requeue)."""


@dataclass(frozen=True, slots=True)
class Ckpt:
    """A committed, verified checkpoint."""

    step: int
    name: str
    bytes: int
    mtime: float = 0.0
    digest: str = ""
    """xxh3-128 of its files when it was verified (see store.digest); "" if unknown."""


@dataclass(frozen=True, slots=True)
class GpuFaultInfo:
    """A GPU fault the trainer cannot run through, while the daemon stops it (core.gpu_faults)."""

    gpu: int
    xid: int | None
    """None: the GPU stopped answering NVML."""
    cls: str
    """Its core.gpu_faults.XidClass."""
    message: str = ""
    reason: str = ""
    """The halt reason it ends in: also what a daemon restarted meanwhile halts with."""
    stop_asked: bool = False
    """The operator's stop came while the daemon handled it: the run halts once the trainer
    is gone, with no wait for the GPU, no reset and no restart."""


@dataclass(frozen=True, slots=True)
class Pending:
    """A checkpoint seen committed (or changed) whose verification has not ended yet."""

    name: str
    step: int
    since: float
    stray: bool = False
    """Seen after the start's main process exited, while its other processes were stopped."""
    after_pivot: int | None = None
    """A pivot's step this checkpoint comes after, seen before the trainer stopped for that
    pivot exited: written under the old policy, set aside once verified."""


@dataclass(frozen=True, slots=True)
class Waiter:
    """An operator request answered later (save --wait, stop, shutdown)."""

    request_id: int
    kind: Literal["save", "stop", "start"]
    step: int
    """For save: the checkpoint must be at this step or later."""
    deadline: float
    answer: Ckpt | None = None
    """For save: the first checkpoint at or after `step` committed since the request."""


@dataclass(frozen=True, slots=True)
class Requeueing:
    """Leaving the Slurm job: the trainer saves, then the job is requeued (core.requeue)."""

    by: float
    """time.monotonic() by which the job must be requeued, saved or not."""
    scontrol: bool
    """Requeue with scontrol (False: the batch script does)."""
    cut_short: bool = False
    """The trainer's SIGKILL comes at `by`, before stop_timeout_s: the time left is shorter."""


@dataclass(frozen=True)
class PivotPlan:
    """A pivot's progress; persisted so a restarted daemon can finish or undo it."""

    stage: PivotStage
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
    stop_after: bool = False
    """The operator's stop came past the pivot's checkpoint: the pivot finishes, then the run
    stops instead of starting again (not persisted, as no waiting stop is)."""

    @property
    def archive(self) -> str:
        return f"archive/pivot-{self.step or 0:06d}-{self.utc}"

    def to_json(self) -> PersistedPivot:
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
    phase: Phase = Phase.STARTING
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
    parser_no_match: tuple[str, str] | None = None
    """(parser, a sample line) while no line of the current start has matched the parser:
    a hang then names it as the likely cause."""
    stop_reason: StopReason | None = None
    kill_at: float | None = None
    dump_until: float | None = None
    """A hung trainer's stacks are being dumped: its SIGTERM comes when the dump is done,
    or at this time at the latest."""
    stop_exit: str | None = None
    """How a trainer stopped on request ended ("exited 0", "killed after 10 s"), until
    the stop's replies are given."""
    stop_from: int | None = None
    """The newest checkpoint's step (-1: none) when the stop's SIGTERM was sent: a newer
    one is the trainer's save on it."""
    backoff_until: float | None = None
    next_backoff_s: float | None = None
    """Delay before the next restart; None means backoff_initial_s."""
    restarts: int = 0
    """Trainer starts after the run's first, whatever their cause (a start that could not
    be made counts too)."""
    restarts_by_cause: tuple[tuple[RestartCause, int], ...] = ()
    """(cause, starts) adding up to `restarts`, in RESTART_CAUSES order, causes with none
    left out."""
    restart_cause: RestartCause | None = None
    """What the next start is counted under when it is made (not persisted: a new daemon's
    start is the daemon's)."""
    restarts_without_progress: int = 0
    """Crashes and hangs since the run last made progress: the crash-loop budget."""
    progress_since_start: bool = False
    checkpoints: tuple[Ckpt, ...] = ()
    """Verified checkpoints, oldest first."""
    pending: tuple[Pending, ...] = ()
    """Checkpoints seen committed whose verification is still running (see core.barrier)."""
    spawn_due: bool = False
    """A trainer start waits for the verifications pending when it was decided."""
    containing: bool = False
    """The last start's other processes are being stopped: nothing new starts meanwhile, and
    what they commit then is stray (quarantined, as their log lines are not counted)."""
    stop_due: bool = False
    """The trainer stopped: the stop replies (and a shutdown's exit) wait for them too."""
    unverified: tuple[str, ...] = ()
    """Checkpoints whose verification was given up on (overdue), until it ends."""
    digests: tuple[tuple[str, str], ...] = ()
    """(name, digest) of the checkpoints a previous daemon had verified (persisted)."""
    pinned: frozenset[int] = frozenset()
    failures: tuple[tuple[int, int], ...] = ()
    """(checkpoint step, trainer deaths before logging a step beyond it)."""
    suspects: tuple[tuple[int, int], ...] = ()
    """(checkpoint step, divergences or deaths within suspect_window_steps of resuming
    from it, until a trainer resumed from it gets past that window)."""
    fallbacks: int = 0
    """Suspect checkpoints abandoned since a trainer last got past the suspect window."""
    max_commit_gap: int | None = None
    """The largest step gap between consecutive verified commits seen so far."""
    history_step: int | None = None
    """The last step of the loss history when the daemon started."""
    divergences: int = 0
    """Divergences since the run last got past the previous one with a checkpoint."""
    divergence_step: int | None = None
    poisoned_from: int | None = None
    """Checkpoints at or after this step belong to a diverged trainer."""
    rollback_from: int | None = None
    """The step of the divergence whose restart has not started a trainer yet."""
    waiters: tuple[Waiter, ...] = ()
    booting: bool = False
    """Between Restored and Startup: the step lines decided now are the previous daemon's
    trainer's, caught up from the log (see rollback.caught_up)."""
    caught_up_spike: Spike | None = None
    """A loss spike among those lines, acted on at Startup."""
    commits_without_steps: int = 0
    """Checkpoints this start committed in a row with no step line between them."""
    step_at_commit: int | None = None
    """The last logged step when this start last committed."""
    shutdown: bool = False
    resumes_after: str | None = None
    """The signal (SIGTERM, SIGINT) that shut the daemon down while the run was live: the
    next daemon goes on with it. None after the operator's stop or shutdown."""
    halt_reason: str | None = None
    requeue: Requeueing | None = None
    """Leaving the Slurm job to be queued again, if so."""
    pivot: PivotPlan | None = None
    """The pivot in progress, if any (see core.pivot)."""
    last_pivot_step: int | None = None
    """Checkpoints at or before this step carry a bandit from before the last pivot."""
    spikes: SpikeLog = SpikeLog()
    """Loss spikes: this start's detector, the run's skip windows and rollbacks."""
    gpu_fault: GpuFaultInfo | None = None
    """The GPU fault being handled (trainer stopping, GPU draining or resetting)."""
    gpu_xid: int | None = None
    """An XID the trainer may die of, named beside its crash."""
    memory_faults: int = 0
    """GPU memory-error XIDs (48, 63, 64) this run has had: the second halts."""
    verified_high: int | None = None
    """The highest step of any checkpoint verified in this run (since a start over): a run
    that had one never starts from scratch by itself (see transitions.spawn)."""
    from_scratch: bool = False
    """The operator asked to start over at step 0 (`start --from-scratch`): the next spawn."""

    @property
    def trainer_alive(self) -> bool:
        return self.trainer_pid is not None

    @property
    def newest(self) -> Ckpt | None:
        return self.checkpoints[-1] if self.checkpoints else None


def failures_of(state: State, step: int) -> int:
    return dict(state.failures).get(step, 0)


def with_failures(state: State, step: int, count: int) -> State:
    table = dict(state.failures)
    if count:
        table[step] = count
    else:
        table.pop(step, None)
    return replace(state, failures=tuple(sorted(table.items())))


def suspicion_of(state: State, step: int) -> int:
    return dict(state.suspects).get(step, 0)


def with_suspicion(state: State, step: int, count: int) -> State:
    table = dict(state.suspects)
    if count:
        table[step] = count
    else:
        table.pop(step, None)
    return replace(state, suspects=tuple(sorted(table.items())))


def without_checkpoints(state: State, steps: set[int]) -> State:
    return replace(state, checkpoints=tuple(c for c in state.checkpoints if c.step not in steps))


def ckpt_json(c: Ckpt | None) -> CkptRef | None:
    if c is None:
        return None
    return {"step": c.step, "name": c.name, "bytes": c.bytes}


def with_start_counted(state: State) -> State:
    """A trainer start was made (or tried): after the run's first one, one more restart,
    under the cause it was made for."""
    cause, state = state.restart_cause, replace(state, restart_cause=None)
    if state.seg <= 1:
        return state
    counts = dict(state.restarts_by_cause)
    counts[cause or "daemon"] = counts.get(cause or "daemon", 0) + 1
    return replace(
        state,
        restarts=state.restarts + 1,
        restarts_by_cause=tuple((c, counts[c]) for c in RESTART_CAUSES if c in counts),
    )
