"""A journal record as one line of text: the one thing to know about it, then its other
fields. The TUI's events panel and `trainwarden events` both print records this way, and
the figures beside them (a loss, a count, a rate, a duration) are written here once for
`trainwarden status` and the TUI alike.

Standard library, orjson and the core's vocabulary only: the TUI imports it, and a CLI
command pays nothing for it.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from trainwarden.supervisor.core.kinds import Kind

HINTED = frozenset({Kind.PARSER_NO_MATCH, Kind.CHECKPOINT_UNRECOGNISED})
"""Records whose one-line hint says all they hold."""
LEFT_OUT = frozenset({Kind.STATE})
"""Kinds the one-line views (the TUI's events panel, `trainwarden events`) leave out unless
asked for by name: a state snapshot is written at every transition, several hundred
characters each, and says nothing a reader needs there."""
SKIPPED_FIELDS = ("ts", "t", "kind", "argv")
"""Fields a summary leaves out: the time and kind are shown beside it, the argv is long."""
UNKNOWN = "-"


def summary(record: dict[str, Any]) -> str:
    """The one thing to know about a record, then its other fields."""
    return " ".join(summary_pieces(record))


def summary_pieces(record: dict[str, Any]) -> list[str]:
    """The summary as the pieces it may be shortened by: the head's words, then whole
    key=value fields (a field is never split, so no number is cut in two)."""
    kind = record.get("kind")
    if kind == Kind.CRASH and record.get("cause"):
        head = f"{record['cause']}"
    elif kind in HINTED and record.get("hint"):
        return words(f"{record['hint']}")  # it names everything the record holds
    elif kind == Kind.SPAWN:
        resume = record.get("resume") or {}
        step = resume.get("step") if isinstance(resume, dict) else None
        head = f"seg {record.get('seg')}, " + (
            f"resume from step {step}" if step is not None else "fresh start"
        )
        if record.get("pivot"):
            head += ", pivot"
        return words(head)
    elif kind == Kind.STATE and isinstance(record.get("state"), dict):
        state = record["state"]
        head = f"{state.get('phase')}, seg {state.get('seg')}, restarts {state.get('restarts')}"
        if state.get("halt_reason"):
            head += f": {state['halt_reason']}"
    elif kind == Kind.RESTART_SCHEDULED and "backoff_s" in record:
        head = f"in {record['backoff_s']} s"
    elif kind == Kind.SPIKE:
        head = (
            f"loss {loss_text(record.get('peak'))} from step {record.get('first_step')}"
            f" to {record.get('step')}, above {loss_text(record.get('threshold'))}"
        )
    elif kind == Kind.HANG_DUMP:
        return words(hang_dump_text(record))
    elif kind == Kind.SLURM_JOB:
        return words(slurm_text(record))
    elif kind == Kind.REPEATED:
        return words(repeated_text(record))
    elif kind == Kind.ROLLBACK:
        window = record.get("window")
        skip = f", skip {window[0]}..{window[1]}" if isinstance(window, list) else ", no skip"
        head = f"to step {record.get('step')}{skip}, lr x{record.get('lr_scale')}"
    else:
        head = ""
    rest = [
        f"{key}={_short(value)}"
        for key, value in record.items()
        if key not in SKIPPED_FIELDS and not (kind == Kind.CRASH and key == "cause")
    ]
    return [*words(head), *rest]


def repeated_text(record: dict[str, Any]) -> str:
    """A fast crash loop's folded cycles: how many more of the same crash, and its cause."""
    last = record.get("last")
    crash = last.get("crash") if isinstance(last, dict) else None
    cause = crash.get("cause") if isinstance(crash, dict) else None
    said = (
        f", last line: {crash['last_line']}"
        if isinstance(crash, dict) and crash.get("last_line")
        else ""
    )
    going = " so far" if record.get("ongoing") else ""
    return f"{record.get('cycles')} more crashes like the last{going} ({cause or 'crash'}{said})"


def hang_dump_text(record: dict[str, Any]) -> str:
    """Where the stacks went (from the run's .trainwarden/ on) and the innermost frame, or why
    there are no Python stacks."""
    path = record.get("path")
    where = str(path) if path else "not written"
    if isinstance(path, str) and "/.trainwarden/" in path:
        where = ".trainwarden/" + path.rsplit("/.trainwarden/", 1)[1]
    frames = record.get("top_frames")
    if isinstance(frames, list) and frames:
        return f"{where} in {frames[0]}"
    return f"{where}, no Python stacks: {record.get('error') or 'none found'}"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def count_text(value: Any) -> str:
    """A step or any count: 1234567 -> "1,234,567"."""
    return f"{int(value):,}" if _finite(value) else UNKNOWN


def rate_text(value: Any) -> str:
    """Steps a minute: whole with separators from 100 on ("3,515"), one decimal below."""
    if not _finite(value):
        return UNKNOWN
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def compact_text(value: Any) -> str:
    """A large figure in three digits: 12880 -> "12.9k", 3.2e6 -> "3.20M"."""
    if not _finite(value):
        return UNKNOWN
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            scaled = value / threshold
            return f"{scaled:.2f}{suffix}" if scaled < 10 else f"{scaled:.1f}{suffix}"
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def duration_text(seconds: Any) -> str:
    """Two units at most: "45s", "12m 05s", "3h 04m", "6d 02h"."""
    if not _finite(seconds):
        return UNKNOWN
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def loss_text(value: Any) -> str:
    """A loss to four decimals; the journal writes non-finite ones as "nan"/"inf"."""
    if isinstance(value, str):
        return value
    if not isinstance(value, int | float) or isinstance(value, bool):
        return UNKNOWN
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4f}"


