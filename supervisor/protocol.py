"""The control protocol as code: every message, command, topic, error code and phase.

Unix stream socket, newline-delimited JSON, one object per line, at most MAX_LINE bytes.

    request   {"id": 7, "cmd": "save", ...args}                        Request
    progress  {"id": 7, "progress": "sent SIGTERM to pid 42"}          ProgressLine
    reply     {"id": 7, "ok": true, "result": {...}}                   OkReply
              {"id": 7, "ok": false, "error": {"code", "message"}}     ErrorReply
    push      {"topic": "telemetry", "data": {...}}  (after subscribe) Push

Each command's result is a TypedDict below (RESULTS maps the command to it); each
topic's push data likewise (TOPIC_DATA). These types describe what the daemon sends
today (a test holds them to a live daemon's replies); a client still checks what it
reads, since a socket may be forwarded from a daemon of another version.

Who imports what: the daemon (serve/, shell/), the CLI (cli/) and the TUI (trainwarden.tui)
all take the protocol from this one module and never spell a topic, an error code, a
phase, a journal record's kind or a marker's kind themselves. It re-exports the framing
(wire.py: MAX_LINE, encode, decode, connect_path), the clients (client.py: Client,
AsyncClient, unreachable, not_running_message), the phases (core/phases.py: Phase,
HALTED, TRAINER_UP) and the vocabularies (core/kinds.py: JournalKind, Kind, MarkerKind,
ErrorCode and their lists), and imports nothing else of the daemon: no store, no shell,
no config, no torch.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal, NotRequired, TypedDict, get_args

# Re-exported (the `as` says so): every party imports the protocol from this one module.
from trainwarden.supervisor import PROTOCOL_VERSION as PROTOCOL_VERSION
from trainwarden.supervisor.client import AsyncClient as AsyncClient
from trainwarden.supervisor.client import Client as Client
from trainwarden.supervisor.client import not_running_message as not_running_message
from trainwarden.supervisor.client import result_of as result_of
from trainwarden.supervisor.client import unreachable as unreachable
from trainwarden.supervisor.contract import MAX_STEP
from trainwarden.supervisor.core.kinds import ERROR_CODES as ERROR_CODES
from trainwarden.supervisor.core.kinds import JOURNAL_KINDS as JOURNAL_KINDS
from trainwarden.supervisor.core.kinds import MARKER_KINDS as MARKER_KINDS
from trainwarden.supervisor.core.kinds import ErrorCode as ErrorCode
from trainwarden.supervisor.core.kinds import JournalKind as JournalKind
from trainwarden.supervisor.core.kinds import Kind as Kind
from trainwarden.supervisor.core.kinds import MarkerKind as MarkerKind
from trainwarden.supervisor.core.phases import HALTED as HALTED
from trainwarden.supervisor.core.phases import STEPPING as STEPPING
from trainwarden.supervisor.core.phases import TRAINER_UP as TRAINER_UP
from trainwarden.supervisor.core.phases import Phase as Phase
from trainwarden.supervisor.core.shapes import BranchAncestor as BranchAncestor
from trainwarden.supervisor.core.shapes import HistoryBuckets as HistoryBuckets
from trainwarden.supervisor.core.shapes import HistoryOfResult as HistoryOfResult
from trainwarden.supervisor.core.shapes import RelatedRun as RelatedRun
from trainwarden.supervisor.core.shapes import ResumeAuditFacts as AuditResult
from trainwarden.supervisor.core.shapes import ValidationSeries as ValidationSeries
from trainwarden.supervisor.wire import MAX_LINE as MAX_LINE
from trainwarden.supervisor.wire import connect_path as connect_path
from trainwarden.supervisor.wire import decode as decode
from trainwarden.supervisor.wire import encode as encode

# ----------------------------------------------------------------------------- names

Topic = Literal["telemetry", "gpu", "host", "checkpoints", "events", "bandit", "samples", "state"]
TOPICS: Final[tuple[Topic, ...]] = get_args(Topic)
"""Every topic, in the order a full subscribe lists them."""
REPLACEABLE_TOPICS: Final[frozenset[Topic]] = frozenset(
    {"telemetry", "gpu", "host", "checkpoints", "bandit", "samples", "state"}
)
"""Topics whose newer push supersedes an older one: each carries the whole current value
(a checkpoints push is the full list), so a slow reader may skip to the newest. Only
`events` is a stream (one journal record per push) and must arrive whole and in order."""

ReadCommand = Literal[
    "hello",
    "status",
    "checkpoints",
    "events",
    "history",
    "subscribe",
    "history_of",
    "related_runs",
    "dump",
]
ActingCommand = Literal["save", "stop", "start", "pin", "unpin", "shutdown", "pivot"]
Command = ReadCommand | ActingCommand
READ_COMMANDS: Final[tuple[ReadCommand, ...]] = get_args(ReadCommand)
"""Commands that only read: answered at once, any number at a time."""
ACTING_COMMANDS: Final[tuple[ActingCommand, ...]] = get_args(ActingCommand)
"""Operator commands: they go through the policy, one at a time per daemon."""
COMMANDS: Final[tuple[str, ...]] = (*READ_COMMANDS, *ACTING_COMMANDS)
# The error codes (ErrorCode, ERROR_CODES), the journal's record kinds and the markers'
# kinds are core/kinds.py's, re-exported above: the policy answers and journals with them.

# ----------------------------------------------------------------------------- envelopes

RequestId = int | str | None
"""A request's `id` as its client chose it, echoed in its progress lines and its reply."""


