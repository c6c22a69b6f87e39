"""The journal's records as the daemon writes them: one TypedDict per kind (kinds.py's
JournalKind), `kind` its Literal, the kind's own fields beside it.

On disk each record is `{"ts", "t", "kind", ...fields}` (store.journal adds `ts` and `t`);
`trainwarden events --json` prints them as written. A base without `kind` holds fields one
place builds and several records share (the exit of a trainer, a GPU fault's facts); a
record that extends one lists its `kind` after the base's keys. Keys that are Python
keywords (`class`, `for`) make a class take TypedDict's functional form.

JournalEntry is their union: what a reader of the journal may meet from this daemon (a
daemon of another version may write other kinds or keys). The suite holds the daemon to it:
every journal a test's daemon writes is checked against these classes at the test's end
(tests/support/records_check.py: no undeclared key, no required key missing, each value of
its declared type), and each kind of JournalKind has exactly one class here
(tests/test_kinds.py).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal, NotRequired, TypedDict, get_args, get_type_hints

from trainwarden.supervisor.core.shapes import ResumeAuditFacts

# ----------------------------------------------------------------------------- helpers


class CkptRef(TypedDict):
    """A verified checkpoint as core.state.ckpt_json writes it."""

    step: int
    name: str
    bytes: int


class StartCgroup(TypedDict):
    """Where a new trainer's processes went (shell.starts._start_process): nothing without
    cgroups, the cgroup's path, or None and why it could not be joined."""

    cgroup: NotRequired[str | None]
    """None: the child could not be put in its cgroup (cgroup_error says why)."""
    spare: NotRequired[bool]
    """Started in the prepared spare (always True when present)."""
    cgroup_error: NotRequired[str]


class ExitFacts(TypedDict):
    """How the trainer's main process exited (core.lifecycle `exit_fields`)."""

    pid: int
    returncode: int
    """Negative: killed by that signal."""
    last_step: int | None
    """The last step it logged; None: none since it started."""


class StoppedProcess(TypedDict):
    """One leftover process shell.containment.stop_processes stopped, or a cgroup killed."""

    pid: int
    cmdline: NotRequired[list[str]]
    """Absent for a pid only the cgroup's kill ended."""
    signal: NotRequired[str | None]
    """The last signal sent; None: none could be sent."""
    ended: str | None
    """How it ended: "exited 0", "killed by SIGTERM", "gone", "cgroup.kill", "still
    running after SIGKILL"; never None once stop_processes returns."""


class NoMatchSample(TypedDict):
    """The parser that matched no line of the current start, and a line it missed."""

    parser: str
    sample: str


class StackDumpFacts(TypedDict):
    """A stack dump's outcome (shell.hangdump._dump; also the `dump` request's reply)."""

    path: str | None
    """The dump file; None: it could not be written (write_error) or no dump was made."""
    top_frames: list[str]
    error: str | None
    """Why py-spy read no process, or why the dump failed; None: it read at least one."""
    reason: NotRequired[str]
    """"hang" (before a hung trainer is stopped) or "request" (the operator's dump)."""
    step: NotRequired[int | None]
    """The last step logged; None: none."""
    pids: NotRequired[list[int]]
    seconds: NotRequired[float]
    write_error: NotRequired[str]


class StopFacts(TypedDict):
    """What a stop came to (core.transitions.stop_result, less its message)."""

    outcome: str
    """"saved", "exited_without_saving", "killed" or "not_running"."""
    steps_lost: int
    """Steps logged past the newest verified checkpoint."""
    last_step: int | None
    """The last step logged (its resume step if none since it started)."""
    exit: str | None
    """How it exited ("killed by SIGTERM", "killed after 30 s"); None: no trainer ran."""


HaltGpuFacts = TypedDict(
    "HaltGpuFacts",
    {"gpu": NotRequired[int], "xid": NotRequired[int | None], "class": NotRequired[str]},
)
"""The GPU fault a `gpu_fault` halt names (functional form: `class` is a keyword)."""

AwaitingFor = TypedDict("AwaitingFor", {"for": str})
"""What waits for the verifications ("trainer start"); functional form: `for` is a keyword."""


class ResumeForecast(TypedDict, total=False):
    """What a record foretells of the restart's checkpoint (core.barrier.resume_forecast):
    one key of the two, its step (None: from scratch) or, while checkpoints that may change
    it are still being verified, those."""

    resume_step: int | None
    awaiting_verification: list[str]


class RollbackForecast(TypedDict, total=False):
    """ResumeForecast as a divergence says it (core.barrier.rollback_forecast): the step
    under `rollback_to`."""

    rollback_to: int | None
    awaiting_verification: list[str]


class HaltsInstead(TypedDict):
    """What a fallback or divergence says in place of its forecast when the run halts
    instead of restarting (always True)."""

    halts: bool


class FileOpFailure(TypedDict):
    """A checkpoint's files could not be moved or deleted (shell.executor._file_op)."""

    name: str
    error: str
    """The exception's class and strerror."""


class SpikeFacts(TypedDict):
    """A run of losses above the spike threshold (core.spikes.Spike.to_json)."""

    first_step: int
    step: int
    """The step that made it a spike (or, for an outlier, its last step above)."""
    peak: float
    ema: float
    """The loss EMA when the first step crossed the threshold."""
    threshold: float


class SpikeDetection(SpikeFacts):
    """A spike and the rules that called it one (core.rollback._spiked `fields`)."""

    factor: float
    patience: int
    detected_after: int
    """Steps above the threshold when it was called (step - first_step + 1)."""


