"""What the command line prints: the status text, checkpoint sizes and ages, replies, events."""

from __future__ import annotations

import contextlib
import math
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from trainwarden.supervisor.journal_text import (
    causes_text,
    compact_text,
    count_text,
    duration_text,
    loss_text,
    rate_text,
    slurm_text,
    summary,
)
from trainwarden.supervisor.protocol import size_text as size_text

if TYPE_CHECKING:
    from trainwarden.supervisor.protocol import DumpResult, JournalRecord, StatusResult, Validation


# CSI and OSC sequences whole first, so "\x1b[31m" vanishes rather than leaving "[31m"; then
# every other C0/C1 control and the invisible or bidi-reordering characters.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]"
)


def clean(value: Any, limit: int = 400) -> str:
    """Text that came from the run (its name, a trainer's message, an arm or file name) as
    one printable line of at most `limit` characters: it cannot move the cursor, retitle
    the terminal or hide what follows it."""
    text = value if isinstance(value, str) else str(value)
    text = _ESCAPES.sub("", text[: limit * 4])
    text = _CONTROLS.sub("", re.sub(r"[\t\n\r]+", " ", text))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def _fmt(value: Any, spec: str = "", unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:{spec}}{unit}"


def format_status(s: StatusResult) -> str:
    detail = s.get("detail") or {}
    extra = ""
    if "restart_in_s" in detail:
        extra = f" (restart in {duration_text(detail['restart_in_s'])})"
    elif "reason" in detail:
        extra = f" ({clean(detail['reason'])})"
    total = s.get("total_steps")
    step = count_text(s.get("step")) + (f"/{count_text(total)}" if total else "")
    mfu = s.get("mfu")
    mfu_text = (
        f"{mfu * 100:.2f} %"
        if mfu is not None
        else f"unknown ({clean(s.get('mfu_unknown_reason') or 'n/a')})"
    )
    lines = [
        f"run       {clean(s.get('run'))}  ({clean(s.get('run_dir'))})",
        f"state     {clean(s.get('state'))}{extra}",
        *(
            [f"config    {clean(s['config_notice'], NOTICE_CHARS)}"]
            if s.get("config_notice")
            else []
        ),
        f"trainer   pid {_fmt(s.get('trainer_pid'))}, {restarts_text(s)}",
        *([f"slurm     {clean(slurm_text(s['slurm']))}"] if s.get("slurm") else []),
        f"handles   {handles_text(s.get('handles'))}",
        f"step      {step}   loss {loss_text(s.get('loss'))}   ema {loss_text(s.get('loss_ema'))}",
        # The TUI's figures, written by the same functions (journal_text).
        f"speed     {compact_text(s.get('tokens_per_s'))} tok/s   "
        f"{rate_text(s.get('steps_per_min'))} steps/min   eta {duration_text(s.get('eta_s'))}",
        f"mfu       {mfu_text}",
    ]
    val = s.get("val")
    if val:
        lines.append(f"val       {validation_text(val)}")
    gpu = s.get("gpu")
    lines.append(f"gpu       {clean(gpu.get('name')) if gpu else 'no NVIDIA GPU'}")
    ckpts = newest_first(s.get("checkpoints") or [])
    names = "  ".join(f"{count_text(c['step'])}{'*' if c.get('pinned') else ''}" for c in ckpts)
    lines.append(
        f"ckpts     {len(ckpts)} verified{', newest first' if len(ckpts) > 1 else ''}:"
        f" {names or 'none'}" + ("  (* pinned)" if "*" in names else "")
    )
    save = save_text(s)
    if save:
        lines.append(f"          {save}")
    quarantined = s.get("quarantined") or []
    if quarantined:
        calm = [q.get("cause") for q in quarantined if q.get("alarming", True) is False]
        pivot, rollback = calm.count("pivot"), calm.count("rollback")
        told = [
            f"{len(quarantined) - len(calm)} quarantined" if len(quarantined) > len(calm) else "",
            f"{pivot} set aside by a pivot" if pivot else "",
            f"{rollback} set aside by a spike rollback" if rollback else "",
        ]
        lines.append(
            f"quarant.  {', '.join(t for t in told if t)} file(s) in quarantine/"
            " (`trainwarden checkpoints` says why)"
        )
    spikes = s.get("spikes") or {}
    if spikes.get("rollbacks"):
        skips = s.get("skips") or []
        at = ", ".join(str(step) for step in spikes.get("spike_steps") or [])
        lines.append(
            f"spikes    {spikes['rollbacks']} rolled back (at steps {at}),"
            f" {len(skips)} data window(s) skipped, lr x{spikes.get('lr_scale', 1.0):g}"
        )
    for hint in status_hints(s):
        lines.append(f"hint      {clean(hint)}")
    if s.get("disk_full"):
        waiting = ", ".join(s.get("disk_full_files") or []) or "?"
        lines.append(f"disk      full: held in memory until space returns: {waiting}")
    return "\n".join(lines)