class Request(TypedDict):
    """`{"id", "cmd"}`; the command's arguments (the *Args types) sit beside them."""

    id: NotRequired[RequestId]
    cmd: str


class OkReply(TypedDict):
    id: RequestId
    ok: Literal[True]
    result: Any
    """The command's result: RESULTS[cmd]."""


class ErrorBody(TypedDict):
    code: ErrorCode
    message: str
    """One line for a person: what is wrong and what to do."""


class ErrorReply(TypedDict):
    id: RequestId
    """None when the request could not be read far enough to know its id."""
    ok: Literal[False]
    error: ErrorBody


Reply = OkReply | ErrorReply


class ProgressLine(TypedDict):
    """Sent for an acting request (stop, shutdown) before its reply, any number of times."""

    id: RequestId
    progress: str
    """One line for a person: what just happened ("checkpoint step 40 committed")."""


class Push(TypedDict):
    topic: Topic
    data: Any
    """TOPIC_DATA[topic], or TooLarge in its place when the push would exceed MAX_LINE."""


class TooLarge(TypedDict):
    """A push's data that would not fit one line, left out: what is sent in its place."""

    truncated: Literal[True]
    bytes: int
    """The encoded size of the push that was not sent, newline included."""


# ----------------------------------------------------------------------------- arguments


class SubscribeArgs(TypedDict, total=False):
    topics: list[Topic]
    """Default: every topic."""


class HistoryArgs(TypedDict, total=False):
    start: int | None
    end: int | None
    """First and last step, inclusive (None: the whole history)."""
    points: int
    """Buckets to decimate to (default 200; at most HISTORY_MAX_POINTS are sent)."""


class HistoryOfArgs(HistoryArgs):
    run: str
    """Another run: an absolute path, or a name beside this run (a sibling folder)."""


class EventsArgs(TypedDict, total=False):
    n: int
    """How many of the newest journal records (default 50)."""


class SaveArgs(TypedDict, total=False):
    wait: bool
    """Reply once the checkpoint is committed (SaveCommitted) instead of at once."""
    timeout_s: float
    """How long a waiting save may take; at most the run's save_wait_timeout_s (more is
    refused as bad_argument)."""


class StopArgs(TypedDict, total=False):
    force: bool
    """Stop a trainer that does not catch SIGTERM anyway (killed, its unsaved steps lost)."""


class StartArgs(TypedDict, total=False):
    from_scratch: bool
    """Start over at step 0: only in no_checkpoint, where no verified checkpoint is left."""


class PinArgs(TypedDict):
    step: int
    dry_run: NotRequired[bool]
    """unpin only: change nothing, answer `would_delete`."""


class PivotArgs(TypedDict, total=False):
    caps: dict[str, float]
    floors: dict[str, float]