class RollbackSupport(TypedDict):
    """What the trainer declares in [trainer] supports, as a rollback uses it."""

    skip_data: bool
    lr_scale: bool


class MirrorCopyFacts(TypedDict):
    """One mirror copy's step and duration (core.events.MirrorCopied)."""

    step: int
    seconds: float


# ----------------------------------------------------------------------------- the trainer


class Spawn(TypedDict):
    """Before each trainer start's fork, synced: a daemon killed after it finds the start's
    processes by its marker."""

    kind: Literal["spawn"]
    seg: int
    resume: CkptRef | None
    """None: a start from no checkpoint."""
    pivot: bool
    """The start follows a pivot (the trainer starts its bandit fresh)."""
    argv: list[str]
    marker: str
    rollback_from: NotRequired[int]
    """The divergence's or spike's step this start rolls back from."""
    skip_data: NotRequired[list[list[int]]]
    """Every data window skipped so far, [from_step, to_step)."""
    lr_scale: NotRequired[float]
    """Only when not 1.0."""


class TrainerStarted(StartCgroup):
    """The trainer's process was started (in its cgroup, or in the spare)."""

    kind: Literal["trainer_started"]
    pid: int
    seg: int
    marker: str


class Signal(TypedDict):
    """The daemon sent the trainer a signal (core SignalTrainer)."""

    kind: Literal["signal"]
    signal: Literal["SIGTERM", "SIGUSR1", "SIGKILL"]
    pid: int | None
    """None: no trainer process was known; nothing was sent."""
    reason: str


class TrainerStopped(ExitFacts):
    """The trainer exited after a stop the daemon asked for (operator, shutdown, pivot,
    GPU fault)."""

    kind: Literal["trainer_stopped"]
    cause: NotRequired[Literal["pivot", "gpu_fault"]]
    """Absent: the operator's stop or a shutdown."""


class TrainerKilled(ExitFacts):
    """The trainer SIGKILLed for a divergence or a loss spike has exited."""

    kind: Literal["trainer_killed"]
    cause: Literal["divergence", "spike"]


class TrainerFinished(ExitFacts):
    """The trainer exited 0 unasked: the run is finished."""

    kind: Literal["trainer_finished"]
    early: NotRequired[bool]
    """Present (True) when it exited before [trainer] total_steps."""
    total_steps: NotRequired[int]


class TrainerFailedBeforeResume(TypedDict):
    """A start died before any sign it read its checkpoint: the trainer's failure, so the
    checkpoint is not suspected."""

    kind: Literal["trainer_failed_before_resume"]
    step: int
    """The checkpoint it was to resume from."""
    cause: str
    last_line: NotRequired[str]


class Crash(TypedDict):
    """The trainer died unasked (or hung and was stopped), or could not be started."""

    kind: Literal["crash"]
    pid: NotRequired[int]
    """pid, returncode, last_step: absent when the start could not be made."""
    returncode: NotRequired[int]
    last_step: NotRequired[int | None]
    cause: str
    disk_full: NotRequired[bool]
    """Present (True) when the disk had no room as it died."""
    xid: NotRequired[int]
    """A GPU Xid NVML reported before it died."""
    last_line: NotRequired[str]


class Repeated(TypedDict):
    """A fast crash loop's folded cycles: at 1, 2, 4, ... cycles, every REPORT_S, and when
    the fold ends."""

    kind: Literal["repeated"]
    cycles: int
    """Crashes folded since the fold began."""
    counts: dict[str, int]
    """Folded records per kind."""
    since: float
    """Unix time the fold began."""
    ongoing: bool
    last: dict[str, dict[str, Any]]
    """Per kind, the newest folded record: {"t", "kind", **its fields} of a spawn,
    trainer_started, state, crash or restart_scheduled."""


class Stall(TypedDict):
    """The trainer logged no step (nor checkpoint activity) for stall_timeout_s: it is
    stopped as hung."""

    kind: Literal["stall"]
    last_step: int | None
    silent_s: float
    parser_no_match: NotRequired[NoMatchSample]
    """Present when no line of the start matched the parser."""


class NoStepLines(TypedDict):
    """Once a start: SILENT_COMMITS commits in a row with no step line between them."""

    kind: Literal["no_step_lines"]
    commits: int
    checkpoint_step: int
    last_step: int | None
    hint: str


class HangDump(StackDumpFacts):
    """The trainer's stacks were dumped (before a hung trainer is stopped, or on the
    operator's `dump`), or the dump failed."""

    kind: Literal["hang_dump"]


class RestartScheduled(TypedDict):
    """After a crash: the next start waits backoff_s."""

    kind: Literal["restart_scheduled"]
    backoff_s: float
    attempt: int
    disk_full: NotRequired[bool]
    """Present (True): a crash on a full disk, not counted towards the crash loop."""
    resume_step: NotRequired[int | None]
    """The step the restart resumes from (None: from scratch); absent while
    awaiting_verification."""
    awaiting_verification: NotRequired[list[str]]
    """Checkpoints still being verified, any of which may become the resume point."""


class RestartCancelled(TypedDict):
    """The operator's stop came during a backoff or a start waiting on verifications."""

    kind: Literal["restart_cancelled"]


class ResumedAfterSignal(TypedDict):
    """At start-up, after a daemon stopped by a signal (not the operator): the run goes on."""

    kind: Literal["resumed_after_signal"]
    signal: str


class StartFromScratch(TypedDict):
    """The operator's `start --from-scratch` of a run that had verified checkpoints."""

    kind: Literal["start_from_scratch"]
    verified_high: int | None
    """The highest step the run had verified; None: none."""


