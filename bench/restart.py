"""1. Crash -> trainer restarted: how long a crashed trainer stays down.

Every supervisor runs the same child, bench/programs/crash.py, which records
time.monotonic() as the first thing it runs and again just before os._exit(1). One
sample is the gap from a child's exit record to the next child's start record: process
teardown, the supervisor noticing, deciding and spawning, and the new interpreter
starting. The last part is the same for everyone and is measured on its own (no
supervisor: the bench itself spawns the child) as the floor.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench import containment_share
from bench.common import (
    Context,
    Section,
    Target,
    fmt_ms,
    fmt_ratio,
    latency_summary,
    program,
    read_events,
)
from bench.peers import torchrun_argv, trainwarden_config
from bench.plots import latency_cdf
from tests.support import DaemonProcess, poll

TITLE = "1. Crash -> trainer restarted"


def restart_gaps_ms(events: Path) -> list[float]:
    """Exit -> next start, in ms, for each crash in the file (the first one is warm-up)."""
    rows = sorted(read_events(events), key=lambda r: r[2])
    gaps = []
    exit_t = None
    for kind, _pid, t, _ in rows:
        if kind == "exit":
            exit_t = t
        elif kind == "start" and exit_t is not None:
            gaps.append((t - exit_t) * 1000)
            exit_t = None
    return gaps[1:]


def spawn_gaps_ms(events: Path, journal: Path) -> list[float]:
    """trainwarden only: a child's exit -> the daemon's `trainer_started` record for the
    next one (both wall-clock), i.e. crash -> restart spawned; the first is warm-up."""
    exits = sorted(float(extra[0]) for kind, _, _, extra in read_events(events)
                   if kind == "exit" and extra)  # fmt: skip
    started = []
    with contextlib.suppress(OSError):
        for line in journal.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if record.get("kind") == "trainer_started":
                    started.append(float(record["t"]))
    gaps = []
    for exit_t in exits:
        after = [t for t in started if t >= exit_t]
        if after:
            gaps.append((min(after) - exit_t) * 1000)
    return gaps[1:]


def held(events: Path) -> bool:
    """A child has started and is waiting at the gate (started, not exited)."""
    rows = sorted(read_events(events), key=lambda r: r[2])
    return bool(rows) and rows[-1][0] == "start"


@dataclass
class Contender:
    name: str
    directory: Path
    proc: subprocess.Popen[bytes] | None = None
    daemon: DaemonProcess | None = None
    problem: str = ""

    @property
    def events(self) -> Path:
        return self.directory / "events"

    @property
    def gate(self) -> Path:
        return self.directory / "gate"

    def child(self) -> list[str]:
        return program("crash.py", self.events, self.gate)

    def gaps(self) -> list[float]:
        return restart_gaps_ms(self.events)

    def stop(self, ctx: Context) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        elif self.proc is not None:
            ctx.work.stop(self.proc)


def start_all(ctx: Context, samples: int) -> list[Contender]:
    """Every supervisor up at once, each with its first child held at the gate."""
    contenders = [
        Contender(name, ctx.work.dir("restart", name.split()[0]))
        for name in ("trainwarden", "torchrun", "supervisord", "bash until-loop")
    ]
    for c in contenders:
        c.gate.touch()
        if c.name == "trainwarden":
            # A real daemon with no backoff and no crash-loop halt within the test.
            trainwarden_config(
                c.directory,
                c.child(),
                restart={
                    "backoff_initial_s": 0.0,
                    "backoff_max_s": 0.0,
                    "max_restarts_without_progress": 1_000_000,
                },
            )
            c.daemon = ctx.work.daemon(c.directory).start()
            c.proc = c.daemon.proc
        elif c.name == "torchrun":
            c.proc = ctx.work.popen(
                torchrun_argv(c.child(), max_restarts=samples * 2 + 10),
                cwd=c.directory,
                stdout=c.directory / "torchrun.log",
            )
        elif c.name == "supervisord":
            supervisord = ctx.peers.supervisord
            if supervisord.available():
                c.proc = supervisord.start(c.directory, c.child())
            else:
                c.problem = f"not measured: {supervisord.error}"
        else:
            c.proc = ctx.work.popen(
                ["bash", "-c", 'while true; do "$@"; done', "loop", *c.child()],
                cwd=c.directory,
                stdout=c.directory / "loop.log",
            )
    for c in contenders:
        if c.proc is not None and not poll(lambda c=c: held(c.events), 120.0, 0.05):
            c.problem = "its first child never started"
    return [c for c in contenders if c.proc is not None and not c.problem] + [
        c for c in contenders if c.proc is None or c.problem
    ]


def take_turn(c: Contender, count: int, timeout: float) -> None:
    """Let c's trainer crash-loop for `count` restarts, then hold it at the gate again."""
    if c.proc is None or c.problem:
        return
    target = len(c.gaps()) + count
    c.gate.unlink()
    done = poll(lambda: len(c.gaps()) >= target or c.proc.poll() is not None, timeout, 0.02)
    c.gate.touch()
    if c.proc.poll() is not None:
        c.problem = f"the supervisor exited ({c.proc.returncode}) after {len(c.gaps())} restarts"
    elif not done:
        c.problem = f"only {len(c.gaps())} restarts; gave up"
    # Wait for the next child to be held, so no restart runs during another's turn.
    poll(lambda: held(c.events), 10.0, 0.02)