# ----------------------------------------------------------------------------- pieces


class CheckpointRef(TypedDict):
    """A checkpoint named in a result (stop, shutdown) or a journal record."""

    step: int
    name: str
    bytes: int


class Checkpoint(TypedDict):
    """One verified checkpoint as the checkpoints view lists it."""

    step: int
    name: str
    path: str
    bytes: int
    mtime: float
    verified: bool
    pinned: bool
    next_to_delete: bool
    """The one retention deletes next once a newer checkpoint is committed."""


class Quarantined(TypedDict):
    name: str
    """The file's name in checkpoints/quarantine/."""
    step: NotRequired[int | None]
    cause: NotRequired[str | None]
    """"pivot" (set aside: written under the old policy), "divergence" (rolled back
    past), "rollback" (the timeline a loss spike's rollback abandoned), "verification"
    (failed it), "failed" (another fault); None: not journaled."""
    cause_step: NotRequired[int | None]
    """The pivot's or the divergence's step."""
    reason: NotRequired[str | None]
    """The journal's reason, as the policy gave it."""
    why: NotRequired[str]
    """The reason in words, as the TUI and the CLI show it."""
    alarming: NotRequired[bool]
    """False for a pivot's set-aside checkpoints, the normal archive of a pivot."""


class CheckpointsView(TypedDict):
    checkpoints: list[Checkpoint]
    """Oldest first."""
    quarantined: list[Quarantined]


class StateDetail(TypedDict, total=False):
    restart_in_s: float
    """backoff: seconds until the restart."""
    reason: str
    """Halted phases: why the run halted."""
    stop_reason: str
    """Why the trainer is being stopped (operator, shutdown, stall, divergence, spike,
    pivot)."""
    pivot_stage: str
    pivot_step: int | None


class Spikes(TypedDict):
    """What loss spikes have done to the run so far (see the journal for each one)."""

    rollbacks: int
    """Rollbacks made for a spike since the run began."""
    spike_steps: list[int]
    """The first step of each spike rolled back from, oldest first."""
    lr_scale: float
    """The factor on the learning rate the trainer now gets (1.0: none)."""
    watching: int | None
    """The first step of the last spike, while it is not yet known cured or recurred."""


class SlurmJobRecord(TypedDict):
    """The Slurm job the daemon runs in (`trainwarden daemon` as a batch step's process),
    as its environment and `scontrol show job` told it at the daemon's start: the journal's
    `slurm_job` record."""

    job_id: str
    """SLURM_JOB_ID."""
    name: str | None
    """SLURM_JOB_NAME."""
    node: str | None
    """SLURMD_NODENAME (else the job's node list, else the host name)."""
    partition: str | None
    """SLURM_JOB_PARTITION."""
    restart_count: int
    """SLURM_RESTART_COUNT: times Slurm requeued the job (0: its first segment)."""
    time_limit_s: int | None
    """The job's time limit in seconds (None: none, or not known: see limit_note)."""
    end_time: float | None
    """When Slurm ends the job, wall-clock seconds since the epoch (None: not known)."""
    limit_note: str | None
    """When time_limit_s is None: why, in words ("unlimited", "being read",
    "unknown: scontrol not found", ...)."""
    segment: int
    """This job segment's number in the run: 1 + the `slurm_job` records before it (a
    requeue, or a new job on the same run, starts the next)."""
    gap_s: float | None
    """Seconds from the previous segment's last journal record to this one's start (None:
    the first segment)."""
    lost_s: float
    """Seconds between all of the run's segments so far, this one's gap included."""


class SlurmJobView(SlurmJobRecord):
    """The job as the state view carries it."""

    ends_in_s: float | None
    """Seconds from this view until end_time (clients count it down with their own clock)."""