class StopOutcome(StopFacts):
    """The trainer is stopped after a stop or shutdown: what the stop came to."""

    kind: Literal["stop_outcome"]
    checkpoint_step: int | None
    """The newest verified checkpoint; None: none."""


class Halt(HaltGpuFacts):
    """The run halts for good: diverged, crash_loop, no_checkpoint or gpu_fault."""

    kind: Literal["halt"]
    state: str
    """The phase it halts in: "diverged", "crash_loop", "no_checkpoint", "gpu_fault"."""
    step: NotRequired[int | None]
    """diverged: the first divergent step."""
    resume_step: NotRequired[int | None]
    """diverged again right after resuming from it, past max_fallbacks."""
    max_fallbacks: NotRequired[int]
    restarts_without_progress: NotRequired[int]
    verified_high: NotRequired[int | None]
    reason: NotRequired[str]
    instruction: NotRequired[str]
    cause: NotRequired[Literal["spike"]]


class Idle(TypedDict):
    """At start-up of a run already halted: nothing is started."""

    kind: Literal["idle"]
    state: str
    """The phase it is halted in."""
    reason: str | None


class Containment(TypedDict):
    """At daemon start: whether it is the trainers' subreaper and where their cgroups go."""

    kind: Literal["containment"]
    subreaper: bool
    cgroups: str | None
    """The starts' cgroup base; None: no cgroups here (cgroups_error says why)."""
    subreaper_error: NotRequired[str]
    cgroups_error: NotRequired[str]


class ContainmentFailed(TypedDict):
    """The ended start's leftover processes could not be looked for or stopped."""

    kind: Literal["containment_failed"]
    marker: str
    error: str
    """repr() of the exception."""


class LeftoverTrainer(TypedDict):
    """At daemon start: processes an earlier daemon left running were found; stopping them."""

    kind: Literal["leftover_trainer"]
    pid: int | None
    """The old trainer's main process if trainer.pid names a live one."""
    processes: list[int]
    action: str
    """Always "stopping"."""


class LeftoverTrainerStopped(TypedDict):
    """At daemon start: the leftover processes of leftover_trainer are stopped."""

    kind: Literal["leftover_trainer_stopped"]
    pid: int | None
    processes: list[StoppedProcess]


class LeftoverProcesses(TypedDict):
    """Processes of an ended start still ran after its main process exited; stopped."""

    kind: Literal["leftover_processes"]
    marker: str
    processes: list[StoppedProcess]


class StrayOutput(TypedDict):
    """Lines the run log gained while no start's main process ran (at most one record per
    STRAY_INTERVAL_S)."""

    kind: Literal["stray_output"]
    seg: int
    """The start that had ended."""
    lines: int
    step_lines: int
    """Of those, lines the parser reads as step lines."""
    first: str
    """The first line, clipped to FIRST_LINE_CHARS."""


# ----------------------------------------------------------------------------- checkpoints


class Checkpoint(TypedDict):
    """A committed checkpoint verified and kept."""

    kind: Literal["checkpoint"]
    step: int
    name: str
    bytes: int
    digest: str
    """xxh3-128 of its files at commit; "" if unknown."""


class Progress(TypedDict):
    """A start that had restarted without progress committed past its resume step: the
    crash-loop count is reset."""

    kind: Literal["progress"]
    step: int


class SaveRequested(TypedDict):
    """The operator's save: SIGUSR1 sent."""

    kind: Literal["save_requested"]
    step: int
    """The step the checkpoint must reach to answer it."""
    wait: bool


class AwaitingVerification(AwaitingFor):
    """A start waits for checkpoints still being verified (one may become its resume point)."""

    kind: Literal["awaiting_verification"]
    names: list[str]


class VerificationOverdue(TypedDict):
    """A checkpoint's verification ran past verify_timeout_s (or the Slurm job's deadline):
    given up on, left unverified."""

    kind: Literal["verification_overdue"]
    name: str
    step: int
    waited_s: float


class CheckpointChanged(TypedDict):
    """A committed checkpoint no longer reads as at its commit: quarantined."""

    kind: Literal["checkpoint_changed"]
    step: int
    name: str
    reason: str
    was_verified: bool
    """It was among the run's verified checkpoints."""


class CheckpointUnrecognised(TypedDict):
    """A name in the checkpoint folder the configured format does not read (once per name)."""

    kind: Literal["checkpoint_unrecognised"]
    name: str
    folder: bool
    format: str
    """[checkpoints] format."""
    hint: str


class StrayCheckpoint(TypedDict):
    """A checkpoint committed by an ended start's processes after its main process exited:
    quarantined."""

    kind: Literal["stray_checkpoint"]
    step: int
    name: str


class Fallback(TypedDict):
    """A checkpoint blamed for repeated deaths or divergences right after resuming from it
    is abandoned (quarantined) for the next older one."""

    kind: Literal["fallback"]
    abandoned: int
    """Its step."""
    name: str
    reason: str
    halts: NotRequired[bool]
    """Present (True): the run halts instead of restarting."""
    resume_step: NotRequired[int | None]
    """The step the restart resumes from (None: from scratch); absent while
    awaiting_verification or when it halts."""
    awaiting_verification: NotRequired[list[str]]
    fallbacks: int
    max_fallbacks: int


class Delete(TypedDict):
    """Retention deletes a checkpoint (journaled before its files go)."""

    kind: Literal["delete"]
    step: int
    name: str
    reason: str


class DeleteFailed(FileOpFailure):
    """A checkpoint's files could not be deleted."""

    kind: Literal["delete_failed"]