def floor_turn(events: Path, count: int) -> None:
    """No supervisor: spawn the child from here and time spawn -> its first instruction."""
    for _ in range(count):
        before = time.monotonic()
        subprocess.run(program("crash.py", events), stdout=subprocess.DEVNULL, check=False)
        with open(events, "a") as f:
            f.write(f"spawn 0 {before!r}\n")


def floor_ms(events: Path) -> list[float]:
    rows = read_events(events)
    spawns = [t for kind, _, t, _ in rows if kind == "spawn"]
    starts = [t for kind, _, t, _ in rows if kind == "start"]
    return [(start - spawn) * 1000 for spawn, start in zip(spawns, starts, strict=False)][1:]


def run(ctx: Context) -> Section:
    samples = 7 if ctx.quick else 60
    per_turn = 4 if ctx.quick else 5
    contenders = start_all(ctx, samples)
    floor_events = ctx.work.dir("restart", "floor") / "events"
    try:
        # Turns of a few restarts each, round after round, so every supervisor sees the
        # same mix of quiet and busy moments on a shared machine.
        for _ in range(math.ceil((samples + 1) / per_turn)):
            for c in contenders:
                take_turn(c, per_turn, 30 + per_turn * 4.0)
            floor_turn(floor_events, per_turn)
    finally:
        for c in contenders:
            c.stop(ctx)  # a daemon's stop() also kills any trainer it leaves behind
    gaps = {c.name: c.gaps()[:samples] for c in contenders}
    problems = {c.name: c.problem for c in contenders}
    results = {name: latency_summary(values) for name, values in gaps.items()}
    floor = floor_ms(floor_events)[:samples]
    floor_summary = latency_summary(floor)
    share, no_share = containment_share.measure(
        ctx.work.dir("restart", "cgroups"), 3 if ctx.quick else 15
    )
    tw_dir = next(c.directory for c in contenders if c.name == "trainwarden")
    spawned = spawn_gaps_ms(tw_dir / "events", tw_dir / ".trainwarden" / "journal.jsonl")
    spawned_summary = latency_summary(spawned[:samples])
    spared, starts = spare_starts(tw_dir / ".trainwarden" / "journal.jsonl")

    tw = results["trainwarden"]
    section = Section(
        key="restart",
        title=TITLE,
        intro=(
            "A trainer that crashes 0.4 s after it starts (it prints one step line, sleeps, "
            "then `os._exit(1)`; a step line, so that the daemon journals every start: a "
            "crash loop of starts that log no step is folded into `repeated` records; 0.4 s, "
            "so that trainwarden's spare start, made 0.2 s into each start, is ready, as it "
            "is for any trainer that ran a while), restarted by each supervisor with no "
            "backoff: trainwarden "
            "(`backoff_initial_s = 0`), torchrun's elastic agent (`--max-restarts`, default "
            "`--monitor-interval` 0.1 s), supervisord (`autorestart=true`, `startsecs=0`) and "
            "a bash `while true` loop. Latency = the child's last instruction before the "
            "crash -> the next child's first instruction, both `time.monotonic()` written "
            "by the child itself. The child is `python -S crash.py` everywhere, so "
            "the interpreter's own start-up (the floor row: the bench spawning the child "
            f"itself, median {fmt_ms(floor_summary['p50_ms'])} ms) is in every figure. All "
            "four supervisors run at once; a gate file holds each one's child (after its "
            f"start record, before its crash) while the others take their turn of {per_turn} "
            "crashes, round after round, so every contender sees the same mix of quiet and "
            "busy moments on the shared machine. For trainwarden alone, the daemon's journal "
            "also gives crash -> restart *spawned* (its `trainer_started` record, written "
            "once the new process exists), the figure DESIGN.md's target names."
        ),
        header=[
            "supervisor",
            "restarts",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "p99 / trainwarden's",
            "p50 above the floor",
        ],  # fmt: skip
        plots=["restart_latency.png"],
    )

    def row(name: str, r: dict[str, float], ratio: str, above: str) -> list[str]:
        return [name, str(r["n"]), fmt_ms(r["p50_ms"]), fmt_ms(r["p90_ms"]),
                fmt_ms(r["p99_ms"]), fmt_ms(r["max_ms"]), ratio, above]  # fmt: skip

    for name in ("trainwarden", "torchrun", "supervisord", "bash until-loop"):
        r = results.get(name)
        if not r or not r["n"]:
            section.rows.append([name, "0", "-", "-", "-", "-", "-", problems.get(name) or "-"])
            continue
        ratio = fmt_ratio(r["p99_ms"] / tw["p99_ms"]) if tw["n"] else "-"
        above = f"{fmt_ms(r['p50_ms'] - floor_summary['p50_ms'])} ms"
        section.rows.append(row(name, r, ratio, above))
    section.rows.append(row("(floor: no supervisor)", floor_summary, "", "0"))
    if spawned_summary["n"]:
        section.rows.append(row("trainwarden, crash -> spawned (journal)", spawned_summary, "", ""))
    for name, problem in problems.items():
        if problem:
            section.notes.append(f"{name}: {problem}.")
    latency_cdf(
        ctx.out / "restart_latency.png",
        {**gaps, "floor (no supervisor)": floor},
        "Crash -> next trainer's first instruction",
    )
    section.raw = {
        "samples_ms": {**gaps, "floor": floor, "trainwarden_spawned": spawned[:samples]},
        "summary": {**results, "floor": floor_summary, "trainwarden_spawned": spawned_summary},
        "problems": problems,
        "containment_share": containment_share.summary(share) if share else no_share,
        "spare_starts": {"restarts": starts, "in a spare": spared},
    }
    if share:
        section.extra_markdown = containment_share.table(share)
        section.notes.append(
            "Containment's share (the table above): a start's process is in its cgroup "
            "before it executes the trainer, so nothing the trainer forks starts outside. "
            "Spawned, the child joins before its exec: the preexec_fn that does it makes "
            "Python fork() the daemon instead of vfork(), and the move itself waits for an "
            "RCU grace period in the kernel (cgroup_threadgroup_rwsem), unless another move "
            "came just before or cgroup2 is mounted with `favordynmods`; a move by the "
            "daemon after a vfork spawn costs the same wait and leaves the trainer running "
            "outside meanwhile. So the daemon pays both ahead of time: 0.2 s into each "
            "start it spawns (vfork) a spare interpreter that joins the next start's cgroup "
            "and waits; the restart hands it argv, environment and run log, and it executes "
            f"the trainer (shell.spare). Here {spared} of {starts} restarts ran in a spare; "
            "a start that dies within 0.2 s restarts through a spawn (the last row above)."
        )
    else:
        section.notes.append(f"Containment's share not measured: {no_share}.")
    tr = results.get("torchrun", {"n": 0})
    ratio = tr["p99_ms"] / tw["p99_ms"] if tw["n"] and tr["n"] else float("nan")
    end_to_end_ok = bool(tw["n"]) and tw["p99_ms"] < 50
    section.targets += [
        Target(
            "crash -> restarted trainer's first instruction p99 < 50 ms (trainwarden)",
            f"{fmt_ms(tw['p99_ms'])} ms",
            end_to_end_ok,
            ""
            if end_to_end_ok
            else (
                f"the floor alone (starting the same child with no supervisor) has p99 "
                f"{fmt_ms(floor_summary['p99_ms'])} ms on this machine; trainwarden's own part "
                f"(crash -> new process spawned, from its journal) has p50 "
                f"{fmt_ms(spawned_summary['p50_ms'])} ms and p99 "
                f"{fmt_ms(spawned_summary['p99_ms'])} ms, the rest is the new interpreter "
                "starting on a busy 2-core machine"
            ),
        ),
        Target(
            "crash -> restart spawned p99 < 50 ms (trainwarden, from its journal)",
            f"{fmt_ms(spawned_summary['p99_ms'])} ms",
            spawned_summary["p99_ms"] < 50 if spawned_summary["n"] else None,
        ),
        Target(
            "crash -> restart spawned p99 < 15 ms (trainwarden, from its journal)",
            f"{fmt_ms(spawned_summary['p99_ms'])} ms",
            spawned_summary["p99_ms"] < 15 if spawned_summary["n"] else None,
            _share_why(share) if share else "",
        ),
        Target(
            "trainwarden p99 >= 5x lower than torchrun's agent",
            fmt_ratio(ratio),
            ratio >= 5 if ratio == ratio else None,
        ),
    ]
    _explain(section, gaps)
    return section


