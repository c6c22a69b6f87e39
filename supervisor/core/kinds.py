"""The daemon's vocabularies: journal record kinds, loss chart marker kinds, error codes.

Each is spelled here once, and the daemon, the CLI and the TUI take it from here (the
protocol re-exports it, as it does the phases). Journal kinds and error codes are each a
`Literal` that lists every name, and a collection derived from it: the Literal is a type
(mypy holds each `Record(...)` of the policy to JournalKind, each error body of the
protocol to ErrorCode), the collection is what tests/test_kinds.py holds the daemon's
sources to, both ways (every kind the daemon journals is here and every kind here is
journaled somewhere; every code it answers is here and every code here is answered).

Names that other code matches on are members of a `StrEnum`, as the phases are: a member
is its string (it compares, hashes and formats as the plain word), so a record read off
the wire matches `Kind.CRASH` with no conversion, and the class says which vocabulary a
word belongs to where two share a spelling (the journal's `crash` record and the chart's
`crash` marker). `Kind` names only the journal kinds some code compares against (a test
checks each is registered); the chart matches on every marker kind, so `MarkerKind` is
the whole vocabulary, as `Phase` is. No client compares error codes yet: they have no
names.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal, get_args

# ----------------------------------------------------------------------------- journal

JournalKind = Literal[
    # The trainer: its starts, how each ended, what the daemon did next.
    "spawn",
    "trainer_started",
    "signal",
    "trainer_stopped",
    "trainer_killed",
    "trainer_finished",
    "trainer_failed_before_resume",
    "crash",
    "repeated",
    "stall",
    "no_step_lines",
    "hang_dump",
    "restart_scheduled",
    "restart_cancelled",
    "resumed_after_signal",
    "start_from_scratch",
    "stop_outcome",
    "halt",
    "idle",
    "containment",
    "containment_failed",
    "leftover_trainer",
    "leftover_trainer_stopped",
    "leftover_processes",
    "stray_output",
    # Checkpoints: commits, verification, retention, quarantine.
    "checkpoint",
    "progress",
    "save_requested",
    "awaiting_verification",
    "verification_overdue",
    "checkpoint_changed",
    "checkpoint_unrecognised",
    "stray_checkpoint",
    "fallback",
    "delete",
    "delete_failed",
    "quarantine",
    "quarantine_failed",
    "stale_tmp_removed",
    "boot_recovery",
    # A resumed trainer's replayed losses against the ones they supersede.
    "resume_verified",
    "resume_drift",
    "resume_unverified",
    # The loss: divergence, spikes and their rollbacks, evaluations, the parser.
    "divergence",
    "spike",
    "spike_outlier",
    "spike_outcome",
    "rollback",
    "val_nan",
    "parser_no_match",
    # An in-place trainer's fixed file, snapshotted and restored.
    "snapshot_taken",
    "snapshot_failed",
    "snapshot_recovered",
    "snapshot_restored",
    "snapshot_restore_failed",
    "fixed_write_rejected",
    # The mirror.
    "mirrored",
    "mirror_failed",
    "mirror_superseded",
    "mirror_retracted",
    # The pivot transaction.
    "pivot",
    "pivot_stage",
    "pivot_failed",
    "pivot_rolled_back",
    "pivot_resumed",
    # GPUs.
    "gpu_fault",
    "gpu_events",
    "gpu_throttle",
    "gpu_busy",
    "gpu_resetting",
    "gpu_reset",
    # The disk.
    "disk_low",
    "disk_ok",
    "disk_full",
    "disk_recovered",
    # The daemon, its files and its clients.
    "daemon_start",
    "slurm_job",
    "slurm_requeue_requested",
    "slurm_save_late",
    "slurm_requeue",
    "slurm_requeue_failed",
    "slurm_not_requeued",
    "slurm_run_ended",
    "slurm_output_truncates",
    "slurm_not_requeueable",
    "signal_ignored",
    "daemon_exit",
    "state",
    "shutdown",
    "config_changed",
    "checkpoint_dir",
    "checkpoint_dir_moved",
    "log_path",
    "log_path_moved",
    "metrics_listening",
    "metrics_failed",
    "alert_sent",
    "alert_failed",
    "client_dropped",
    # The operator's commands.
    "operator",
    "request_abandoned",
]
JOURNAL_KINDS: Final[frozenset[JournalKind]] = frozenset(get_args(JournalKind))
"""Every kind of journal record the daemon writes (`trainwarden events` lists them all)."""


class Kind(StrEnum):
    """The journal kinds the TUI matches on, by name."""

    SPAWN = "spawn"
    TRAINER_STARTED = "trainer_started"
    SIGNAL = "signal"
    TRAINER_STOPPED = "trainer_stopped"
    TRAINER_KILLED = "trainer_killed"
    TRAINER_FINISHED = "trainer_finished"
    CRASH = "crash"
    REPEATED = "repeated"
    """A fast crash loop's folded cycles: how many of each kind, since when."""
    STALL = "stall"
    HANG_DUMP = "hang_dump"
    RESTART_SCHEDULED = "restart_scheduled"
    STOP_OUTCOME = "stop_outcome"
    HALT = "halt"
    CONTAINMENT_FAILED = "containment_failed"
    LEFTOVER_TRAINER = "leftover_trainer"
    LEFTOVER_PROCESSES = "leftover_processes"
    STRAY_OUTPUT = "stray_output"
    CHECKPOINT = "checkpoint"
    AWAITING_VERIFICATION = "awaiting_verification"
    VERIFICATION_OVERDUE = "verification_overdue"
    CHECKPOINT_CHANGED = "checkpoint_changed"
    CHECKPOINT_UNRECOGNISED = "checkpoint_unrecognised"
    STRAY_CHECKPOINT = "stray_checkpoint"
    FALLBACK = "fallback"
    DELETE = "delete"
    QUARANTINE = "quarantine"
    QUARANTINE_FAILED = "quarantine_failed"
    BOOT_RECOVERY = "boot_recovery"
    RESUME_VERIFIED = "resume_verified"
    RESUME_DRIFT = "resume_drift"
    DIVERGENCE = "divergence"
    SPIKE = "spike"
    SPIKE_OUTLIER = "spike_outlier"
    SPIKE_OUTCOME = "spike_outcome"
    ROLLBACK = "rollback"
    PARSER_NO_MATCH = "parser_no_match"
    PIVOT = "pivot"
    PIVOT_STAGE = "pivot_stage"
    PIVOT_FAILED = "pivot_failed"
    PIVOT_ROLLED_BACK = "pivot_rolled_back"
    PIVOT_RESUMED = "pivot_resumed"
    GPU_FAULT = "gpu_fault"
    GPU_THROTTLE = "gpu_throttle"
    GPU_BUSY = "gpu_busy"
    DISK_LOW = "disk_low"
    DISK_OK = "disk_ok"
    DISK_FULL = "disk_full"
    DISK_RECOVERED = "disk_recovered"
    DAEMON_START = "daemon_start"
    SLURM_JOB = "slurm_job"
    """The Slurm job the daemon runs in: id, name, node, restart count, time limit."""
    STATE = "state"
    CHECKPOINT_DIR_MOVED = "checkpoint_dir_moved"