class Quarantine(TypedDict):
    """A checkpoint is moved to quarantine/ (journaled before the move)."""

    kind: Literal["quarantine"]
    step: int | None
    """None: its step is unknown (a file left at an in-place trainer's fixed name)."""
    name: str
    reason: str
    cause: NotRequired[str]
    """"pivot", "divergence", "rollback", "verification" or "failed"; absent for a fixed
    file's leftover."""
    cause_step: NotRequired[int | None]
    """The pivot's, divergence's or spike's step."""
    moved: NotRequired[list[str]]
    """The paths moved (a fixed file's leftover only)."""


class QuarantineFailed(FileOpFailure):
    """A checkpoint (or a fixed file's leftover) could not be moved to quarantine/."""

    kind: Literal["quarantine_failed"]


class StaleTmpRemoved(TypedDict):
    """At daemon start: leftover .tmp writes in the checkpoint folder were removed."""

    kind: Literal["stale_tmp_removed"]
    names: list[str]


class BootRecovery(TypedDict):
    """At start-up after an unclean daemon exit: where the run resumes and what it loses."""

    kind: Literal["boot_recovery"]
    resume_step: int | None
    """None: no verified checkpoint."""
    last_logged_step: int | None
    steps_lost: int | None
    """None: no step was ever logged."""


# ----------------------------------------------------------------------------- resume audit


class ResumeVerified(ResumeAuditFacts):
    """Every replayed loss of a resumed start matched the one it supersedes."""

    kind: Literal["resume_verified"]


class ResumeDrift(ResumeAuditFacts):
    """A replayed loss of a resumed start differed beyond resume_tolerance."""

    kind: Literal["resume_drift"]


class ResumeUnverified(ResumeAuditFacts):
    """A resumed start ended its audit with no replayed step compared."""

    kind: Literal["resume_unverified"]


# ----------------------------------------------------------------------------- the loss


class Divergence(TypedDict):
    """A logged loss was non-finite or above max_loss: the trainer is killed, what it wrote
    from that step on quarantined."""

    kind: Literal["divergence"]
    step: int
    loss: float | str
    """Non-finite as "nan", "inf", "-inf"."""
    max_loss: float
    count: int
    """Divergences in a row at this point of the run."""
    quarantined: list[int]
    """Steps of the checkpoints quarantined."""
    suspect: NotRequired[int | None]
    """The checkpoint resumed from shortly before, if blamed; absent when caught up."""
    caught_up: NotRequired[bool]
    """Present (True): logged while no daemon ran, found at start-up."""
    halts: NotRequired[bool]
    """Present (True): the run halts in diverged instead of rolling back."""
    rollback_to: NotRequired[int | None]
    """The step the restart resumes from (None: from scratch); absent while
    awaiting_verification or when it halts."""
    awaiting_verification: NotRequired[list[str]]


class Spike(SpikeDetection):
    """A loss spike: the trainer is SIGKILLed and rolled back, or the run halts."""

    kind: Literal["spike"]
    halts: NotRequired[bool]
    """Present (True): the run halts in diverged."""
    rollbacks: NotRequired[int]
    """When it halts for max_rollbacks: the rollbacks within the horizon."""
    rollback_to: NotRequired[None]
    """Present (None) when it halts for want of a checkpoint before the spike."""
    caught_up: NotRequired[bool]
    """Present (True): found at start-up among lines logged while no daemon ran."""


class SpikeOutlier(SpikeFacts):
    """Fewer than spike_patience steps above the threshold, then one below: not acted on."""

    kind: Literal["spike_outlier"]
    steps: int
    """Steps above the threshold."""


class SpikeOutcome(TypedDict):
    """A rollback's watch ended: the loss stayed low past the window, or spiked again."""

    kind: Literal["spike_outcome"]
    first_step: int
    """The rolled-back spike's first step."""
    outcome: Literal["cured", "recurred"]
    step: int
    """cured: the step past the window; recurred: the new spike's first step."""


class Rollback(TypedDict):
    """A spike's rollback: the checkpoint resumed from, what is set aside, the data
    skipped and the learning rate scale from now on."""

    kind: Literal["rollback"]
    spike_step: int
    checkpoint: str | None
    """None: from scratch."""
    step: int | None
    steps_before: int
    """Steps between the checkpoint and the spike's first step."""
    window: list[int] | None
    """The data window added, [from_step, to_step); None: skip_data not supported."""
    skip_data: list[list[int]]
    """Every window skipped from now on."""
    lr_scale: float
    supported: RollbackSupport
    quarantined: list[int]
    rollbacks: int
    """Within the horizon, this one included."""
    max_rollbacks: int
    note: NotRequired[str]
    """What the trainer does not support of what the config asks."""


class ValNan(TypedDict):
    """A validation loss was nan (once per start); training goes on."""

    kind: Literal["val_nan"]
    step: int
    seg: int


class ParserNoMatch(TypedDict):
    """No line of the current start matched the parser for a while after its first line
    (same keys as protocol.ParserNoMatch)."""

    kind: Literal["parser_no_match"]
    parser: str
    """[telemetry] parser."""
    sample: str
    """A recent line it did not match (clipped)."""
    seg: int
    hint: str


# ----------------------------------------------------------------------------- snapshots


class SnapshotTaken(TypedDict):
    """An in-place trainer's fixed file was snapshotted as a checkpoint."""

    kind: Literal["snapshot_taken"]
    fixed: str
    """The fixed file's name."""
    step: int
    name: str
    how: str
    """"reflink" or "copy"."""
    bytes: int