class StateView(TypedDict):
    """The run's phase and its trainer: the `state` topic, and part of status."""

    state: Phase
    detail: StateDetail
    trainer_pid: int | None
    trainer_uptime_s: float | None
    restarts: int
    """Trainer starts after the run's first, whatever their cause."""
    restarts_by_cause: dict[str, int]
    """`restarts` by cause, adding up to it, in this order, causes with none left out:
    crash, hang (killed for no step line), disk_full (died on a full disk), divergence
    (killed for a non-finite or too high loss, rolled back), spike (a loss spike rolled
    back), gpu_fault (after a GPU fault), pivot, operator (`start`), daemon (a new daemon
    started it again). A run journaled before the breakdown existed may add up to less."""
    restarts_without_progress: int
    """Crashes and hangs since the run last committed a checkpoint: the crash-loop budget
    ([restart] max_restarts_without_progress)."""
    seg: int
    """Trainer starts so far (the `seg` of .loss.json)."""
    spikes: Spikes
    skips: list[list[int]]
    """Every data window skipped so far, [from_step, to_step), as TRAINWARDEN_SKIP_DATA."""
    config_changed: bool
    """trainwarden.toml no longer holds what the daemon read at its start (edited, or gone):
    the daemon still runs the settings it read; a new daemon reads the file again."""
    config_notice: str | None
    """When config_changed: one line saying so, when the daemon read it and what to do."""
    slurm: SlurmJobView | None
    """The Slurm job the daemon runs in (None: not in a Slurm job)."""


class ParserNoMatch(TypedDict):
    """No line of the current trainer start has matched the configured parser for
    min(60 s, stall_timeout_s / 2) since its first line: probably the wrong parser."""

    parser: str
    """[telemetry] parser."""
    sample: str
    """A recent line that did not match (clipped; clean it before printing)."""
    seg: int
    hint: str
    """One line for the user: what matched nothing, and the option to change."""


class UnrecognisedCheckpoint(TypedDict):
    """A name in the checkpoint directory that the configured format does not read."""

    name: str
    hint: str
    """One line for the user: the option that would match it."""


class Validation(TypedDict):
    """The newest held-out evaluation the trainer logged (`.eval.json`): reported, never
    acted on (a nan here is journaled as `val_nan`, not a divergence)."""

    step: int
    loss: float | str
    """Non-finite as "nan", "inf", "-inf"."""
    extras: dict[str, Any]
    """The line's other values (per-arm losses `val_ARM`; non-finite numbers as strings)."""
    seg: int
    """The trainer start that logged it."""
    t: float
    """Wall time the daemon saw the line."""
    age_s: float | None


class StepFigures(TypedDict):
    """The monitor's figures of the newest step (all None before the first): the first
    fields of Telemetry."""

    step: int | None
    loss: float | None
    loss_ema: float | None
    loss_avg: float | None
    dt: float | None
    tokens_per_s: float | None
    mfu: float | None
    mfu_avg: float | None
    mfu_unknown_reason: str | None
    steps_per_min: float | None
    eta_s: float | None
    collapse_loss: float | None
    """ln(vocab_size): the loss of a uniform guess."""


class Telemetry(StepFigures):
    """The figures of the newest step: the `telemetry` topic, and part of status."""

    step_age_s: float | None
    """Seconds since the newest step line was seen (its figures are that old)."""
    last_checkpoint_step: int | None
    last_checkpoint_age_s: float | None
    next_checkpoint_step: int | None
    """The trainer's next save on its own cadence, never past total_steps (None: unknown,
    at or past the total, or finished)."""
    last_save_name: str | None
    """The checkpoint the newest save report names (untrusted: clean it before printing)."""
    last_save_stall_s: float | None
    """Seconds the trainer's step loop waited for that save (None: not reported)."""
    last_save_write_s: float | None
    """Seconds that save took to write (in the background for an asynchronous save)."""
    last_save_age_s: float | None
    """Seconds since the daemon saw that save report (None: none since it started)."""
    last_line: str | None
    """The trainer's newest output line (untrusted: clean it before printing)."""
    last_line_age_s: float | None
    resume_audit: AuditResult | None
    parser_no_match: ParserNoMatch | None
    """Set while no line of this trainer start has matched the parser (see its type)."""
    checkpoints_unrecognised: list[UnrecognisedCheckpoint]
    """Names in the checkpoint directory the format matches nothing of, newest last."""
    val_step: int | None
    val_loss: float | str | None
    """The newest evaluation's step and loss (non-finite as a string; None before one)."""