# ----------------------------------------------------------------------------- markers


class MarkerKind(StrEnum):
    """What a loss chart marker (a history reply's `markers`) stands for, at its step."""

    RESTART = "restart"
    """A trainer start after the run's first, at the step it resumed from."""
    DIVERGENCE = "divergence"
    """A non-finite or too high loss, at its step."""
    PIVOT = "pivot"
    """A pivot, at the checkpoint the new policy starts from."""
    CRASH = "crash"
    """A trainer crash, at its last logged step."""
    SPIKE = "spike"
    """A loss spike rolled back from, at its first step."""
    SKIP = "skip"
    """A rollback's skipped data window, at its first step."""


MARKER_KINDS: Final[tuple[MarkerKind, ...]] = tuple(MarkerKind)
"""Every marker kind the history reply's markers may have."""

# ----------------------------------------------------------------------------- error codes

ErrorCode = Literal[
    "bad_request",
    "unknown_command",
    "bad_argument",
    "wrong_state",
    "busy",
    "timeout",
    "forbidden",
    "too_large",
    "unsupported",
    "superseded",
    "abandoned",
    "internal",
    "not_a_run",
    "no_checkpoint",
]
ERROR_CODES: Final[tuple[ErrorCode, ...]] = get_args(ErrorCode)
"""bad_request: not a request at all (bad JSON, no 'cmd', a bad 'id');
unknown_command; bad_argument: a known command with an unusable argument;
wrong_state: not possible in the run's current phase; busy: another operator command is
in progress, or too many connections; timeout: no checkpoint came in time;
forbidden: a peer uid not in [control] allow_uids; too_large: a line over MAX_LINE;
unsupported: the trainer does not catch the signal the command sends (save without a
SIGUSR1 handler; stop or shutdown without a SIGTERM handler, unless `force`);
superseded: a waiting save answered by a stop or shutdown that pre-empted it;
abandoned: the client hung up before its acting command was answered (the daemon stops
waiting for the policy's answer; no client is left to read this reply);
internal: the daemon failed (its log says why); not_a_run: history_of named a path that
is no run directory; no_checkpoint: a start of a run that had verified checkpoints and has
none left (`from_scratch` starts over at step 0)."""