class SnapshotFailed(TypedDict):
    """A snapshot of the fixed file failed."""

    kind: Literal["snapshot_failed"]
    fixed: str
    error: str
    first: bool
    """The first of a run of failures (it alerts)."""


class SnapshotRecovered(TypedDict):
    """A snapshot succeeded after failures."""

    kind: Literal["snapshot_recovered"]
    fixed: str
    failed: int
    """Failures in a row before it."""


class SnapshotRestored(TypedDict):
    """Before a start: the snapshot it resumes from was put at the fixed name."""

    kind: Literal["snapshot_restored"]
    fixed: str
    step: int
    name: str
    how: str
    """"reflink" or "copy"."""


class SnapshotRestoreFailed(TypedDict):
    """The snapshot a start resumes from could not be put at the fixed name: the start is
    refused."""

    kind: Literal["snapshot_restore_failed"]
    name: str
    error: str


class FixedWriteRejected(TypedDict):
    """A write of the fixed file did not verify (or changed while copied): no snapshot."""

    kind: Literal["fixed_write_rejected"]
    fixed: str
    reason: str


# ----------------------------------------------------------------------------- the mirror


class Mirrored(MirrorCopyFacts):
    """A checkpoint was copied to the mirror and verified there."""

    kind: Literal["mirrored"]
    files: int
    bytes: int
    removed: list[int]
    """Mirrored steps now pruned."""


class MirrorFailed(MirrorCopyFacts):
    """A mirror copy failed, or was refused because the checkpoint changed since commit."""

    kind: Literal["mirror_failed"]
    error: str


class MirrorSuperseded(MirrorCopyFacts):
    """A mirror copy waiting its turn was dropped for a newer checkpoint's."""

    kind: Literal["mirror_superseded"]
    superseded_by: int


class MirrorRetracted(TypedDict):
    """The mirror's copy of a quarantined checkpoint was dropped."""

    kind: Literal["mirror_retracted"]
    step: int
    latest: int | None
    """The step latest.json names afterwards; None: no copy is left."""


# ----------------------------------------------------------------------------- the pivot


class Pivot(TypedDict):
    """A pivot completed: the new policy is in place, the old one archived."""

    kind: Literal["pivot"]
    step: int
    """The pivot checkpoint."""
    old_policy: dict[str, Any]
    new_policy: dict[str, Any]
    archive: str
    """The archive folder, relative to the run."""
    zombies: list[str]
    """Arms in the bandit state whose data source is gone."""


class PivotStage(TypedDict):
    """A pivot reached a stage: saving, pin, stopping, archiving, writing_policy."""

    kind: Literal["pivot_stage"]
    stage: Literal["saving", "pin", "stopping", "archiving", "writing_policy"]
    after_step: NotRequired[int]
    """saving: the checkpoint must be at or after this step."""
    new_policy: NotRequired[dict[str, Any]]
    zombies: NotRequired[list[str]]
    step: NotRequired[int]
    """pin, stopping: the pivot checkpoint."""
    archive: NotRequired[str]


# ----------------------------------------------------------------------------- the pivot


class PivotFailed(TypedDict):
    """A pivot stage's file work (archiving, writing policy.json) failed; the run stops."""

    kind: Literal["pivot_failed"]
    stage: str
    """The PivotStage it failed at (core.state.PivotStage; in practice "archiving" or
    "writing_policy", the stages with file work)."""
    error: str


class PivotRolledBack(TypedDict):
    """A pivot was given up before its point of no return; the old policy stays."""

    kind: Literal["pivot_rolled_back"]
    stage: str
    """The PivotStage it had reached ("saving" or "stopping": later stages are completed)."""
    reason: str


class PivotResumed(TypedDict):
    """A new daemon found a pivot past its point of no return in the journal: it completes it."""

    kind: Literal["pivot_resumed"]
    stage: str
    """The PivotStage it resumes at ("archiving" or "writing_policy")."""
    step: int | None
    """The pivot checkpoint's step (None only where it was never committed)."""


# ----------------------------------------------------------------------------- GPUs

# "class" is a keyword: this base can only be spelled in the functional form.
# What NVML reported and how it was classified: gpu, xid (None: the GPU was lost, no XID),
# class (core.gpu_faults.XidClass as str: application, memory, reset, reboot, lost,
# unknown; a second memory error keeps "memory" here though it is handled as reset),
# recovery (the driver's recovery action, where it gave one), message (the driver's, the
# XID's short name, or for a lost GPU NVML's error).
GpuFaultFacts = TypedDict(
    "GpuFaultFacts",
    {
        "gpu": int,
        "xid": int | None,
        "class": str,
        "recovery": str | None,
        "message": str,
    },
)


class GpuFault(GpuFaultFacts):
    """NVML reported a critical XID, or stopped answering for a GPU (lost), and what the
    daemon did about it."""

    kind: Literal["gpu_fault"]
    action: Literal[
        "none: not a GPU of this run",
        "none: already halted",
        "none: already handling a GPU fault",
        "crash_path",
        "restart_allowed_once",
        "stop_and_reset",
        "halt",
    ]


class GpuEvents(TypedDict):
    """The XID watcher is up: which GPUs it watches, and why it cannot watch the others."""

    kind: Literal["gpu_events"]
    watching: list[int]
    without_events: dict[str, str]
    """GPU index (as a string: a JSON key) -> why it has no XID events."""


