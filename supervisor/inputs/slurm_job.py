"""The Slurm job the daemon runs in, if any: read from its environment, and its time limit
from `scontrol show job -o` (Slurm does not export the limit).

The parsing is pure (`job_from_env`, `limit_from_show_job` and the field parsers); the one
read that does I/O, `read_limit`, runs `scontrol` once with a deadline and never raises:
whatever goes wrong leaves the limit unknown, with the reason in words.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

SCONTROL_TIMEOUT_S = 5.0
"""How long `scontrol show job` may take before the limit is left unknown."""

NO_TIME = frozenset({"", "Unknown", "None", "N/A", "(null)"})
"""What scontrol writes for a time it does not have (a pending job's start and end)."""
UNLIMITED = frozenset({"UNLIMITED", "INFINITE"})

_FIELD = re.compile(r"(?:^| )([A-Za-z][\w:/]*)=")
_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


@dataclass(frozen=True)
class SlurmJob:
    """What the environment says about the job (`SLURM_*`)."""

    job_id: str
    name: str | None
    node: str | None
    """SLURMD_NODENAME; else the job's node list, else the host name."""
    partition: str | None
    restart_count: int
    """SLURM_RESTART_COUNT: how many times Slurm requeued the job (absent: 0)."""


@dataclass(frozen=True)
class JobLimit:
    """The job's time limit and when it ends, as scontrol told them."""

    time_limit_s: int | None
    end_time: float | None
    """Wall-clock seconds (epoch) when Slurm ends the job."""
    unknown: str | None = None
    """Why the limit is not known, in words (None when it is, or when there is none)."""
    unlimited: bool = False
    requeue: bool | None = None
    """Whether Slurm would take a requeue of the job (its Requeue= field; None: not said)."""


def job_from_env(env: Mapping[str, str], hostname: str) -> SlurmJob | None:
    """The job the environment names, or None outside a Slurm job."""
    job_id = (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "").strip()
    if not job_id:
        return None
    node = (
        env.get("SLURMD_NODENAME")
        or env.get("SLURM_NODELIST")
        or env.get("SLURM_JOB_NODELIST")
        or hostname
        or None
    )
    restarts = env.get("SLURM_RESTART_COUNT", "").strip()
    return SlurmJob(
        job_id=job_id,
        name=env.get("SLURM_JOB_NAME") or None,
        node=node,
        partition=env.get("SLURM_JOB_PARTITION") or None,
        restart_count=int(restarts) if restarts.isdigit() else 0,
    )


def show_job_fields(line: str) -> dict[str, str]:
    """`scontrol show job -o`'s `Key=value` pairs (keys may hold `:` and `/`; a value runs
    to the next key)."""
    marks = list(_FIELD.finditer(line))
    return {
        m.group(1): line[
            m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(line)
        ].strip()
        for i, m in enumerate(marks)
    }


def parse_duration(text: str) -> int | None:
    """Slurm's `[days-]hours:minutes:seconds` (and its shorter `minutes[:seconds]`) in
    seconds; None for anything else (UNLIMITED, Partition_Limit, NOT_SET)."""
    m = _DURATION.match(text.strip())
    if m is None:
        return None
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    assert a is not None
    if days is not None:
        # With days, the rest is hours[:minutes[:seconds]].
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:
        return a * 3600 + (b or 0) * 60 + c
    # minutes, or minutes:seconds
    return a * 60 + (b or 0)


def parse_time(text: str) -> float | None:
    """A time as scontrol writes it (`2026-12-05T16:02:19`, local time) in epoch seconds;
    None for Unknown, None, N/A or anything unreadable."""
    text = text.strip()
    if text in NO_TIME:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def limit_from_show_job(line: str) -> JobLimit:
    """The limit and end time in one `scontrol show job -o` line. A pending job has no end
    time yet (EndTime=Unknown); one without a limit (UNLIMITED) has neither."""
    fields = show_job_fields(line)
    if "JobId" not in fields:
        return JobLimit(None, None, unknown="scontrol printed no job")
    raw = fields.get("TimeLimit", "")
    limit = parse_duration(raw)
    end = parse_time(fields.get("EndTime", ""))
    requeue = {"0": False, "1": True}.get(fields.get("Requeue", ""))
    if raw.upper() in UNLIMITED:
        return JobLimit(None, None, unlimited=True, requeue=requeue)
    if limit is None:
        unknown = f"scontrol says TimeLimit={raw or 'nothing'}"
        return JobLimit(None, end, unknown=unknown, requeue=requeue)
    return JobLimit(limit, end, requeue=requeue)


def scontrol(*args: str, timeout: float = SCONTROL_TIMEOUT_S) -> tuple[str | None, str]:
    """`scontrol ARGS`: (None, its output) when it exits 0, else (why not in words, its
    output); never raises (blocking: call it from a thread)."""
    try:
        done = subprocess.run(
            ["scontrol", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError:
        return "scontrol not found", ""
    except subprocess.TimeoutExpired:
        return f"scontrol did not answer in {timeout:g} s", ""
    except OSError as e:
        return f"scontrol could not run: {e.strerror or e}", ""
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        why = said[-1][:200] if said else "no message"
        return f"scontrol exited {done.returncode}: {why}", done.stdout + done.stderr
    return None, done.stdout


def first_line(text: str) -> str | None:
    return next((line for line in text.splitlines() if line.strip()), None)


def read_limit(job_id: str, timeout: float = SCONTROL_TIMEOUT_S) -> JobLimit:
    """The job's limit from `scontrol show job -o JOB_ID`; never raises (blocking: call it
    from a thread)."""
    error, out = scontrol("show", "job", "-o", job_id, timeout=timeout)
    if error is not None:
        return JobLimit(None, None, unknown=error)
    line = first_line(out)
    if line is None:
        return JobLimit(None, None, unknown="scontrol printed no job")
    return limit_from_show_job(line)


REQUEUE_MARGIN_S = 10.0
"""How long before the job's end time the requeue must be done: Slurm sends SIGTERM at the
end, and a job it ends is TIMEOUT, not requeued."""

UNKNOWN_END_WINDOW_S = 60.0
"""How long the stop may take when the signal came and the job's end time is not known."""


def seconds_left(end_time: float | None, wall: float) -> float:
    """How long the stop before a requeue may take, from `wall` (time.time()): up to
    REQUEUE_MARGIN_S before the job's end, UNKNOWN_END_WINDOW_S when the end is not known."""
    if end_time is None:
        return UNKNOWN_END_WINDOW_S
    return max(end_time - wall - REQUEUE_MARGIN_S, 0.0)


def act_at(end_time: float | None, lead_s: float) -> float | None:
    """When (time.time()) to leave the job without its signal: `lead_s` before its end;
    None with no end time or lead_s 0 (only the signal)."""
    if end_time is None or lead_s <= 0:
        return None
    return end_time - lead_s


def requeue(job_id: str, timeout: float = SCONTROL_TIMEOUT_S) -> str | None:
    """`scontrol requeue JOB_ID`: None when Slurm took it, else why not, in words (never
    raises; blocking: call it from a thread)."""
    return scontrol("requeue", job_id, timeout=timeout)[0]


@dataclass(frozen=True)
class Segment:
    """This job segment's place in the run (see protocol.SlurmJobRecord)."""

    number: int
    gap_s: float | None
    lost_s: float


def next_segment(earlier: int, lost_s: float, last_t: float | None, start_t: float) -> Segment:
    """The segment a daemon starting at `start_t` (time.time()) begins, after `earlier`
    segments that lost `lost_s` between them, the journal's last record written at
    `last_t`. A clock set back makes no negative gap."""
    if earlier == 0 or last_t is None:
        return Segment(earlier + 1, None, round(lost_s, 3))
    gap = round(max(start_t - last_t, 0.0), 3)
    return Segment(earlier + 1, gap, round(lost_s + gap, 3))


def job_state(job_id: str, timeout: float = SCONTROL_TIMEOUT_S) -> str | None:
    """The job's state as `scontrol show job -o` says it (RUNNING, COMPLETED, PENDING, ...);
    "" when Slurm knows no such job (it forgets ended ones after MinJobAge); None when it
    could not be asked (never raises; blocking: call it from a thread)."""
    error, out = scontrol("show", "job", "-o", job_id, timeout=timeout)
    if error is not None:
        return "" if "Invalid job id" in out else None
    line = first_line(out)
    if line is None:
        return ""
    state = show_job_fields(line).get("JobState", "")
    return state.split()[0] if state else None


def output_truncated(env: Mapping[str, str]) -> str | None:
    """The job's output file when sbatch opens it to be truncated (SLURM_OPEN_MODE=t, the
    default --open-mode): a requeued segment's start erases the earlier segments' output.
    None when it appends, or where the environment does not say. (The descriptor cannot
    tell: slurmstepd opens with O_APPEND in both modes and truncates first.)"""
    if env.get("SLURM_OPEN_MODE") != "t":
        return None
    try:
        return os.readlink("/proc/self/fd/1")
    except OSError:
        return "the job's output file"