class GpuSample(TypedDict):
    """One NVML reading of one GPU; a figure NVML could not give is None."""

    name: str | None
    index: int
    util_percent: int | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    throttle_reasons: list[str] | None
    ecc_volatile_errors: int | None
    alarming: bool


class HostSample(TypedDict):
    trainer_cpu_percent: float | None
    trainer_rss_bytes: int | None
    trainer_processes: int
    mem_used_bytes: int
    mem_total_bytes: int
    disk_free_bytes: int | None
    disk_total_bytes: int | None
    load_avg_1m: float
    load_avg_5m: float
    load_avg_15m: float


class LogStats(TypedDict):
    """How the daemon is reading the run log."""

    lines: int
    skipped_long: int
    undecodable: int
    truncations: int
    rotations: int
    offset: int


class JournalRecord(TypedDict):
    """One journal line; the kind's own fields sit beside these."""

    ts: str
    """UTC, ISO 8601."""
    t: float
    """Unix time, seconds."""
    kind: JournalKind
    """One of JOURNAL_KINDS (a daemon of another version may write others)."""


class Marker(TypedDict):
    step: int
    kind: MarkerKind


BanditState = dict[str, Any]
"""The trainer's .state.json as it wrote it (arms with pulls, prob, cap, floor; zombies),
or, over SIDECAR_MAX_BYTES, bounded_sidecar's cut of it (`truncated: true`)."""
SamplesFile = dict[str, Any]
"""The trainer's .samples.json as it wrote it ({"samples": [{"step", "arm", "text"}]}),
or, over SIDECAR_MAX_BYTES, bounded_sidecar's cut of it (`truncated: true`)."""

# ----------------------------------------------------------------------------- bounds

SIDECAR_MAX_BYTES: Final = 256 << 10
"""The most of a .state.json or .samples.json the daemon sends (256 KiB, encoded): a
subscribe's snapshot carries both and must stay one line."""
SIDECAR_READ_MAX_BYTES: Final = 64 << 20
"""A sidecar file larger than this is not even read: only its size is sent."""
SIDECAR_TEXT_MAX: Final = 2000
"""Characters kept of one string inside a truncated sidecar."""
RUN_NAME_MAX: Final = 200
"""Characters of `[run] name` that hello and status send; a longer one ends with "…"."""
_FLOAT_CHARS = len("-2.2250738585072014e-308")
_STEP_CHARS = len(str(MAX_STEP))
HISTORY_MAX_POINTS: Final = (MAX_LINE // 2) // (2 * _STEP_CHARS + 3 * _FLOAT_CHARS + 5)
"""Buckets a history reply holds at most, whatever `points` asks: the widest bucket
(step, min, mean, max, nonfinite) times this fills half a line, the other half is for
the markers."""


def clip_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clip_strings(value: Any) -> Any:
    if isinstance(value, str):
        return clip_text(value, SIDECAR_TEXT_MAX)
    if isinstance(value, dict):
        return {k: _clip_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clip_strings(v) for v in value]
    return value


def sidecar_too_large(size: int) -> dict[str, Any]:
    """What is sent for a sidecar of `size` bytes that cannot be cut down."""
    return {"truncated": True, "bytes": size}


def bounded_sidecar(data: dict[str, Any], size: int) -> dict[str, Any]:
    """`data` (a sidecar of `size` bytes) cut to at most SIDECAR_MAX_BYTES encoded.

    Each top-level list keeps its newest (last) items and each top-level table its first
    entries, long strings clipped, as many as share the budget; `truncated: true` and the
    file's `bytes` say it is a cut. The TUI shows what is left.
    """
    if len(encode(data)) <= SIDECAR_MAX_BYTES:
        return data
    containers = [k for k, v in data.items() if isinstance(v, list | dict)]
    budget = SIDECAR_MAX_BYTES // (len(containers) + 2)
    cut: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, list):
            kept: list[Any] = []
            used = 0
            for item in reversed(value):
                item = _clip_strings(item)
                used += len(encode({"x": item})) - 7
                if used > budget:
                    break
                kept.append(item)
            cut[key] = kept[::-1]
        elif isinstance(value, dict):
            table: dict[str, Any] = {}
            used = 0
            for name, item in value.items():
                item = _clip_strings(item)
                used += len(encode({str(name): item}))
                if used > budget:
                    break
                table[name] = item
            cut[key] = table
        else:
            cut[key] = _clip_strings(value)
    cut["truncated"] = True
    cut["bytes"] = size
    return cut if len(encode(cut)) <= SIDECAR_MAX_BYTES else sidecar_too_large(size)