class ThrottleFacts(TypedDict):
    """A throttle episode as core.gpu_faults.throttle_step reports it (its return type)."""

    reasons: list[str]
    """The alarming NVML throttle reasons seen during the episode."""
    seconds: float
    """How long the clocks have been held down so far."""
    mfu_before: float | None
    """MFU (a fraction of peak) before the episode (None: not known)."""
    mfu: float | None
    """MFU now (None: not known, or the trainer is not stepping)."""
    mfu_drop: float | None
    """mfu_before - mfu (None: either is not known)."""


class GpuThrottle(ThrottleFacts):
    """A GPU's clocks have been held down for heat or a hardware slowdown for [gpu]
    throttle_after_s (once per episode)."""

    kind: Literal["gpu_throttle"]
    gpu: int


class GpuBusy(TypedDict):
    """The wait for a faulted GPU to be free timed out with processes still holding it."""

    kind: Literal["gpu_busy"]
    gpu: int
    pids: list[int]
    waited_s: float


class GpuResetting(TypedDict):
    """The daemon runs `nvidia-smi -r` on a faulted GPU the trainer has left."""

    kind: Literal["gpu_resetting"]
    gpu: int


class GpuReset(TypedDict):
    """The GPU reset finished or failed."""

    kind: Literal["gpu_reset"]
    gpu: int
    ok: bool
    error: str | None
    """Why the reset failed, in words (None: it worked)."""


# ----------------------------------------------------------------------------- the disk


class DiskRoomFacts(TypedDict):
    """Free space against the newest verified checkpoint's size (disk_low and disk_ok carry
    the same fields; which is written depends on inputs.host.disk_low)."""

    free_bytes: int | None
    """Free bytes on the checkpoint disk (None only in disk_ok: the host sample could not
    read it; a disk_low always has it)."""
    checkpoint_bytes: int


class DiskLow(DiskRoomFacts):
    """The next checkpoint may not fit: free space fell below 1.5 x the newest one's size."""

    kind: Literal["disk_low"]


class DiskOk(DiskRoomFacts):
    """Free space is back above 1.5 x the newest checkpoint's size after a disk_low."""

    kind: Literal["disk_ok"]


class DiskFull(TypedDict):
    """One of the daemon's append files (the journal, .loss.json, .eval.json) hit ENOSPC or
    EDQUOT; its lines are held in memory until space returns."""

    kind: Literal["disk_full"]
    file: str
    error: str | None
    """The OSError's strerror (typed str | None by typeshed; set for ENOSPC/EDQUOT)."""


class DiskRecovered(TypedDict):
    """A file that was full is written again."""

    kind: Literal["disk_recovered"]
    file: str
    full_s: float
    """How long it was full (seconds)."""
    lost_records: int
    """Lines of that file dropped past the hold bound: journal records, step lines or
    evaluation lines, by file."""


# ----------------------------------------------------------------------------- the daemon


class DaemonStart(TypedDict):
    """A daemon opened the run's journal (its first record)."""

    kind: Literal["daemon_start"]
    pid: int
    version: str
    previous_exit_clean: bool
    """The journal's last record was a daemon_exit (or there was none)."""


# Matches protocol.SlurmJobRecord field for field (core may not import the protocol);
# shell/views.slurm_record builds it.
class SlurmJob(TypedDict):
    """A daemon started inside a Slurm job: the job and this segment of the run, once
    scontrol has told the time limit."""

    kind: Literal["slurm_job"]
    job_id: str
    name: str | None
    node: str | None
    """SLURMD_NODENAME, else the job's node list, else the host name."""
    partition: str | None
    restart_count: int
    """SLURM_RESTART_COUNT: times Slurm requeued the job."""
    time_limit_s: int | None
    """None: no limit, or not known (see limit_note)."""
    end_time: float | None
    """When Slurm ends the job, epoch seconds (None: not known)."""
    limit_note: str | None
    """Why time_limit_s is None, in words ("unlimited", "unknown: ..."); None when it is set."""
    segment: int
    """1 + the slurm_job records before this one."""
    gap_s: float | None
    """Seconds since the previous segment's last record (None: the first segment)."""
    lost_s: float
    """Seconds between all of the run's segments so far, this gap included."""


class SlurmRequeueRequested(TypedDict):
    """The job's pre-timeout signal came, or its end time is near: the daemon stops the
    trainer to have the job requeued."""

    kind: Literal["slurm_requeue_requested"]
    why: str
    """What asked: the signal's name, or "end_time"."""
    seconds_left: float
    """Until the requeue must be made."""
    scontrol: bool
    """Requeue with `scontrol requeue` (False: exit 75 and leave it to the batch script)."""


class SlurmSaveLate(TypedDict):
    """The job's deadline cut the stop before a requeue short: the save (or its
    verification) was given up."""

    kind: Literal["slurm_save_late"]
    gave_up: str
    """What was given up, in words ("the trainer's save", "verification of NAME")."""
    last_step: int | None
    late_s: float
    """Seconds past the requeue deadline."""


class SlurmRequeue(TypedDict):
    """The daemon's last record before it asks Slurm to requeue the job."""

    kind: Literal["slurm_requeue"]
    job_id: str | None
    """None only where the daemon has no job (not expected: a requeue needs one)."""
    by: str
    """"scontrol" or "the batch script" (exit 75)."""


class SlurmRequeueFailed(TypedDict):
    """`scontrol requeue` refused, after the daemon had closed (a daemon_exit follows)."""

    kind: Literal["slurm_requeue_failed"]
    job_id: str
    error: str