def causes_text(causes: Any) -> str:
    """The restarts by cause, as `status` and the TUI's header write them:
    "crash 2, divergence 1, spike 1" ("" when there is none)."""
    if not isinstance(causes, dict):
        return ""
    return ", ".join(
        f"{cause} {n}"
        for cause, n in causes.items()
        if isinstance(n, int) and not isinstance(n, bool) and n > 0
    )


def slurm_text(job: Any) -> str:
    """The Slurm job as `trainwarden status` and the journal write it: "job 4242 (train-gpt)
    on node01, segment 3 (restart count 2), time limit 2h 00m, ends in 1h 12m, 4m 10s
    between segments" (the end only where `ends_in_s` is given, the time between segments
    from the second segment on)."""
    if not isinstance(job, dict):
        return ""
    name = f" ({job['name']})" if job.get("name") else ""
    node = f" on {job['node']}" if job.get("node") else ""
    segment = _segment_of(job)
    restarts = job.get("restart_count")
    count = f" (restart count {restarts})" if isinstance(restarts, int) else ""
    where = f", segment {segment}{count}" if segment is not None else ""
    limit = job.get("time_limit_s")
    if _finite(limit):
        limit_text = f"time limit {duration_text(limit)}"
    elif job.get("limit_note") == "unlimited":
        limit_text = "no time limit"
    else:
        limit_text = f"time limit {job.get('limit_note') or 'unknown'}"
    ends = f", ends in {duration_text(job['ends_in_s'])}" if _finite(job.get("ends_in_s")) else ""
    lost = job.get("lost_s")
    between = (
        f", {duration_text(lost)} between segments"
        if _finite(lost) and isinstance(segment, int) and segment > 1
        else ""
    )
    return f"job {job.get('job_id')}{name}{node}{where}, {limit_text}{ends}{between}"


def _segment_of(job: dict[str, Any]) -> int | None:
    """The segment's number (records from before segments were counted: restart count + 1)."""
    segment = job.get("segment")
    if isinstance(segment, int):
        return segment
    restarts = job.get("restart_count")
    return restarts + 1 if isinstance(restarts, int) else None


def slurm_short_text(job: Any, ends_in_s: Any = None) -> str:
    """The Slurm job in a few cells, for the TUI's header: "job 4242 seg 3 ends 1h 12m"."""
    if not isinstance(job, dict):
        return ""
    segment = _segment_of(job)
    where = f" seg {segment}" if segment is not None else ""
    ends = f" ends {duration_text(ends_in_s)}" if _finite(ends_in_s) else ""
    return f"job {job.get('job_id')}{where}{ends}"


def words(text: str) -> list[str]:
    """The words of `text`, as a summary's head is split into pieces."""
    return [word for word in text.split(" ") if word]


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode(errors="replace")
