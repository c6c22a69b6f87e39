"""6. Parsers and history internals: bench/bench_parse.py, run as it is and quoted whole.

It times each log parser, loading/holding/querying a 200,000-step history in process
(no daemon, no socket) and the log follower's write-to-callback latency.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from bench.common import PYTHON, REPO, Context, Section

TITLE = "6. Parsers and history internals (bench_parse.py)"
SCRIPT = Path(__file__).resolve().parent / "bench_parse.py"


def run(ctx: Context) -> Section:
    args = ["--lines", "2000", "--steps", "10000"] if ctx.quick else ["--lines", "20000"]
    argv = [PYTHON, str(SCRIPT.relative_to(REPO)), *args]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    output = done.stdout.rstrip()
    section = Section(
        key="parse",
        title=TITLE,
        intro=(
            f"`{' '.join(['python', *argv[1:]])}`, run by the suite in the same session; its "
            "output unchanged:"
        ),
        extra_markdown=f"```\n{output}\n```",
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench_parse.py exited {done.returncode}: {done.stderr[-500:]}")
    follow = re.search(r"median ([0-9.]+) ms, p99 ([0-9.]+) ms", output)
    load = re.search(r"load\s+([0-9.]+) ms", output)
    section.raw = {
        "argv": argv[1:],
        "output": output,
        "follower_median_ms": float(follow.group(1)) if follow else None,
        "follower_p99_ms": float(follow.group(2)) if follow else None,
        "history_load_ms": float(load.group(1)) if load else None,
    }
    section.notes.append(
        "These figures are in-process: the daemon's own start-up, socket round trip and "
        "interpreter are in section 4."
    )
    return section
