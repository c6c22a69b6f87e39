"""The pure policy: every decision the daemon makes, as decide(state, event) -> (state, actions).

No clocks, files, processes or signals in here: time arrives as `event.t`, the outside
world arrives as events, and what should happen leaves as actions for the executor.
That is what lets the retention and restart rules be checked by property tests. This
package imports only the standard library and itself.

    phases      the run's phases and their transition diagram
    state       Rules, State and what of it survives a daemon restart
    requests    the operator's commands, typed, and their parser
    events      what the policy is told
    actions     what it asks for
    transitions spawning, stopping, answering waiters (shared by the handlers below)
    retention   which checkpoints go, locally and in the mirror
    lifecycle   start-up, spawn and exit, crash and backoff, ticks, shutdown
    progress    checkpoints, step lines, divergence
    commands    the operator's commands
    pivot       the pivot transaction
    decide      the dispatch, and the next deadline
"""

from trainwarden.supervisor.core.actions import (
    Action,
    Archive,
    Delete,
    Exit,
    MirrorCopy,
    PruneMirror,
    Quarantine,
    ReadMirrorPointer,
    Record,
    Reply,
    SignalTrainer,
    Spawn,
    WritePolicy,
)
from trainwarden.supervisor.core.decide import deadline, decide
from trainwarden.supervisor.core.events import (
    CheckpointCommitted,
    CheckpointRejected,
    CheckpointVanished,
    CheckpointWriting,
    Event,
    MirrorCopied,
    MirrorPointer,
    Operator,
    Outcome,
    PivotProgress,
    Restored,
    Scanned,
    ShutdownRequested,
    SpawnFailed,
    Startup,
    StepLogged,
    Tick,
    TrainerExited,
    TrainerSpawned,
    checkpoint_event,
)
from trainwarden.supervisor.core.phases import HALTED, TRAINER_UP, Phase
from trainwarden.supervisor.core.progress import is_divergent
from trainwarden.supervisor.core.requests import (
    ACTING,
    BadRequest,
    Command,
    Pin,
    Pivot,
    PivotContext,
    Save,
    Shutdown,
    Start,
    Stop,
    Unpin,
    command_args,
    command_name,
    parse_command,
)
from trainwarden.supervisor.core.retention import (
    mirror_deletions,
    next_to_delete,
    retention_deletions,
)
from trainwarden.supervisor.core.state import (
    Ckpt,
    PivotPlan,
    Rules,
    State,
    StopReason,
    Waiter,
    ckpt_json,
    failures_of,
    persisted,
    restore,
)
from trainwarden.supervisor.core.transitions import describe_exit

__all__ = [
    "ACTING",
    "HALTED",
    "TRAINER_UP",
    "Action",
    "Archive",
    "BadRequest",
    "CheckpointCommitted",
    "CheckpointRejected",
    "CheckpointVanished",
    "CheckpointWriting",
    "Ckpt",
    "Command",
    "Delete",
    "Event",
    "Exit",
    "MirrorCopied",
    "MirrorCopy",
    "MirrorPointer",
    "Operator",
    "Outcome",
    "Phase",
    "Pin",
    "Pivot",
    "PivotContext",
    "PivotPlan",
    "PivotProgress",
    "PruneMirror",
    "Quarantine",
    "ReadMirrorPointer",
    "Record",
    "Reply",
    "Restored",
    "Rules",
    "Save",
    "Scanned",
    "Shutdown",
    "ShutdownRequested",
    "SignalTrainer",
    "Spawn",
    "SpawnFailed",
    "Start",
    "Startup",
    "State",
    "StepLogged",
    "Stop",
    "StopReason",
    "Tick",
    "TrainerExited",
    "TrainerSpawned",
    "Unpin",
    "Waiter",
    "WritePolicy",
    "checkpoint_event",
    "ckpt_json",
    "command_args",
    "command_name",
    "deadline",
    "decide",
    "describe_exit",
    "failures_of",
    "is_divergent",
    "mirror_deletions",
    "next_to_delete",
    "parse_command",
    "persisted",
    "restore",
    "retention_deletions",
]