def newest_first(checkpoints: list[Any]) -> list[Any]:
    """A checkpoint list as the command line shows it, newest first (the daemon sends it
    oldest first)."""
    return sorted(checkpoints, key=lambda c: c.get("step", 0), reverse=True)


SYNC_STALL_SHARE = 0.9
"""A stall this close to the write time (or longer) was a synchronous save: one figure."""


def restarts_text(s: StatusResult) -> str:
    """Every trainer start after the first, and by cause when there was any:
    "restarts 4 (crash 1, hang 1, divergence 1, spike 1)"."""
    by_cause = clean(causes_text(s.get("restarts_by_cause")), 400)
    return f"restarts {s.get('restarts', 0)}" + (f" ({by_cause})" if by_cause else "")


def save_text(s: StatusResult) -> str:
    """The newest save report: how long the step loop waited and, when the write went on
    without it, how long the write took; "" before any report."""
    name, stall, write = (
        s.get("last_save_name"),
        s.get("last_save_stall_s"),
        s.get("last_save_write_s"),
    )
    if name is None or (stall is None and write is None):
        return ""
    text = f"last save ({clean(name, 80)})"
    if stall is None:
        return f"{text} write {write:.2f} s"
    if write is None or stall >= SYNC_STALL_SHARE * write:
        return f"{text} stall {stall:.2f} s"
    return f"{text} stall {stall:.2f} s (write {write:.2f} s in the background)"


def validation_text(val: Validation) -> str:
    """The newest evaluation: its loss, step, age and per-arm losses; a nan says that it
    is reported only."""
    loss = val["loss"]
    age = val.get("age_s")
    text = f"{clean(loss) if isinstance(loss, str) else f'{loss:.4f}'} at step {val['step']}"
    text += f" ({age_text(age)} ago)" if age is not None else ""
    arms = [
        f"{clean(key[4:], 40)} {clean(value, 40) if isinstance(value, str) else f'{value:.4f}'}"
        for key, value in val.get("extras", {}).items()
        if key.startswith("val_") and isinstance(value, int | float | str)
    ]
    if arms:
        text += "   " + "  ".join(arms)
    if loss == "nan":
        text += "   (reported only: not a training divergence)"
    return text


def status_hints(s: StatusResult) -> list[str]:
    """The daemon's one-line hints: a parser that matches no line of the trainer's, names
    in the checkpoint directory that the format does not read."""
    notice = s.get("parser_no_match")
    hints = [notice["hint"]] if notice else []
    hints += [u["hint"] for u in s.get("checkpoints_unrecognised") or []]
    return hints


def handles_text(handles: list[str] | None) -> str:
    """Which of SIGTERM (stop) and SIGUSR1 (save) the trainer catches, and what a missing
    one means."""
    if handles is None:
        return "unknown"
    missing = [
        f"no {sig}: {what}"
        for sig, what in (("SIGTERM", "stop kills it unsaved"), ("SIGUSR1", "save is refused"))
        if sig not in handles
    ]
    return ", ".join([*handles, *missing]) or "none"


def format_checkpoints(view: dict[str, Any], now: float) -> str:
    """The checkpoints newest first, as the TUI lists them, then the quarantined ones with
    their reasons; read without a daemon, the first line says so."""
    lines = []
    if view.get("offline"):
        lines.append("daemon not running: read from the directory; verification as last journaled")
    lines.append(f"{'step':>10}  {'size':>10}  {'age':>8}  flags")
    for c in sorted(view["checkpoints"], key=lambda c: c["step"], reverse=True):
        flags = " ".join(
            f
            for f, on in (
                ("not-verified", not c.get("verified", True)),
                ("pinned", c["pinned"]),
                ("next-to-delete", c["next_to_delete"]),
            )
            if on
        )
        age = age_text(now - c["mtime"])
        lines.append(f"{c['step']:>10}  {size_text(c['bytes']):>10}  {age:>8}  {flags}".rstrip())
    for q in view["quarantined"]:
        what = "quarantined" if q.get("alarming", True) is not False else "set aside"
        why = f": {clean(q['why'])}" if q.get("why") else ""
        lines.append(f"{'':>10}  {what}: {clean(q['name'])}{why}")
    return "\n".join(lines)


