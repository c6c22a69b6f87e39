"""What the policy is told: one dataclass per thing that happened, each with its time `t`
(time.monotonic() of the daemon that saw it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from trainwarden.supervisor.core.requests import Command, PivotContext


class Outcome(StrEnum):
    """What verifying one committed checkpoint found."""

    VERIFIED = "verified"
    INVALID = "invalid"
    """Present but unusable (corrupt, truncated, a link, not a file): quarantined."""
    VANISHED = "vanished"
    """Gone before it could be verified (its writer or retention removed it)."""


@dataclass(frozen=True)
class Scanned:
    """One checkpoint found in the checkpoint directory at start-up, and its verdict."""

    name: str
    step: int | None
    outcome: Outcome
    reason: str = ""
    bytes: int = 0
    mtime: float = 0.0
    digest: str = ""


@dataclass(frozen=True)
class Restored:
    """The daemon read its journal: the previous daemon's state and the config's pins."""

    t: float
    persisted: dict[str, Any] | None = None
    """The newest `state` record (None: a new run)."""
    pins: frozenset[int] = frozenset()
    """[checkpoints] pinned of the config."""


@dataclass(frozen=True)
class Startup:
    """The daemon has restored its state and scanned the checkpoint directory."""

    t: float
    last_logged_step: int | None = None
    unclean: bool = False
    """The previous daemon did not shut down cleanly (power cut, SIGKILL)."""
    scanned: tuple[Scanned, ...] = ()
    """The checkpoint directory's committed checkpoints, oldest first, each verified."""
    refused: tuple[tuple[str, str, str, int | None], ...] = ()
    """Checkpoints the journal's newest verdict quarantined (name, reason, cause, the
    cause's step): one still in the folder (its move failed) is refused again, never
    counted."""
    diverged: tuple[int, float] | None = None
    """The first non-finite or too high loss (step, loss) among the lines the previous
    daemon's trainer logged after that daemon died (read now, so never decided on)."""


@dataclass(frozen=True)
class CheckpointSeen:
    """The watcher saw `name` committed (or a committed one written to): its verification
    has started. Every verification ends in one of the events below."""

    t: float
    name: str
    step: int


@dataclass(frozen=True)
class CheckpointCommitted:
    """A committed checkpoint verified: its step, size, mtime and digest at commit."""

    t: float
    step: int
    name: str
    bytes: int
    mtime: float = 0.0
    digest: str = ""


@dataclass(frozen=True)
class CheckpointRejected:
    """A committed checkpoint failed verification, or its step could not be read: why."""

    t: float
    step: int | None
    name: str
    reason: str


@dataclass(frozen=True)
class CheckpointVanished:
    """A committed checkpoint was gone before it could be verified."""

    t: float
    step: int | None
    name: str


@dataclass(frozen=True)
class CheckpointChanged:
    """A committed checkpoint's files no longer match the digest taken at its commit
    (rewritten in place, truncated, replaced), found by a recheck or before a resume."""

    t: float
    step: int
    name: str
    reason: str


@dataclass(frozen=True)
class CheckpointUnchanged:
    """A committed checkpoint was written to again and reads as it did at its commit."""

    t: float
    name: str


@dataclass(frozen=True)
class ResumeRefused:
    """The checkpoint a Spawn named failed its digest check before the start: no trainer
    was started."""

    t: float
    step: int
    name: str
    reason: str


@dataclass(frozen=True)
class FixedFileLeftover:
    """A start from no checkpoint found a file left at an in-place trainer's fixed name
    (`[checkpoints] fixed`; one that never verified, or it would have a snapshot to resume
    from): no trainer was started, and the file is as it was."""

    t: float
    name: str
    """The fixed name, in the checkpoint directory."""


@dataclass(frozen=True)
class CheckpointWriting:
    """A checkpoint .tmp file grew: the trainer is busy saving, not hung."""

    t: float


@dataclass(frozen=True)
class StepLogged:
    """The trainer logged a step line: its step, loss and grad norm if it gave one."""

    t: float
    step: int
    loss: float
    grad_norm: float | None = None
    """The step line's `grad_norm` extra, when it has one."""


@dataclass(frozen=True)
class ParserNoMatch:
    """No line of trainer start `seg` has matched the configured parser for a while since
    its first line (see shell.parser_watch); a step line of that start ends it."""

    t: float
    seg: int
    parser: str
    sample: str
    """A line it did not match."""


@dataclass(frozen=True)
class TrainerSpawned:
    """The trainer asked for by a Spawn is running, with this pid."""

    t: float
    pid: int


@dataclass(frozen=True)
class SpawnFailed:
    """The trainer could not be started (its program missing or not executable, an in-place
    checkpoint not restorable): why."""

    t: float
    error: str


@dataclass(frozen=True)
class TrainerExited:
    """The trainer's main process exited: its status, and whether its other processes are gone."""

    t: float
    pid: int
    returncode: int
    """Negative: killed by that signal (as subprocess reports it)."""
    signal_name: str | None = None
    """That signal's name (SIGKILL), when the returncode is negative and names one."""
    contained: bool = True
    """False: other processes of the start may still run (and commit); a StartContained
    follows once they are gone."""
    read_resume: bool = False
    """Evidence that the start read the checkpoint it was given (it opened it, or printed
    its name): only then can a death before its first step be held against it."""
    last_line: str | None = None
    """The start's newest non-blank output line (clipped): what a crash says of itself."""
    disk_full: bool = False
    """The disk had no room when it died (its last line says so, the daemon's own writes
    failed, or the checkpoint folder's free space is below the next checkpoint's size)."""


