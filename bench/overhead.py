"""3. Supervision overhead: what watching a trainer costs the machine.

The same trainer (bench/programs/rate_trainer.py: step lines at a fixed rate, nothing
else) runs under trainwarden's daemon, torchrun's agent and supervisord, at 10 and at
1,000 lines/s. Over a fixed window we read utime + stime of the supervisor process alone
(all its threads, not the trainer) from /proc/PID/stat, and its VmRSS at the end.
"""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

from bench.common import (
    Context,
    Section,
    measure,
    program,
    read_events,
)
from bench.peers import torchrun_argv, trainwarden_config
from bench.plots import bars_per_group
from tests.support import DaemonProcess, poll

TITLE = "3. Supervision overhead"
RATES = (10, 1000)
SUPERVISORS = ("trainwarden", "torchrun", "supervisord")


def start(
    ctx: Context, name: str, child: list[str], directory: Path
) -> tuple[subprocess.Popen[bytes] | None, Path, DaemonProcess | None, str]:
    """(supervisor process, the log the lines end up in, daemon wrapper, problem)."""
    if name == "trainwarden":
        trainwarden_config(directory, child)
        daemon = ctx.work.daemon(directory).start()
        return daemon.proc, directory / "training.log", daemon, ""
    if name == "torchrun":
        # Users redirect torchrun's output to a file; the worker inherits that stdout.
        log = directory / "torchrun.log"
        proc = ctx.work.popen(torchrun_argv(child, max_restarts=0), cwd=directory, stdout=log)
        return proc, log, None, ""
    supervisord = ctx.peers.supervisord
    if not supervisord.available():
        return None, directory, None, f"not measured: {supervisord.error}"
    proc = supervisord.start(directory, child)
    return proc, directory / "program.log", None, ""


def supervise(
    ctx: Context, name: str, window: float, settle: float
) -> tuple[dict[int, dict[str, float]], str]:
    """One supervisor, one trainer, measured at each rate in turn."""
    directory = ctx.work.dir("overhead", name)
    events, rate_file = directory / "events", directory / "rate"
    rate_file.write_text(str(RATES[0]))
    child = program("rate_trainer.py", "--rate-file", rate_file, "--events", events)
    proc, log, daemon, problem = start(ctx, name, child, directory)
    if proc is None:
        return {}, problem
    figures: dict[int, dict[str, float]] = {}
    try:
        if not poll(lambda: read_events(events), 60.0):
            return figures, "the trainer did not start within 60 s"
        for rate in RATES:
            rate_file.write_text(str(rate))
            time.sleep(settle)
            figures[rate] = measure(proc.pid, log, window)
    finally:
        if daemon is not None:
            daemon.stop()
        else:
            ctx.work.stop(proc)
    return figures, ""


def run(ctx: Context) -> Section:
    window = 1.5 if ctx.quick else 20.0
    settle = 0.5 if ctx.quick else 2.0
    figures: dict[str, dict[int, dict[str, float]]] = {}
    problems: dict[str, str] = {}
    for name in SUPERVISORS:
        figures[name], problem = supervise(ctx, name, window, settle)
        if problem:
            problems[name] = problem

    section = Section(
        key="overhead",
        title=TITLE,
        intro=(
            "CPU time and memory of the supervisor process alone while the same trainer "
            f"logs step lines at {' and '.join(f'{r:,}' for r in RATES)} lines/s, over a "
            f"{window:g} s window after {settle:g} s of settling (utime + stime from "
            "/proc/PID/stat, all threads; VmRSS from /proc/PID/status at the end of the "
            "window). One trainer per supervisor, switched from the first rate to the second "
            "through a file it rereads every 0.1 s. trainwarden follows, parses and records "
            "every line (the loss history, telemetry, GPU and host sampling every 2 s); "
            "supervisord copies the child's "
            "output from a pipe into its log file; torchrun's agent leaves the worker's "
            "stdout alone (it goes straight to the file) and only polls the worker."
        ),
        header=[
            "supervisor",
            "lines/s (asked)",
            "lines/s (seen)",
            "% of a core",
            "CPU us / line",
            "RSS MB",
            "peak RSS MB",
        ],  # fmt: skip
        plots=["overhead_cpu.png", "overhead_rss.png"],
    )
    for rate in RATES:
        for name in SUPERVISORS:
            f = figures[name].get(rate)
            if f is None:
                section.rows.append([name, f"{rate:,}", "-", "-", "-", "-", "-"])
                continue
            section.rows.append(
                [
                    name,
                    f"{rate:,}",
                    f"{f['lines_per_s']:,.0f}",
                    f"{f['core_pct']:.2f} %",
                    f"{f['cpu_us_per_line']:,.0f}",
                    f"{f['rss_mb']:.0f}",
                    f"{f['peak_rss_mb']:.0f}",
                ]  # fmt: skip
            )
    for what, problem in problems.items():
        section.notes.append(f"{what}: {problem}.")
    for rate, f in figures["trainwarden"].items():
        section.notes.append(
            f"trainwarden at {rate:,} lines/s: {f['main_thread_cpu_s']:.2f} s CPU in the event "
            f"loop's thread (which also reads the log), {f['other_threads_cpu_s']:.2f} s in "
            "its other threads (GPU and host samplers) over the window."
        )
    section.notes += [
        f"Resolution: the kernel counts CPU time in ticks of 10 ms, so over {window:g} s "
        f"a figure is known to about {100 * 0.01 / window:.2f} % of a core.",
        "CPU per line at 10 lines/s includes the fixed cost of being alive (sampling "
        "every 2 s) divided by few lines; the 1,000 lines/s row shows the cost per line. "
        "The 0.5 % of a core target at 10 lines/s is checked in section 7, beside the cost "
        "of a bare wake-up per line on the same machine.",
    ]
    groups = [f"{r:,} lines/s" for r in RATES]
    bars_per_group(
        ctx.out / "overhead_cpu.png",
        groups,
        {n: [figures[n].get(r, {}).get("core_pct", math.nan) for r in RATES] for n in SUPERVISORS},
        "% of one core (supervisor process only)",
        "Supervisor CPU while the trainer logs",
        hlines={0: (0.5, "0.5 % target")},
    )
    bars_per_group(
        ctx.out / "overhead_rss.png",
        groups,
        {n: [figures[n].get(r, {}).get("rss_mb", math.nan) for r in RATES] for n in SUPERVISORS},
        "resident memory (MB)",
        "Supervisor memory (VmRSS)",
    )
    section.raw = {"figures": figures, "problems": problems, "window_s": window}
    return section