def age_text(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


NOTICE_CHARS = 1000
"""A daemon's notice is printed whole up to this long (it names the run's path twice)."""


def describe_result(cmd: str, result: dict[str, Any]) -> str:
    text = _describe_result(cmd, result)
    notice = result.get("config_notice")
    return f"{text}\n{clean(notice, NOTICE_CHARS)}" if notice else text


def _describe_result(cmd: str, result: dict[str, Any]) -> str:
    if cmd == "save":
        if "name" in result:
            return f"checkpoint committed at step {result['step']} ({clean(result['name'])})"
        return f"save requested (trainer at step {result.get('step')}); `trainwarden checkpoints` shows it"
    if cmd in ("stop", "shutdown"):
        suffix = "; the daemon is exiting" if cmd == "shutdown" else ""
        message = result.get("message")
        if message is None:  # a daemon from before stop outcomes
            ckpt = result.get("checkpoint")
            where = f"; newest checkpoint: step {ckpt['step']}" if ckpt else ""
            return f"trainer stopped{where}{suffix}"
        what = "run" if result.get("outcome") == "not_running" else "trainer"
        state = result.get("state")
        if state not in (None, "stopped"):
            # It halted meanwhile (its loss diverged for good, a GPU fault): status says why.
            suffix = (
                f"; the run halted ({clean(str(state))}): `trainwarden status` says why{suffix}"
            )
        return f"{what} stopped: {clean(message)}{suffix}"
    if cmd == "start":
        resume = result.get("resume_step")
        return f"trainer starting from {'step ' + str(resume) if resume is not None else 'scratch'}"
    if cmd in ("pin", "unpin"):
        return f"step {result['step']} {'pinned' if result['pinned'] else 'unpinned'}"
    return orjson.dumps(result).decode()


def print_progress(message: str) -> None:
    """A progress line of a request still under way (a stop's steps), as it comes."""
    sys.stdout.write(f"{message}\n")
    sys.stdout.flush()


def stop_status(result: dict[str, Any]) -> int:
    """A stop's exit status: 0 only when it stopped as asked and lost nothing (it saved
    at its last logged step, or there was no trainer to stop); 1 when it exited without
    saving or was killed (a daemon from before outcomes: 0)."""
    return 0 if result.get("outcome") in ("saved", "not_running", None) else 1


def format_dump(d: DumpResult) -> str:
    """Where the stacks went and the main thread's innermost frames (or why none)."""
    pids = ", ".join(str(p) for p in d["pids"])
    if d["path"] is None:
        lines = [f"could not write the dump: {clean(d.get('write_error'))}"]
    else:
        lines = [f"stacks of pid {pids} written to {clean(d['path'])}"]
    if d["error"] is not None:
        lines.append(f"no Python stacks: {clean(d['error'])}")
    if d["top_frames"]:
        lines.append("main thread, innermost first:")
        lines += [f"  {clean(frame)}" for frame in d["top_frames"]]
    return "\n".join(lines)


def print_event(record: JournalRecord, as_json: bool) -> None:
    """One record: as written (--json), or as `event_line` says it."""
    if as_json:
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
    else:
        sys.stdout.write(event_line(record) + "\n")
    sys.stdout.flush()


def event_line(record: JournalRecord) -> str:
    """A record as the TUI's events panel says it: its UTC time to the second, its kind,
    then the one thing to know about it and its other fields (journal_text.summary)."""
    text = summary(dict(record))
    kind = clean(record.get("kind", "?"), 60)
    return f"{event_clock(record)}  {kind:<18} {clean(text, limit=len(text) + 1)}".rstrip()


def event_clock(record: JournalRecord) -> str:
    """`2024-05-01T12:00:00Z` from the record's Unix time (else its ts, cut to the second)."""
    t = record.get("t")
    if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t):
        with contextlib.suppress(OverflowError, OSError, ValueError):
            return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ts = clean(record.get("ts", "?"), 40)
    return f"{ts[:19]}Z" if len(ts) > 19 and ts[10] == "T" else ts