# ----------------------------------------------------------------------------- results


class HelloResult(TypedDict):
    protocol: int
    version: str
    run: str
    run_dir: str
    log: str
    """The run log's path on the daemon's machine."""
    pid: int
    """The daemon's pid (what `daemon --detach` checks it started)."""


class StatusFigures(Telemetry):
    """What status carries beside the state and the checkpoints: the telemetry topic's
    figures, the newest GPU and host samples, the disk, the run log, the newest evaluation."""

    gpu: GpuSample | None
    gpu_status: str
    """"ok", or why there are no GPU figures."""
    host: HostSample | None
    disk_low: bool
    disk_full: bool
    """A write of the daemon's found the disk full: what it could not write is held in
    memory and written once space returns."""
    disk_full_files: list[str]
    """The daemon's files (journal, .loss.json, pid file) waiting for space."""
    snapshot_failing: dict[str, Any] | None
    """[checkpoints] fixed: why the snapshots of the fixed file fail (`reason`, `since`,
    `count` in a row); None while they succeed."""
    log: LogStats | None
    val: Validation | None
    """The newest held-out evaluation (None before the first)."""


class StatusResult(StateView, StatusFigures, CheckpointsView):
    protocol: int
    version: str
    run: str
    run_dir: str
    daemon_pid: int
    daemon_started_at: float
    total_steps: int | None
    handles: list[str] | None
    """Of SIGTERM and SIGUSR1, those the trainer's signal target catches (None: unknown,
    or no trainer)."""


class Snapshot(TypedDict, total=False):
    """The current value of each subscribed topic."""

    telemetry: Telemetry
    gpu: GpuSample | None
    host: HostSample | None
    checkpoints: CheckpointsView
    events: list[JournalRecord]
    """The newest records, oldest first (a push is one record)."""
    bandit: BanditState | None
    samples: SamplesFile | None
    state: StateView


class SubscribeResult(TypedDict):
    snapshot: Snapshot


class HistoryResult(HistoryBuckets):
    """This run's history (`history`)."""

    markers: list[Marker]
    collapse_loss: float | None
    branch_step: int | None
    """For a branch run (`trainwarden branch`), the step it was branched at: steps up to
    it come from its ancestors' histories (`ancestors`), the later ones are its own."""
    ancestors: list[BranchAncestor]


class RelatedRunsResult(TypedDict):
    runs: list[RelatedRun]
    """This run's ancestors, then the run directories beside it, by name."""


class _EventsCut(TypedDict, total=False):
    truncated: bool
    """True when the newest records asked for did not all fit one line (half of MAX_LINE):
    the oldest were left out. Absent when all are there."""


class EventsResult(_EventsCut):
    events: list[JournalRecord]
    """Oldest first."""


class SaveRequested(TypedDict):
    """save without wait: the trainer was asked; the checkpoint comes later."""

    requested: Literal[True]
    step: int
    """The trainer's step when asked."""


class Unverified(TypedDict, total=False):
    """What a reply that names a checkpoint (save with wait, stop, shutdown, start) adds
    while the verification of some committed checkpoint has been given up on."""

    unverified: list[str]
    """Their names: verifications that ran past their timeout (journaled
    `verification_overdue`), not waited for any more; absent when there are none."""


class SaveCommitted(Unverified):
    """save with wait: the checkpoint that answered it, committed and verified."""

    step: int
    name: str


StopOutcome = Literal["saved", "exited_without_saving", "killed", "not_running"]


class ConfigNoticed(TypedDict, total=False):
    """What the replies of start and stop add when trainwarden.toml changed since the
    daemon read it (see StateView's config_notice); a refusal's message ends with it."""

    config_notice: str