@dataclass(frozen=True)
class StacksDumped:
    """A hung trainer's stacks were dumped (or the dump failed: the shell journaled why)."""

    t: float
    pid: int


@dataclass(frozen=True)
class StartContained:
    """Every process of the start whose main process exited is gone (see shell.containment)."""

    t: float


@dataclass(frozen=True)
class Tick:
    """A deadline the policy set has come (a backoff ends, a stop's grace runs out, a stall)."""

    t: float


@dataclass(frozen=True)
class Operator:
    """An operator's command from the control socket, with what the daemon read for it."""

    t: float
    request_id: int
    command: Command
    uid: int | None = None
    pivot: PivotContext | None = None
    """For a Pivot command: what the run's files said when it was asked for."""
    handles: frozenset[str] | None = None
    """Of SIGTERM and SIGUSR1, those the trainer's signal target catches, read from
    /proc just before (None: unknown, or no trainer)."""


@dataclass(frozen=True)
class RequestAbandoned:
    """The client of a request still waiting for its reply has gone."""

    t: float
    request_id: int


@dataclass(frozen=True)
class ShutdownRequested:
    """SIGTERM or SIGINT to the daemon (what systemd sends)."""

    t: float
    signal: str = "SIGTERM"


@dataclass(frozen=True)
class RequeueRequested:
    """Time to leave the Slurm job before its limit: its pre-timeout signal came, or its
    end time is near (see core.requeue)."""

    t: float
    why: str
    """What asked: the signal's name (SIGUSR1) or "end_time"."""
    by: float
    """time.monotonic() by which the job must be requeued: Slurm ends it soon after."""
    scontrol: bool = True
    """Requeue with `scontrol requeue`; False: exit 75 and leave it to the batch script."""


@dataclass(frozen=True)
class PivotProgress:
    """The executor finished (or failed) a pivot stage's file work."""

    t: float
    done: Literal["archived", "policy_written"]
    error: str | None = None


@dataclass(frozen=True)
class MirrorPointer:
    """The step the mirror's latest.json names (None: no readable pointer), read at start."""

    t: float
    step: int | None


@dataclass(frozen=True)
class MirrorCopied:
    """A mirror copy ended: copied and verified, superseded by a newer one, or failed."""

    t: float
    step: int
    ok: bool
    seconds: float = 0.0
    """How long the copy took, rounded to the millisecond."""
    files: int = 0
    bytes: int = 0
    """What a copy that succeeded wrote."""
    error: str = ""
    """Why a copy failed or was refused."""
    superseded_by: int | None = None
    """The newer checkpoint whose copy this one gave way to, without copying."""
    mirrored: tuple[int, ...] = ()
    """Steps with a complete copy in the mirror afterwards, oldest first."""
    changed: bool = False
    """The copy was refused: the checkpoint no longer matches its digest."""
    name: str = ""


@dataclass(frozen=True)
class GpuFault:
    """NVML reported a critical XID on GPU `gpu` (see core.gpu_faults for the classes)."""

    t: float
    gpu: int
    xid: int
    recovery: str | None = None
    """The driver's recovery action ("gpu_reset", "node_reboot", ...), where it gives one."""
    message: str = ""


@dataclass(frozen=True)
class GpuLost:
    """NVML calls on GPU `gpu` fail after they used to work (GpuIsLost: the GPU vanished)."""

    t: float
    gpu: int
    error: str


@dataclass(frozen=True)
class GpuIdle:
    """The wait for GPU `gpu` to be free ended: `holders` still held it when it timed out."""

    t: float
    gpu: int
    holders: tuple[int, ...] = ()
    waited_s: float = 0.0


@dataclass(frozen=True)
class GpuResetDone:
    """The GPU reset the policy asked for has finished, or failed: why."""

    t: float
    gpu: int
    ok: bool
    error: str | None = None


Event = (
    Restored
    | Startup
    | CheckpointSeen
    | CheckpointCommitted
    | CheckpointRejected
    | CheckpointVanished
    | CheckpointChanged
    | CheckpointUnchanged
    | ResumeRefused
    | FixedFileLeftover
    | CheckpointWriting
    | StepLogged
    | ParserNoMatch
    | TrainerSpawned
    | SpawnFailed
    | TrainerExited
    | StacksDumped
    | StartContained
    | Tick
    | Operator
    | RequestAbandoned
    | ShutdownRequested
    | RequeueRequested
    | PivotProgress
    | MirrorPointer
    | MirrorCopied
    | GpuFault
    | GpuLost
    | GpuIdle
    | GpuResetDone
)


def checkpoint_event(
    t: float,
    name: str,
    step: int | None,
    outcome: Outcome,
    reason: str = "",
    bytes: int = 0,
    mtime: float = 0.0,
    digest: str = "",
) -> CheckpointCommitted | CheckpointRejected | CheckpointVanished:
    """The event for one checkpoint the watcher saw committed, by its verdict."""
    if outcome is Outcome.VANISHED:
        return CheckpointVanished(t, step, name)
    if outcome is Outcome.INVALID or step is None:
        return CheckpointRejected(t, step, name, reason)
    return CheckpointCommitted(t, step, name, bytes, mtime, digest)