class SlurmNotRequeued(TypedDict):
    """The job is not requeued: the run had ended, halted or was being stopped when the
    request came, or it finished or halted during the stop."""

    kind: Literal["slurm_not_requeued"]
    why: NotRequired[str]
    """What asked for the requeue (the signal's name or "end_time"); absent when the run
    ended during the stop."""
    phase: str
    reason: str | None
    """Why not, in words (the halt reason; None where the run finished with none)."""


class SlurmRunEnded(TypedDict):
    """With exit_when_ended: the run finished or halted, so the daemon ends the job."""

    kind: Literal["slurm_run_ended"]
    phase: str
    reason: str | None
    """The halt reason (None: finished)."""
    code: int
    """The daemon's exit code (core.exit_codes)."""


class SlurmOutputTruncates(TypedDict):
    """The job's output file is opened truncating (--open-mode default): a requeue erases it."""

    kind: Literal["slurm_output_truncates"]
    path: str
    """The output file, or "the job's output file" where /proc does not say."""


class SlurmNotRequeueable(TypedDict):
    """scontrol shows Requeue=0 while [slurm] requeue is on: at its limit the run stops."""

    kind: Literal["slurm_not_requeueable"]
    job_id: str


class SignalIgnored(TypedDict):
    """[slurm] signal arrived at a daemon outside a Slurm job (at most once per
    IGNORED_SIGNAL_S, counting those since)."""

    kind: Literal["signal_ignored"]
    signal: str
    count: int
    reason: str


class DaemonExit(TypedDict):
    """The daemon's last record (written again after a slurm_requeue_failed)."""

    kind: Literal["daemon_exit"]
    code: int | None
    """The exit code the policy decided (None: the loop ended without one, by an exception)."""


class PersistedPivot(TypedDict):
    """core.state.PivotPlan.to_json: a pivot in progress, as a state record persists it."""

    stage: str
    """A core.state.PivotStage."""
    old_policy: dict[str, Any]
    """policy.json's content, whatever the trainer's policy holds."""
    new_policy: dict[str, Any]
    utc: str
    save_after_step: int
    step: int | None
    was_pinned: bool
    zombies: list[str]


class PersistedSpikes(TypedDict):
    """core.spikes.SpikeLog.to_json (its detector is not persisted)."""

    windows: list[list[int]]
    """Every skipped data window, [from_step, to_step)."""
    lr_scale: float
    rollbacks: list[int]
    watch: list[int] | None
    """[first step of the last spike rolled back from, the step by which it is cured]."""
    baselines: list[list[int | float | None]]
    """[step, ema, n, grad_ema] as of each verified checkpoint."""
    passed: int
    rolling_back: list[int] | None
    """[first step of the spike, step rolled back to]."""
    timeline: list[int] | None
    """[first start given the newest windows, earliest step they change]."""


class PersistedState(TypedDict):
    """core.persist.persisted: what of the policy's state a restarted daemon takes up."""

    phase: str
    seg: int
    restarts: int
    restarts_by_cause: dict[str, int]
    """RestartCause -> starts; causes with none left out."""
    restarts_without_progress: int
    next_backoff_s: float | None
    failures: list[list[int]]
    """[checkpoint step, trainer deaths before logging a step past it]."""
    suspects: list[list[int]]
    """[checkpoint step, divergences or deaths soon after resuming from it]."""
    fallbacks: int
    max_commit_gap: int | None
    divergences: int
    divergence_step: int | None
    halt_reason: str | None
    last_pivot_step: int | None
    memory_faults: int
    verified_high: int | None
    resumes_after: str | None
    """The signal that shut the daemon down while the run was live (None: not so)."""
    pinned: list[int]
    digests: dict[str, str]
    """Checkpoint name -> digest, of those verified."""
    pivot: PersistedPivot | None
    spikes: PersistedSpikes
    gpu_fault: str | None
    """The halt reason of the GPU fault being handled (None: none)."""


class State(TypedDict):
    """The policy's persisted state changed (after any event that changed it)."""

    kind: Literal["state"]
    state: PersistedState


class Shutdown(TypedDict):
    """The daemon was asked to shut down: SIGTERM/SIGINT, or a Slurm requeue request."""

    kind: Literal["shutdown"]
    signal: str
    """The signal's name (SIGTERM, SIGINT), or for a requeue request its `why` (the job's
    signal's name, or "end_time")."""


class ConfigChanged(TypedDict):
    """The config file no longer holds what the daemon read (once per daemon)."""

    kind: Literal["config_changed"]
    path: str
    read_at: float
    """When the daemon read it, epoch seconds."""
    notice: str | None
    """The line shown to the operator (None only if the file changed back meanwhile)."""


class ResolvedLinkFacts(TypedDict):
    """A watched path that a link sends elsewhere, as resolved at the daemon's start."""

    configured: str
    resolved: str


class CheckpointDir(ResolvedLinkFacts):
    """The checkpoint directory is a link (or under one): where it resolved at start."""

    kind: Literal["checkpoint_dir"]


class MovedLinkFacts(TypedDict):
    """A watched path that now resolves elsewhere than it did; the daemon keeps watching
    what it resolved at start."""

    configured: str
    was: str
    now: str
    watching: str


class CheckpointDirMoved(MovedLinkFacts):
    """The checkpoint directory's link now points elsewhere."""

    kind: Literal["checkpoint_dir_moved"]


class LogPath(ResolvedLinkFacts):
    """The run log is a link (or under one): where it resolved at start."""

    kind: Literal["log_path"]


class LogPathMoved(MovedLinkFacts):
    """The run log's link now points elsewhere."""

    kind: Literal["log_path_moved"]