class StopResult(ConfigNoticed, Unverified):
    """stop and shutdown: the trainer is gone; what came of it; the newest verified checkpoint."""

    state: Literal[Phase.STOPPED, Phase.DIVERGED, Phase.GPU_FAULT]
    """stopped; or the halt the run came to while the trainer was stopped (a divergence for
    good, a GPU fault): the trainer is gone either way."""
    checkpoint: CheckpointRef | None
    outcome: StopOutcome
    """saved: nothing logged is lost (a checkpoint at its last logged step); exited
    without saving; killed after stop_timeout_s; not_running: there was no trainer."""
    steps_lost: int
    """Last logged step minus the newest verified checkpoint's (0: nothing lost)."""
    last_step: int | None
    exit: str | None
    """How the trainer ended: "exited 0", "killed by SIGTERM", "killed after 10 s"."""
    message: str
    """The outcome in one line."""


class StartResult(ConfigNoticed, Unverified):
    state: Phase
    resume_step: NotRequired[int | None]
    """Absent when start resumes an interrupted pivot (the pivot picks the checkpoint)."""


class PinResult(TypedDict):
    step: int
    pinned: bool


class UnpinPreview(TypedDict):
    """An unpin's dry run (`dry_run: true`): nothing changed."""

    step: int
    pinned: bool
    """Still true."""
    dry_run: bool
    would_delete: list[int]
    """The steps retention would delete at once after the unpin (the unpinned one, or an
    older one it no longer keeps), oldest first; empty: nothing goes."""


class PivotResult(TypedDict):
    step: int
    """The checkpoint the new policy starts from."""
    archive: str
    """The archive folder, relative to the run directory."""
    zombies: list[str]
    """Arms the trainer has no data for any more."""


class DumpResult(TypedDict):
    """`dump`: the trainer's stacks, written to a file (the `hang_dump` record's fields)."""

    reason: str
    """"request" (the operator's dump) or "hang" (before a hung trainer's stop)."""
    step: int | None
    """The trainer's last logged step."""
    path: str | None
    """The dump file (None: it could not be written; see write_error)."""
    write_error: NotRequired[str]
    """Why the dump file could not be written ("PATH: reason"); absent when it was."""
    top_frames: list[str]
    """The innermost frames of the main thread, innermost first ("function (file:line)")."""
    error: str | None
    """Why py-spy dumped no process (None: it dumped at least one)."""
    pids: list[int]
    """The processes dumped: the trainer, then every process below it."""
    seconds: float


def size_text(n: Any) -> str:
    """A size in binary units, as the TUI and the command line both print it:
    "512 B", "1.4 MiB", "3.2 GiB"; "-" for no number."""
    if not isinstance(n, int | float) or isinstance(n, bool) or not math.isfinite(n):
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


RESULTS: Final[dict[str, Any]] = {
    "hello": HelloResult,
    "status": StatusResult,
    "subscribe": SubscribeResult,
    "history": HistoryResult,
    "history_of": HistoryOfResult,
    "related_runs": RelatedRunsResult,
    "dump": DumpResult,
    "checkpoints": CheckpointsView,
    "events": EventsResult,
    "save": SaveRequested | SaveCommitted,
    "stop": StopResult,
    "shutdown": StopResult,
    "start": StartResult,
    "pin": PinResult,
    "unpin": PinResult | UnpinPreview,
    "pivot": PivotResult,
}
"""Each command's result type."""
TOPIC_DATA: Final[dict[Topic, Any]] = {
    "telemetry": Telemetry,
    "gpu": GpuSample | None,
    "host": HostSample,
    "checkpoints": CheckpointsView,
    "events": JournalRecord,
    "bandit": BanditState,
    "samples": SamplesFile,
    "state": StateView,
}
"""Each topic's push data type."""

STATE_KEYS: Final[tuple[str, ...]] = tuple(StateView.__annotations__)
"""The fields of status that are the state topic's."""
TELEMETRY_KEYS: Final[tuple[str, ...]] = tuple(Telemetry.__annotations__)
"""The fields of status that are the telemetry topic's."""
TELEMETRY_NOTICES: Final[tuple[str, ...]] = (
    "resume_audit",
    "parser_no_match",
    "checkpoints_unrecognised",
)
"""The telemetry fields that are notices for the user (a client shows them apart)."""
