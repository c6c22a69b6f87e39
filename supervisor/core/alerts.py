"""Which journal records a person away from the run must hear about, and when.

Pure: a record (a dict as the journal wrote it, its wall time in `t`) and the state of
what was seen and sent come in; the new state and the alerts to send go out. The shell
(shell.alerts) observes the journal, sends, and journals the outcome.

Events (the names `[alerts] on` chooses from):
    halted         the run halted: crash_loop, diverged, gpu_fault
    finished       the trainer finished on its own
    disk           the disk is full, or has less room than the next checkpoint needs
    gpu_fault      an XID or a GPU that stopped answering (see inputs.gpu)
    gpu_throttle   throughput lost to hardware slowdown, thermal or power brake
    restarts       more than `restarts_per_hour` crashes within an hour
    rollback       a loss spike was rolled back
    resume_drift   a resumed trainer replayed different losses than before
    hang           the trainer stopped logging steps and was stopped (with its stack
                   dump's top frames when one was taken)
    unclean_start  the daemon started after an unclean exit (power cut, SIGKILL)

The hang alert waits for the stall's `hang_dump` record, which comes before the kill, and
goes without frames at the `crash` that follows the kill when no dump came: bounded by
the kill's own deadline, no timer needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

EVENTS: tuple[str, ...] = (
    "halted",
    "finished",
    "disk",
    "gpu_fault",
    "gpu_throttle",
    "restarts",
    "rollback",
    "resume_drift",
    "hang",
    "unclean_start",
    "no_step_lines",
    "snapshot",
)
"""Every event an alert can be sent for; all are on by default."""

HOUR_S = 3600.0
TOP_FRAMES = 5
"""Stack frames of a hang dump an alert carries."""


@dataclass(frozen=True)
class Alert:
    event: str
    key: str
    """What makes two alerts the same one (de-duplicated within min_interval_s)."""
    title: str
    happened: str
    did: str
    step: int | None
    t: float
    frames: tuple[str, ...] = ()


@dataclass(frozen=True)
class AlertRules:
    on: frozenset[str] = frozenset(EVENTS)
    min_interval_s: float = 600.0
    restarts_per_hour: int = 5


@dataclass(frozen=True)
class Watch:
    """What the alerts depend on besides the record at hand."""

    crashes: tuple[tuple[float, int], ...] = ()
    """(wall time, how many) of the crashes within the last hour (a `repeated` record
    counts many at once)."""
    folded: tuple[float, int] = (0.0, 0)
    """The fold (`since`) of the newest `repeated` record and the crashes it counted."""
    last_cause: str | None = None
    stall: Alert | None = None
    """A hang alert waiting for its stall's stack dump."""
    sent: Mapping[str, float] = field(default_factory=dict)
    """Alert key -> wall time it was last let through."""


def _step(record: Mapping[str, Any], last_step: int | None) -> int | None:
    for key in ("step", "last_step", "resume_step"):
        value = record.get(key)
        if isinstance(value, int):
            return value
    return last_step


def _gib(n: Any) -> str:
    return f"{n / (1 << 30):.1f} GiB" if isinstance(n, int | float) else "?"


def _halted(record: Mapping[str, Any], watch: Watch, step: int | None, t: float) -> Alert:
    state = str(record.get("state", "?"))
    if state == "crash_loop":
        n = record.get("restarts_without_progress")
        happened = f"{n} restarts without a new checkpoint; last: {watch.last_cause or '?'}"
    elif state == "diverged":
        happened = str(record.get("reason") or f"the loss diverged again at step {step}")
    else:
        happened = str(record.get("reason") or record.get("message") or f"halted in {state}")
    did = f"halted in {state}: no trainer runs until you start it (`trainwarden start RUN`)"
    instruction = record.get("instruction")
    if instruction:
        did = f"halted in {state}, no restart: {instruction}"
    return Alert("halted", f"halted:{state}", f"halted in {state}", happened, did, step, t)