def _share_why(share: dict[str, list[float]]) -> str:
    s = containment_share.summary(share)
    join = s[containment_share.JOINED]
    vfork = s["vfork spawn"]
    return (
        f"a start not run in a spare joins its cgroup before the exec: "
        f"{fmt_ms(join['p50_ms'])} ms p50 (max {fmt_ms(join['max_ms'])}) where a bare vfork "
        f"spawn takes {fmt_ms(vfork['p50_ms'])} ms (containment's share, below)"
    )


def spare_starts(journal: Path) -> tuple[int, int]:
    """(restarts run in a spare, restarts) from the daemon's `trainer_started` records."""
    spared = starts = 0
    with contextlib.suppress(OSError):
        for line in journal.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if record.get("kind") == "trainer_started" and record.get("seg", 1) > 1:
                    starts += 1
                    spared += bool(record.get("spare"))
    return spared, starts


def _explain(section: Section, gaps: dict[str, list[float]]) -> None:
    sd = gaps.get("supervisord") or []
    if sd:
        fast = sum(g < 200 for g in sd)
        one = sum(200 <= g < 1500 for g in sd)
        two = sum(g >= 1500 for g in sd)
        section.notes.append(
            "supervisord restarts from its main loop, which waits up to 1 s in select() "
            "between passes; SIGCHLD does not cut that wait short (the handler only queues "
            "the signal and Python retries the interrupted select). Each pass runs "
            "`transition()` (which respawns) before `reap()` (which notices the exit), so a "
            "respawn needs one more wake-up after the reap: some event on a pipe if one "
            f"comes, else the 1 s timeout. Here {fast} of {len(sd)} gaps were under 0.2 s, "
            f"{one} between 0.2 and 1.5 s and {two} over 1.5 s."
        )
    if gaps.get("torchrun"):
        section.notes.append(
            "torchrun's agent looks at its worker every `--monitor-interval` (0.1 s by "
            "default); on a failure it restarts the whole worker group: it stops the "
            "workers, runs a new rendezvous round and starts them again."
        )
    section.notes.append(
        "The last column is what each supervisor adds to the floor (medians; it can come "
        "out slightly negative where a supervisor's spawn is as cheap as the bench's own). "
        "The first restart of each supervisor is left out as warm-up."
    )
