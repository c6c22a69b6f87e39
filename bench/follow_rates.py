"""7. Log following at 10, 100 and 10,000 lines/s: CPU per line, line-to-event latency,
parse throughput.

The daemon supervises bench/programs/rate_trainer.py, which logs step lines at a rate
read from a file and notes each line's write time (time.time() just before the write)
in a stamps file outside the run directory. For each rate, after a settling pause:

- CPU: utime + stime of the daemon process (all threads) over the window, per line
  written in it.
- Latency: for every line written in the window, the daemon's own `t` for that step in
  `.loss.json` (time.time() when the line had been parsed and handed to the policy)
  minus the line's write time. Same clock, same machine: no offsets to correct.
- Floor: bench/programs/floor_follower.py, the least a Python program can do to react
  to each line (an asyncio loop woken by inotify, reading and counting newlines), at the
  same rates: what one wake-up per line costs on this machine.
- watchdog floor: bench/programs/watchdog_follower.py, the same loop handed each line's
  event by watchdog's inotify observer: what following through watchdog would cost the
  daemon before any work of its own (the daemon keeps its own binding; docs/benchmarks.md).
- Both floors' latency: each line's write time to the end of the follower's first read
  that reached it (the followers keep those times in memory and write them when stopped),
  beside the daemon's.

Parse throughput is the configured parser (step-line) on the lines this trainer writes,
in process, best of 3.
"""

from __future__ import annotations

import bisect
import math
import time
from pathlib import Path
from typing import Any

import orjson

from bench.bench_parse import lines_per_s
from bench.common import (
    PROGRAMS,
    PYTHON,
    Context,
    Section,
    Target,
    fmt_ms,
    latency_summary,
    measure,
    program,
    read_events,
)
from bench.peers import trainwarden_config
from bench.plots import bars_per_group, latency_cdf
from tests.support import poll
from trainwarden.plugins.parsers.step_line import StepLineParser

TITLE = "7. Log following at 10, 100 and 10,000 lines/s"
RATES = (10, 100, 10_000)
CPU_TARGET_PCT = 0.5
PARSE_TARGET = 500_000
WATCHDOG = "watchdog_follower.py"
"""Run without -S (watchdog is a site package), unlike the other programs."""


def read_stamps(path: Path) -> dict[int, float]:
    """step -> write time (time.time()) from the trainer's stamps file."""
    stamps: dict[int, float] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return stamps
    for line in text.splitlines():
        step, _, written = line.partition(" ")
        try:
            stamps[int(step)] = float(written)
        except ValueError:
            continue  # the line being written as we read
    return stamps


