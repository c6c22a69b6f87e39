"""What the policy asks the executor to do: one dataclass per kind of effect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from trainwarden.supervisor.core.kinds import ErrorCode, JournalKind
from trainwarden.supervisor.core.state import Ckpt

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import JournalEntry


@dataclass(frozen=True)
class Spawn:
    seg: int
    resume: Ckpt | None
    pivot: bool = False
    rollback_from: int | None = None
    """The step of the divergence (or spike) this start rolls back from, if it is that start."""
    skip_data: tuple[tuple[int, int], ...] = ()
    """Every data window skipped so far ([from_step, to_step)), for TRAINWARDEN_SKIP_DATA."""
    lr_scale: float = 1.0
    """For TRAINWARDEN_LR_SCALE (1.0: not set)."""
    timeline: tuple[int, int] | None = None
    """(first seg, from_step) of the data timeline this start belongs to: since the newest
    skip window was added, the starts from `first seg` on consume other data from
    `from_step` on than every earlier start did. The resume audit compares a replayed step
    only with a loss of the same timeline (None: no window was ever added)."""
    leftover: Quarantine | None = None
    """For a start from no checkpoint (`resume` None) of an in-place trainer: the file left
    at its fixed name is moved to quarantine/ first, as this says (the policy's answer to
    FixedFileLeftover). None: a file found there is reported, and nothing is started."""


@dataclass(frozen=True)
class SignalTrainer:
    signal: Literal["SIGTERM", "SIGUSR1", "SIGKILL"]
    reason: str


@dataclass(frozen=True)
class DumpStacks:
    """Capture the trainer's stacks (every process of its tree) before it is stopped;
    reported as StacksDumped."""

    pid: int
    step: int | None
    """The last step it logged, for the dump's name."""
    timeout_s: float


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
    retract_mirror: bool = True
    """Also drop the mirror's copy of this step (it must never offer poisoned weights)."""
    cause: str = "failed"
    """What kind of reason, for the reader: "pivot" (set aside, written under the old
    policy), "divergence" (rolled back past), "rollback" (the timeline a loss spike's
    rollback abandoned), "verification" (failed it), "failed" (any other fault)."""
    cause_step: int | None = None
    """The pivot's or the divergence's step."""


@dataclass(frozen=True)
class Record:
    """A journal entry that is only a record (the decision itself, a warning): its kind
    and fields as one of core.records' TypedDicts, checked where it is made."""

    entry: JournalEntry

    @property
    def kind(self) -> JournalKind:
        return self.entry["kind"]

    @property
    def fields(self) -> dict[str, Any]:
        """The entry less its kind."""
        return {key: value for key, value in self.entry.items() if key != "kind"}


@dataclass(frozen=True)
class Reply:
    request_id: int
    ok: bool
    result: dict[str, Any] | None = None
    code: ErrorCode | None = None
    """Why the request was refused (None: an ok reply)."""
    message: str = ""


@dataclass(frozen=True)
class Progress:
    """A line for the client of a request still in progress (a stop's steps)."""

    request_id: int
    message: str


@dataclass(frozen=True)
class Exit:
    """End the daemon with this status (core.exit_codes.ExitCode: docs/exit-codes.md)."""

    code: int = 0


@dataclass(frozen=True)
class Requeue:
    """Have the Slurm job this daemon runs in queued again (`scontrol requeue`) as the
    daemon's last act, after its exit record (`slurm_requeue` just before it says so).
    `scontrol` False: the requeue is left to the batch script."""

    scontrol: bool = True


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


@dataclass(frozen=True)
class ReadMirrorPointer:
    """Read the step the mirror's latest.json names; reported as MirrorPointer."""


@dataclass(frozen=True)
class MirrorCopy:
    """Copy this checkpoint (and its companions) to the mirror; reported as MirrorCopied."""

    ckpt: Ckpt


@dataclass(frozen=True)
class PruneMirror:
    """Remove these steps' copies from the mirror."""

    steps: tuple[int, ...]


@dataclass(frozen=True)
class AwaitGpuIdle:
    """Wait until no process holds GPU `gpu` (at most `timeout_s`); reported as GpuIdle."""

    gpu: int
    timeout_s: float


@dataclass(frozen=True)
class ResetGpu:
    """Reset GPU `gpu` (nvidia-smi -r); reported as GpuResetDone."""

    gpu: int


Action = (
    Spawn
    | SignalTrainer
    | DumpStacks
    | Delete
    | Quarantine
    | Record
    | Reply
    | Progress
    | Exit
    | Requeue
    | Archive
    | WritePolicy
    | ReadMirrorPointer
    | MirrorCopy
    | PruneMirror
    | AwaitGpuIdle
    | ResetGpu
)