class MetricsListening(TypedDict):
    """The /metrics server is up."""

    kind: Literal["metrics_listening"]
    url: str


class MetricsFailed(TypedDict):
    """[metrics] listen could not be bound; the daemon goes on without /metrics."""

    kind: Literal["metrics_failed"]
    listen: str | None
    """[metrics] listen (never None here: the server is started only when it is set)."""
    error: str


class AlertFacts(TypedDict):
    """One alert's delivery to one target."""

    event: str
    """The alert's event (one of core.alerts.EVENTS)."""
    target: str
    """The masked URL, or "command"."""
    attempts: int
    dropped_before: NotRequired[int]
    """Alerts dropped for this target (its queue was full) since the last one journaled."""


class AlertSent(AlertFacts):
    """An alert reached a target."""

    kind: Literal["alert_sent"]


class AlertFailed(AlertFacts):
    """An alert could not be delivered to a target after its retries."""

    kind: Literal["alert_failed"]
    error: str
    """Why, scrubbed of the URLs' secrets."""


class ClientDropped(TypedDict):
    """The daemon hung up on a control client (too slow, too much unsent, idle, evicted)."""

    kind: Literal["client_dropped"]
    uid: int | None
    """The peer's uid (None: not known)."""
    reason: str
    """"overflow", "slow", "no request", "partial request" or "evicted"."""
    queued_bytes: int
    """Bytes queued for it and unsent."""


# ----------------------------------------------------------------------------- the operator


class OperatorArgs(TypedDict, total=False):
    """core.requests.command_args: a command's arguments, by command (save: wait, and
    timeout_s when given; stop, shutdown: force when set; pin, unpin: step; pivot: caps,
    floors; start: from_scratch when set; others none)."""

    wait: bool
    timeout_s: float
    force: bool
    step: int
    caps: dict[str, float | str]
    """Arm -> cap, at most JOURNALED_ITEMS_MAX entries, long names cut; past the bound a
    "...[truncated]" key with a count in words (the str)."""
    floors: dict[str, float | str]
    """As caps."""
    from_scratch: bool


class Operator(TypedDict):
    """An operator's acting command arrived (an unpin's dry run excepted)."""

    kind: Literal["operator"]
    cmd: str
    """The command's wire name (core.requests.NAMES)."""
    args: OperatorArgs
    uid: int | None
    """The client's uid (None: not known)."""


class RequestAbandoned(TypedDict):
    """A waiting request's client hung up: nothing waits on it any more."""

    kind: Literal["request_abandoned"]
    request_id: int
    command: Literal["save", "stop", "start"]
    """The waiter's kind (core.state.Waiter.kind; a shutdown waits as "stop")."""


# ----------------------------------------------------------------------------- all of them

JournalEntry = (
    Spawn
    | TrainerStarted
    | Signal
    | TrainerStopped
    | TrainerKilled
    | TrainerFinished
    | TrainerFailedBeforeResume
    | Crash
    | Repeated
    | Stall
    | NoStepLines
    | HangDump
    | RestartScheduled
    | RestartCancelled
    | ResumedAfterSignal
    | StartFromScratch
    | StopOutcome
    | Halt
    | Idle
    | Containment
    | ContainmentFailed
    | LeftoverTrainer
    | LeftoverTrainerStopped
    | LeftoverProcesses
    | StrayOutput
    | Checkpoint
    | Progress
    | SaveRequested
    | AwaitingVerification
    | VerificationOverdue
    | CheckpointChanged
    | CheckpointUnrecognised
    | StrayCheckpoint
    | Fallback
    | Delete
    | DeleteFailed
    | Quarantine
    | QuarantineFailed
    | StaleTmpRemoved
    | BootRecovery
    | ResumeVerified
    | ResumeDrift
    | ResumeUnverified
    | Divergence
    | Spike
    | SpikeOutlier
    | SpikeOutcome
    | Rollback
    | ValNan
    | ParserNoMatch
    | SnapshotTaken
    | SnapshotFailed
    | SnapshotRecovered
    | SnapshotRestored
    | SnapshotRestoreFailed
    | FixedWriteRejected
    | Mirrored
    | MirrorFailed
    | MirrorSuperseded
    | MirrorRetracted
    | Pivot
    | PivotStage
    | PivotFailed
    | PivotRolledBack
    | PivotResumed
    | GpuFault
    | GpuEvents
    | GpuThrottle
    | GpuBusy
    | GpuResetting
    | GpuReset
    | DiskLow
    | DiskOk
    | DiskFull
    | DiskRecovered
    | DaemonStart
    | SlurmJob
    | SlurmRequeueRequested
    | SlurmSaveLate
    | SlurmRequeue
    | SlurmRequeueFailed
    | SlurmNotRequeued
    | SlurmRunEnded
    | SlurmOutputTruncates
    | SlurmNotRequeueable
    | SignalIgnored
    | DaemonExit
    | State
    | Shutdown
    | ConfigChanged
    | CheckpointDir
    | CheckpointDirMoved
    | LogPath
    | LogPathMoved
    | MetricsListening
    | MetricsFailed
    | AlertSent
    | AlertFailed
    | ClientDropped
    | Operator
    | RequestAbandoned
)
"""Any record the daemon writes, less the journal's own `ts` and `t`."""


@cache
def record_classes() -> dict[str, type]:
    """Each kind's class, by kind (resolved on first use: the daemon never needs it)."""
    classes: dict[str, type] = {}
    for cls in get_args(JournalEntry):
        (kind,) = get_args(get_type_hints(cls)["kind"])
        classes[kind] = cls
    return classes