def read_seen(path: Path) -> dict[int, float]:
    """step -> the daemon's `t` for it in .loss.json."""
    seen: dict[int, float] = {}
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return seen
    for line in data.splitlines():
        try:
            record = orjson.loads(line)
            seen[int(record["step"])] = float(record["t"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return seen


def latencies_ms(stamps: dict[int, float], seen: dict[int, float], steps: range) -> list[float]:
    return [(seen[s] - stamps[s]) * 1000 for s in steps if s in stamps and s in seen]


def last_step(stamps_path: Path) -> int:
    stamps = read_stamps(stamps_path)
    return max(stamps) if stamps else 0


def follow_daemon(
    ctx: Context, window: dict[int, float], settle: float
) -> tuple[dict[int, dict[str, Any]], str]:
    directory = ctx.work.dir("follow", "trainwarden")
    rate_file, events, stamps = directory / "rate", directory / "events", directory / "stamps"
    run = directory / "run"
    run.mkdir()
    rate_file.write_text(str(RATES[0]))
    child = program(
        "rate_trainer.py", "--rate-file", rate_file, "--events", events, "--stamps", stamps
    )
    trainwarden_config(run, child)
    daemon = ctx.work.daemon(run).start()
    figures: dict[int, dict[str, Any]] = {}
    try:
        if not poll(lambda: read_events(events), 60.0):
            return figures, "the trainer did not start within 60 s"
        for rate in RATES:
            rate_file.write_text(str(rate))
            time.sleep(settle)
            first = last_step(stamps) + 1
            assert daemon.proc is not None
            f: dict[str, Any] = dict(measure(daemon.proc.pid, run / "training.log", window[rate]))
            last = last_step(stamps)
            # Let the daemon catch up with the window's last lines before reading its view.
            poll(lambda: last in read_seen(run / ".loss.json"), 10.0)  # noqa: B023
            ms = latencies_ms(
                read_stamps(stamps), read_seen(run / ".loss.json"), range(first, last + 1)
            )
            f["latency"] = latency_summary(ms)
            f["latency_samples_ms"] = ms
            f["lines_written"] = last - first + 1
            figures[rate] = f
    finally:
        daemon.stop()
    return figures, ""


def read_follower_seen(seen_path: Path, log: Path) -> dict[int, float]:
    """step -> the time a floor follower had read that step's line: the first of its reads
    (`OFFSET TIME`, the log's length after the read) that reached the line's end."""
    offsets: list[int] = []
    times: list[float] = []
    try:
        text = seen_path.read_text()
    except FileNotFoundError:
        return {}
    for line in text.splitlines():
        offset, _, t = line.partition(" ")
        offsets.append(int(offset))
        times.append(float(t))
    seen: dict[int, float] = {}
    end = 0
    for logged in log.read_bytes().splitlines(keepends=True):
        end += len(logged)
        read = bisect.bisect_left(offsets, end)
        if logged.startswith(b"step: ") and read < len(offsets):
            seen[int(logged[6:].partition(b",")[0])] = times[read]
    return seen


def follow_floor(
    ctx: Context, window: dict[int, float], settle: float, argv: list[str] | None = None
) -> dict[int, dict[str, Any]]:
    """A floor follower's CPU and write -> read latency at each rate: floor_follower.py,
    or `argv` + the log."""
    name = "floor" if argv is None else "watchdog"
    directory = ctx.work.dir("follow", name)
    rate_file, events, log = directory / "rate", directory / "events", directory / "training.log"
    stamps, seen = directory / "stamps", directory / "seen"
    rate_file.write_text(str(RATES[0]))
    log.write_bytes(b"")
    trainer = ctx.work.popen(
        program(
            "rate_trainer.py", "--rate-file", rate_file, "--events", events, "--stamps", stamps
        ),
        cwd=directory,
        stdout=log,
    )
    argv = program("floor_follower.py", log, seen) if argv is None else [*argv, str(log), str(seen)]
    follower = ctx.work.popen(argv, cwd=directory)
    figures: dict[int, dict[str, Any]] = {}
    windows: dict[int, range] = {}
    try:
        if not poll(lambda: read_events(events), 60.0):
            return figures
        for rate in RATES:
            rate_file.write_text(str(rate))
            time.sleep(settle)
            first = last_step(stamps) + 1
            figures[rate] = dict(measure(follower.pid, log, window[rate]))
            windows[rate] = range(first, last_step(stamps) + 1)
        time.sleep(0.5)  # the window's last lines read before the follower is stopped
    finally:
        ctx.work.stop(follower)
        ctx.work.stop(trainer)
    written, read = read_stamps(stamps), read_follower_seen(seen, log)
    for rate, steps in windows.items():
        ms = latencies_ms(written, read, steps)
        figures[rate]["latency"] = latency_summary(ms)
        figures[rate]["latency_samples_ms"] = ms
    return figures


def without_samples(figures: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {
        rate: {k: v for k, v in f.items() if k != "latency_samples_ms"}
        for rate, f in figures.items()
    }


def fmt_p99(figures: dict[str, Any]) -> str:
    latency = figures.get("latency")
    return fmt_ms(latency["p99_ms"]) if latency and latency["n"] else "-"


def parse_throughput(n_lines: int) -> float:
    parser = StepLineParser({})
    lines = [f"step: {i}, loss: {5.0 - 1e-6 * i:.6f}, dt: 0.0001" for i in range(1, n_lines + 1)]
    assert parser.parse(lines[0]) is not None
    return lines_per_s(parser.parse, lines)  # best of 3


def run(ctx: Context) -> Section:
    if ctx.quick:
        window = {10: 3.0, 100: 2.0, 10_000: 2.0}
        settle, n_parse = 0.5, 20_000
    else:
        window = {10: 30.0, 100: 15.0, 10_000: 10.0}
        settle, n_parse = 2.0, 200_000
    figures, problem = follow_daemon(ctx, window, settle)
    floor = follow_floor(ctx, window, settle)
    through_watchdog = follow_floor(ctx, window, settle, [PYTHON, str(PROGRAMS / WATCHDOG)])
    parsed_per_s = parse_throughput(n_parse)

    section = Section(
        key="follow",
        title=TITLE,
        intro=(
            "The daemon follows a log that the trainer appends one flushed step line at a "
            f"time, at {', '.join(f'{r:,}' for r in RATES)} lines/s ({', '.join(f'{window[r]:g}' for r in RATES)} s "
            f"windows after {settle:g} s of settling). CPU: utime + stime of the daemon "
            "process, all threads, over the window, divided by the lines written in it. "
            "Latency: each line's write time (the trainer's time.time() just before the "
            "write) to the daemon's time for that step in `.loss.json` (parsed and handed "
            "to the policy), for every line in the window. Floor: "
            "bench/programs/floor_follower.py, an asyncio loop woken by inotify that only "
            "reads and counts the lines, at the same rates; watchdog floor: "
            "bench/programs/watchdog_follower.py, that loop handed each event by watchdog's "
            "inotify observer. The floors' latency: each line's write time to the end of "
            "the follower's read that reached it."
        ),
        header=[
            "lines/s (asked)",
            "lines/s (seen)",
            "daemon % of a core",
            "daemon CPU us / line",
            "floor % of a core",
            "floor CPU us / line",
            "watchdog floor % of a core",
            "watchdog floor CPU us / line",
            "latency p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "lines",
            "floor p99 ms",
            "watchdog floor p99 ms",
        ],  # fmt: skip
        plots=["follow_latency.png", "follow_cpu.png"],
    )
    for rate in RATES:
        f, fl, wd = figures.get(rate), floor.get(rate, {}), through_watchdog.get(rate, {})
        if f is None:
            section.rows.append([f"{rate:,}", *["-"] * 14])
            continue
        lat = f["latency"]
        section.rows.append(
            [
                f"{rate:,}",
                f"{f['lines_per_s']:,.0f}",
                f"{f['core_pct']:.2f} %",
                f"{f['cpu_us_per_line']:,.0f}",
                f"{fl['core_pct']:.2f} %" if fl else "-",
                f"{fl['cpu_us_per_line']:,.0f}" if fl else "-",
                f"{wd['core_pct']:.2f} %" if wd else "-",
                f"{wd['cpu_us_per_line']:,.0f}" if wd else "-",
                fmt_ms(lat["p50_ms"]),
                fmt_ms(lat["p90_ms"]),
                fmt_ms(lat["p99_ms"]),
                fmt_ms(lat["max_ms"]),
                f"{lat['n']:,}",
                fmt_p99(fl),
                fmt_p99(wd),
            ]  # fmt: skip
        )
    if problem:
        section.notes.append(f"trainwarden: {problem}.")
    for rate, f in figures.items():
        section.notes.append(
            f"At {rate:,} lines/s the daemon spent {f['main_thread_cpu_s']:.2f} s CPU in its "
            f"event loop's thread and {f['other_threads_cpu_s']:.2f} s in its other threads "
            f"(samplers) over {f['window_s']:.1f} s; {f['latency']['n']:,} of "
            f"{f['lines_written']:,} lines written were matched in `.loss.json`."
        )
    section.notes += [
        f"Parse throughput, step-line parser on these lines in process (best of 3, "
        f"{n_parse:,} lines): {parsed_per_s:,.0f} lines/s. Section 6 has every parser.",
        "The log is read on the event loop itself: inotify's descriptor sits in the loop's "
        "epoll set, so a line costs one wake-up and no thread hop. The floor column is "
        "that wake-up alone; the difference is the daemon's work per line (parse, policy, "
        "`.loss.json` append, telemetry). The watchdog floor is the same wake-up reached "
        "through watchdog's observer (four threads take each event in turn): its excess "
        "over the floor is what following through watchdog would add to every line, in "
        "CPU and in latency.",
        f"Resolution: CPU is counted in 10 ms ticks, so over {window[10]:g} s the 10 lines/s "
        f"figure is known to about {100 * 0.01 / window[10]:.2f} % of a core.",
    ]
    latency_cdf(
        ctx.out / "follow_latency.png",
        {f"{r:,} lines/s": figures[r]["latency_samples_ms"] for r in RATES if r in figures},
        "Log line written -> step seen by the daemon",
        target_ms=None,
    )
    groups = [f"{r:,} lines/s" for r in RATES]
    bars_per_group(
        ctx.out / "follow_cpu.png",
        groups,
        {
            "trainwarden": [figures.get(r, {}).get("core_pct", math.nan) for r in RATES],
            "floor (wake-up only)": [floor.get(r, {}).get("core_pct", math.nan) for r in RATES],
            "watchdog floor": [
                through_watchdog.get(r, {}).get("core_pct", math.nan) for r in RATES
            ],
        },
        "% of one core",
        "CPU while following a log",
        hlines={0: (CPU_TARGET_PCT, f"{CPU_TARGET_PCT} % target")},
    )
    section.raw = {
        "figures": without_samples(figures),
        "floor": without_samples(floor),
        "watchdog_floor": without_samples(through_watchdog),
        "parse_lines_per_s": parsed_per_s,
        "window_s": window,
        "problem": problem,
    }
    f10, fl10 = figures.get(10), floor.get(10)
    why = ""
    if f10 and fl10 and f10["core_pct"] >= CPU_TARGET_PCT:
        why = (
            f"one inotify wake-up per line alone costs {fl10['cpu_us_per_line']:,.0f} us of CPU "
            f"on this machine ({fl10['core_pct']:.2f} % of a core at 10 lines/s, the floor "
            f"column); the daemon's own work per line adds about "
            f"{f10['cpu_us_per_line'] - fl10['cpu_us_per_line']:,.0f} us"
        )
    section.targets.append(
        Target(
            f"daemon CPU at 10 lines/s < {CPU_TARGET_PCT} % of a core",
            f"{f10['core_pct']:.2f} %" if f10 else "-",
            f10["core_pct"] < CPU_TARGET_PCT if f10 else None,
            why,
        )
    )
    section.targets.append(
        Target(
            f"parse throughput >= {PARSE_TARGET:,} lines/s",
            f"{parsed_per_s:,.0f} lines/s",
            parsed_per_s >= PARSE_TARGET,
        )
    )
    return section