def _alert(
    record: Mapping[str, Any], watch: Watch, rules: AlertRules, last_step: int | None
) -> tuple[Watch, list[Alert]]:
    kind = record.get("kind")
    t = float(record.get("t", 0.0))
    step = _step(record, last_step)
    out: list[Alert] = []
    if kind == "halt":
        out.append(_halted(record, watch, step, t))
    elif kind == "snapshot_failed" and record.get("first"):
        out.append(Alert("snapshot", "snapshot_failed", "snapshots failing",
                         f"the fixed checkpoint {record.get('fixed', '?')} could not be"
                         f" snapshotted: {record.get('error', '?')}",
                         "keeps trying at each write (and when space returns); no new"
                         " checkpoint counts until one succeeds", step, t))  # fmt: skip
    elif kind == "no_step_lines":
        out.append(Alert("no_step_lines", "no_step_lines", "no step lines",
                         str(record.get("hint") or "checkpoints but no step lines"),
                         "supervising without a loss: no NaN or spike detection", step, t))  # fmt: skip
    elif kind == "trainer_finished" and record.get("early"):
        total, at = record.get("total_steps"), record.get("last_step")
        out.append(Alert("finished", "finished:early", "finished early",
                         f"the trainer exited 0 at step {at if at is not None else 0} of {total}",
                         "nothing restarts it: read its output; `trainwarden start RUN`"
                         " resumes from the newest checkpoint", step, t))  # fmt: skip
    elif kind == "trainer_finished":
        out.append(Alert("finished", "finished", "finished", "the trainer finished on its own",
                         "nothing: the run is done", step, t))  # fmt: skip
    elif kind == "disk_full":
        out.append(Alert("disk", "disk:full", "disk full",
                         f"no space left writing {record.get('file', '?')} ({record.get('error', '')})",
                         "holding its records in memory, written when space returns; free space",
                         step, t))  # fmt: skip
    elif kind == "disk_low":
        out.append(Alert("disk", "disk:low", "disk low",
                         f"{_gib(record.get('free_bytes'))} free, less than the next checkpoint"
                         f" needs ({_gib(record.get('checkpoint_bytes'))})",
                         "nothing yet: free space before the next save", step, t))  # fmt: skip
    elif kind == "gpu_fault":
        gpu, xid = record.get("gpu", "?"), record.get("xid")
        what = f"XID {xid}" if xid is not None else "no answer from NVML"
        out.append(Alert("gpu_fault", f"gpu_fault:{gpu}:{xid}", f"GPU {gpu} fault ({what})",
                         f"{record.get('message') or what} (class: {record.get('class', '?')})",
                         str(record.get("action") or "journaled it"), step, t))  # fmt: skip
    elif kind == "gpu_throttle":
        reasons = ", ".join(str(r) for r in record.get("reasons") or []) or "?"
        drop = record.get("mfu_drop")
        cost = f", MFU down {drop:.0%}" if isinstance(drop, int | float) else ""
        out.append(Alert("gpu_throttle", f"gpu_throttle:{reasons}", "GPU throttled",
                         f"throttled for {record.get('seconds', '?')} s ({reasons}){cost}",
                         "nothing: the trainer runs on, slower", step, t))  # fmt: skip
    elif kind == "rollback":
        out.append(Alert("rollback", "rollback", "loss spike rolled back",
                         f"a loss spike at step {record.get('spike_step')}",
                         f"rolled back to step {record.get('step')} ({record.get('checkpoint')}),"
                         f" rollback {record.get('rollbacks')} of {record.get('max_rollbacks')}",
                         step, t))  # fmt: skip
    elif kind == "resume_drift":
        out.append(Alert("resume_drift", "resume_drift", "resume drift",
                         f"after resuming from step {record.get('checkpoint_step')}, step {step}"
                         f" logged loss {record.get('new_loss')} where it was {record.get('old_loss')}",
                         "nothing: the trainer runs on; check its data order and seeds",
                         step, t))  # fmt: skip
    elif kind == "boot_recovery":
        lost = record.get("steps_lost")
        out.append(Alert("unclean_start", "unclean_start", "daemon restarted after an unclean exit",
                         "the daemon started after an unclean exit (power cut or kill)"
                         + (f"; {lost} steps since the newest checkpoint are lost" if lost else ""),
                         f"resumes from the newest verified checkpoint (step {record.get('resume_step')})"
                         " unless the run was halted", step, t))  # fmt: skip
    elif kind == "stall":
        pending = Alert("hang", "hang", "trainer hung",
                        f"no step line for {record.get('silent_s')} s",
                        "stopped the trainer (SIGTERM, then SIGKILL) to restart it", step, t)  # fmt: skip
        flushed = [watch.stall] if watch.stall is not None else []
        return replace(watch, stall=pending), flushed
    elif kind == "hang_dump" and watch.stall is not None:
        frames = tuple(str(f) for f in (record.get("top_frames") or [])[:TOP_FRAMES])
        dump = record.get("path")
        where = f"; stacks in {dump}" if dump else f"; no stack dump: {record.get('error')}"
        out.append(replace(watch.stall, happened=watch.stall.happened + where, frames=frames))
        watch = replace(watch, stall=None)
    elif kind == "crash":
        if watch.stall is not None:
            out.append(watch.stall)
        watch = _crashed(replace(watch, stall=None), record, 1, rules, step, t, out)
    elif kind == "repeated":
        # A fast crash loop's folded cycles: the crashes counted since its last report.
        last = record.get("last")
        crash = last.get("crash") if isinstance(last, dict) else None
        counts = record.get("counts")
        total = counts.get("crash") if isinstance(counts, dict) else None
        since = record.get("since")
        if isinstance(crash, dict) and isinstance(total, int) and isinstance(since, int | float):
            before = watch.folded[1] if watch.folded[0] == since else 0
            watch = replace(watch, folded=(since, total))
            if total > before:
                watch = _crashed(watch, crash, total - before, rules, step, t, out)
    return watch, out


def _crashed(
    watch: Watch,
    crash: Mapping[str, Any],
    n: int,
    rules: AlertRules,
    step: int | None,
    t: float,
    out: list[Alert],
) -> Watch:
    """`n` more crashes like `crash`: the restarts alert once there are too many an hour."""
    crashes = (*(c for c in watch.crashes if t - c[0] < HOUR_S), (t, n))
    cause = str(crash.get("cause"))
    if crash.get("last_line"):
        cause += f" (the trainer's last line: {crash['last_line']})"
    many = sum(k for _, k in crashes)
    if many > rules.restarts_per_hour:
        out.append(Alert("restarts", "restarts", "restarting repeatedly",
                         f"{many} crashes within an hour; last: {crash.get('cause')}",
                         "restarts it after each crash, until max_restarts_without_progress",
                         step, t))  # fmt: skip
    return replace(watch, crashes=crashes, last_cause=cause)


def observe(
    watch: Watch, record: Mapping[str, Any], rules: AlertRules, last_step: int | None = None
) -> tuple[Watch, list[Alert]]:
    """The alerts `record` calls for, less those not chosen in `on` and those sent under
    the same key within min_interval_s."""
    watch, alerts = _alert(record, watch, rules, last_step)
    chosen = []
    sent = dict(watch.sent)
    for alert in alerts:
        if alert.event not in rules.on:
            continue
        last = sent.get(alert.key)
        if last is not None and alert.t - last < rules.min_interval_s:
            continue
        sent[alert.key] = alert.t
        chosen.append(alert)
    return replace(watch, sent=sent), chosen
