"""Part of section 1: what a start's own cgroup costs a restart spawned for it, piece by piece.

A spawned start's child writes itself into its start's cgroup before it executes the
trainer (shell.process.spawn), so nothing the trainer forks can start outside (a restart
run in a spare, shell.spare, paid this ahead of time). That takes two
things a plain spawn does not: a `preexec_fn`, which makes Python fork() the spawning
process where it would vfork(), and a cgroup v2 move. Each is timed here on its own,
from this process, after a quiet pause as between two crashes:

- vfork spawn: `subprocess.Popen` of /bin/true with no preexec_fn (what returns once the
  child has executed);
- fork spawn: the same with a preexec_fn that does nothing;
- fork spawn + join: a spawned start's way, the preexec_fn writing "0" to the cgroup's
  cgroup.procs;
- parent's move: the same write of a running child's pid from here, after a vfork spawn.

A cgroup move takes the kernel's cgroup_threadgroup_rwsem for writing, which waits for
an RCU grace period unless a move came just before (or cgroup2 is mounted with
favordynmods); a move right after another is fast.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import fmt_ms, latency_summary
from trainwarden.supervisor.shell.cgroups import StartCgroups

JOINED = "fork spawn + join (a spawned start's)"

QUIET_S = 0.3
"""The pause before each sample: a restart comes after a trainer's life, not right after
the previous move."""


def _timed_spawn(argv: list[str], preexec: Any) -> tuple[float, subprocess.Popen[bytes]]:
    began = time.perf_counter()
    child = subprocess.Popen(argv, preexec_fn=preexec, start_new_session=True)
    return (time.perf_counter() - began) * 1000, child


def measure(work_dir: Path, samples: int) -> tuple[dict[str, list[float]], str]:
    """Milliseconds per way of spawning, or ({}, why not) where no cgroup can be made."""
    cgroups, why = StartCgroups.find(work_dir)
    if cgroups is None:
        return {}, why
    ways: dict[str, list[float]] = {
        "vfork spawn": [],
        "fork spawn": [],
        JOINED: [],
        "parent's move of a running child": [],
    }
    for i in range(samples):
        for n, (way, values) in enumerate(ways.items()):
            marker = f"bench-{os.getpid()}-{i}-{n}"
            folder = cgroups.path(marker)
            folder.mkdir()
            fd = os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
            try:
                time.sleep(QUIET_S)
                if way == "vfork spawn":
                    ms, child = _timed_spawn(["/bin/true"], None)
                elif way == "fork spawn":
                    ms, child = _timed_spawn(["/bin/true"], lambda: None)
                elif way.startswith("fork spawn + join"):
                    ms, child = _timed_spawn(["/bin/true"], lambda fd=fd: os.write(fd, b"0\n"))
                else:
                    _, child = _timed_spawn(["/bin/sleep", "30"], None)
                    began = time.perf_counter()
                    os.write(fd, f"{child.pid}\n".encode())
                    ms = (time.perf_counter() - began) * 1000
                    child.kill()
                child.wait()
                values.append(ms)
            finally:
                os.close(fd)
                cgroups.end(marker)
    return ways, ""


def table(ways: dict[str, list[float]]) -> str:
    """The markdown table of the figures, with this process's size (fork copies it)."""
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines = [
        f"Containment's share, from the benchmark's own process (peak RSS {rss_mb:.0f} MB: "
        f"a fork's cost grows with it), {QUIET_S} s of quiet before each sample:",
        "",
        "| way | samples | p50 ms | p90 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for way, values in ways.items():
        s = latency_summary(values)
        lines.append(
            f"| {way} | {s['n']} | {fmt_ms(s['p50_ms'])} | {fmt_ms(s['p90_ms'])} "
            f"| {fmt_ms(s['max_ms'])} |"
        )
    return "\n".join(lines) + "\n"


def summary(ways: dict[str, list[float]]) -> dict[str, Any]:
    return {way: latency_summary(values) for way, values in ways.items()}
