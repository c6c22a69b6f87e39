"""10. Long runs: start-up, memory, `history` and a NaN's kill over weeks of loss history.

For each size a run directory gets a `.loss.json` of N steps in the documented line format
(written by a fast block formatter: 18M steps is three weeks at 10 lines/s, about 1.2 GB,
so it lives in the bench's temporary directory and is deleted after its size is measured).
Then: the first start (no loss cache yet: the daemon parses the whole file, writing the
cache a chunk of rows at a time; and its peak RSS), a second start (over the cache), RSS
after each, the `history` round trip (points=1000, whole range), and the NaN -> trainer
killed latency while two clients send `history` back to back. Then a long-lived daemon: a trainer logs N steps live (20,000 a
second) to a daemon that rebuilds its loss cache every N/10 steps; the median of its RSS
over the second quarter of the steps and over the last: rows the running history kept in
memory would show as 40 bytes a step.
"""

from __future__ import annotations

import math
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Context, Section, Target, latency_summary, rss_mb
from bench.divergence import armed_pid, one_sample, trainer_argv
from bench.peers import trainwarden_config
from tests.support import make_run, poll, wait_for
from tests.support.longrun import fast_trainer_argv, small_refresh_wrap
from trainwarden.supervisor.protocol import Client

TITLE = "10. Long runs"
FULL_SIZES = (200_000, 1_000_000, 18_000_000)
QUICK_SIZES = (200_000,)
LIVE_STEPS = 2_000_000
QUICK_LIVE_STEPS = 200_000
LONG_STEPS = 18_000_000
HAMMERS = 2
BLOCK = 65536


def write_history(path: Path, steps: int) -> None:
    """`steps` steps of one segment, formatted a block of lines at a time."""
    with open(path, "wb") as f:
        for lo in range(1, steps + 1, BLOCK):
            f.write(
                b"".join(
                    b'{"step":%d,"loss":%.6f,"dt":0.1,"t":%.1f,"seg":1}\n'
                    % (s, 2.0 + 10.0 / s**0.5, 1.7e9 + s * 0.1)
                    for s in range(lo, min(lo + BLOCK, steps + 1))
                )
            )


def one_start(ctx: Context, run_dir: Path) -> dict[str, float]:
    daemon = ctx.work.daemon(run_dir).start(wait=False)
    try:
        answered = daemon.wait_ready(600.0, interval=0.005)
        return {
            "startup_s": answered - daemon.started_t,
            "rss_mb": rss_mb(daemon.pid),
            "peak_rss_mb": rss_mb(daemon.pid, "VmHWM"),
        }
    finally:
        daemon.stop()


def query_ms(socket: Path, repeats: int) -> float:
    times = []
    with Client(socket, timeout=120.0) as client:
        for _ in range(repeats):
            t0 = time.perf_counter()
            client.request("history", points=1000)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def nan_under_hammering(ctx: Context, run_dir: Path, samples: int) -> dict[str, Any]:
    """The query's round trip alone, then NaN -> kill latencies (ms) while HAMMERS clients
    send `history` back to back."""
    events, go = run_dir / "events", run_dir / "go"
    events.unlink(missing_ok=True)  # the trainers of the earlier starts are gone
    daemon = ctx.work.daemon(run_dir).start()
    if daemon.request("status").get("state") == "stopped":  # how the earlier start left it
        daemon.request("start")
    done = threading.Event()
    answered: list[float] = []

    def hammer() -> None:
        with Client(daemon.socket, timeout=120.0) as client:
            while not done.is_set():
                t0 = time.perf_counter()
                try:
                    client.request("history", points=1000)
                except Exception:
                    return  # the daemon is going away
                answered.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(HAMMERS)]
    latencies: list[float] = []
    used: set[int] = set()
    try:
        alone_ms = query_ms(daemon.socket, 3 if ctx.quick else 7)
        for thread in threads:
            thread.start()
        for _ in range(samples):
            pid = poll(lambda: armed_pid(events, used), 60.0)
            if pid is None:
                break
            used.add(pid)
            latency = one_sample(events, go, pid)
            if latency is not None:
                latencies.append(latency)
    finally:
        done.set()
        for thread in threads:
            thread.join(120.0)
        rss_after = rss_mb(daemon.pid) if daemon.alive else math.nan
        peak = rss_mb(daemon.pid, "VmHWM") if daemon.alive else math.nan
        daemon.stop()
    return {
        "rss_after_queries_mb": rss_after,
        "peak_rss_mb": peak,
        "nan_ms": latency_summary(latencies) if latencies else None,
        "query_ms": alone_ms,
        "hammer_queries": len(answered),
        "hammer_query_ms": statistics.median(answered) if answered else None,
    }


def measure(ctx: Context, steps: int) -> dict[str, Any]:
    run_dir = ctx.work.dir("long_runs", f"steps-{steps}")
    trainwarden_config(
        run_dir,
        trainer_argv(run_dir / "events", run_dir / "go"),
        restart={"backoff_initial_s": 0.0, "divergence_retries": 1_000_000},
    )
    t0 = time.perf_counter()
    write_history(run_dir / ".loss.json", steps)
    figures: dict[str, Any] = {
        "steps": steps,
        "file_mb": (run_dir / ".loss.json").stat().st_size / 1e6,
        "write_s": time.perf_counter() - t0,
    }
    try:
        figures["cold"] = one_start(ctx, run_dir)  # parses it all, writes the cache
        figures["warm"] = one_start(ctx, run_dir)
        figures.update(nan_under_hammering(ctx, run_dir, 3 if ctx.quick else 5))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return figures


def live_logging(ctx: Context, steps: int) -> dict[str, Any]:
    """RSS (MB) of a daemon while it logs `steps` live, its cache rebuilt (and the history
    remapped) every steps/10: the median of samples over the second quarter of the steps
    and over the last (RSS swings within each rebuild cycle; medians compare like with like)."""
    run_dir = ctx.work.dir("long_runs", "live")
    make_run(run_dir, fast_trainer_argv(steps), restart={"stall_timeout_s": 600.0})
    daemon = ctx.work.daemon(run_dir)
    daemon.wrap = small_refresh_wrap(steps // 10)
    figures: dict[str, Any] = {"steps": steps, "refresh_rows": steps // 10}
    samples: list[tuple[int, float]] = []
    daemon.start()
    t0 = time.perf_counter()

    def sample() -> bool:
        step = daemon.request("status", timeout=120.0).get("step") or 0
        samples.append((step, rss_mb(daemon.pid)))
        return step >= steps

    try:
        wait_for(sample, 1800.0, interval=0.5, what=f"{steps} steps logged")
        figures["peak_rss_mb"] = rss_mb(daemon.pid, "VmHWM")
        figures["log_s"] = time.perf_counter() - t0
    finally:
        daemon.stop()
        shutil.rmtree(run_dir, ignore_errors=True)

    def median_rss(lo: int, hi: int) -> float:
        return statistics.median([mb for step, mb in samples if lo <= step <= hi] or [math.nan])

    figures["rss_quarter_mb"] = median_rss(steps // 4, steps // 2)
    figures["rss_end_mb"] = median_rss(steps * 3 // 4, steps)
    figures["mb_per_million_steps"] = (
        (figures["rss_end_mb"] - figures["rss_quarter_mb"]) / (steps // 2) * 1e6
    )
    return figures


def run(ctx: Context) -> Section:
    sizes = QUICK_SIZES if ctx.quick else FULL_SIZES
    rows = [measure(ctx, steps) for steps in sizes]
    live = live_logging(ctx, QUICK_LIVE_STEPS if ctx.quick else LIVE_STEPS)
    section = Section(
        key="long-runs",
        title=TITLE,
        intro=(
            "A `.loss.json` of N steps (18M = three weeks at 10 lines/s) and the NaN trainer "
            "of section 2 (it logs from step 1, so its steps replace the history's first ones). "
            "First start = no loss cache: the daemon parses the whole file, writing "
            "`.trainwarden/loss-cache/` a chunk of rows at a time; second start = over that "
            "cache. Start-up is spawning -> `hello` answered; RSS right after (and, for the "
            "first start, its peak). `history` = points=1000 over the whole "
            f"range, median round trip. NaN -> killed: while {HAMMERS} clients send `history` "
            "back to back, from the NaN line's write to the trainer's death; RSS right after the "
            "hammering, and the peak (VmHWM) of that daemon."
        ),
        header=[
            "logged steps",
            ".loss.json MB",
            "first start s",
            "first RSS MB / peak",
            "start s (cache)",
            "RSS MB (cache)",
            "history ms",
            "history ms (hammered)",
            "NaN -> killed p50 / max ms",
            "RSS MB after the queries / peak",
        ],  # fmt: skip
    )
    for f in rows:
        nan = f["nan_ms"]
        section.rows.append(
            [
                f"{f['steps']:,}",
                f"{f['file_mb']:.0f}",
                f"{f['cold']['startup_s']:.2f}",
                f"{f['cold']['rss_mb']:.0f} / {f['cold']['peak_rss_mb']:.0f}",
                f"{f['warm']['startup_s']:.2f}",
                f"{f['warm']['rss_mb']:.0f}",
                f"{f['query_ms']:.1f}",
                "-" if f["hammer_query_ms"] is None else f"{f['hammer_query_ms']:.1f}",
                "-" if nan is None else f"{nan['p50_ms']:.0f} / {nan['max_ms']:.0f}",
                f"{f['rss_after_queries_mb']:.0f} / {f['peak_rss_mb']:.0f}",
            ]
        )
    section.raw = {"sizes": rows, "live": live}
    section.notes.append(
        f"Long-lived daemon: {live['steps']:,} steps logged live in {live['log_s']:.0f} s "
        f"(cache rebuilt every {live['refresh_rows']:,}): median RSS {live['rss_quarter_mb']:.0f} "
        f"MB over its second quarter, {live['rss_end_mb']:.0f} MB over its last "
        f"(peak {live['peak_rss_mb']:.0f}), {live['mb_per_million_steps']:+.1f} MB per million "
        "steps (rows kept in memory would be +38 MB per million)."
    )
    longest = next((f for f in rows if f["steps"] == LONG_STEPS), None)
    why = "" if longest else "quick mode measures 200,000 steps only"

    def judged(check: Any) -> bool | None:
        return check(longest) if longest else None

    def shown(text: Any) -> str:
        return text(longest) if longest else "-"

    section.targets += [
        Target(
            "18M-step history: daemon start-up < 5 s (over its cache)",
            shown(lambda f: f"{f['warm']['startup_s']:.2f} s"),
            judged(lambda f: f["warm"]["startup_s"] < 5.0),
            why,
        ),
        Target(
            "18M-step history: daemon RSS < 300 MB (at start-up over the cache, and after the "
            "hammered queries)",
            shown(lambda f: f"{f['warm']['rss_mb']:.0f} / {f['rss_after_queries_mb']:.0f} MB"),
            judged(lambda f: max(f["warm"]["rss_mb"], f["rss_after_queries_mb"]) < 300),
            why,
        ),
        Target(
            "18M-step history: the first start (no cache yet) peaks under 300 MB",
            shown(lambda f: f"{f['cold']['peak_rss_mb']:.0f} MB in {f['cold']['startup_s']:.1f} s"),
            judged(lambda f: f["cold"]["peak_rss_mb"] < 300),
            why,
        ),
        Target(
            "A long-lived daemon's RSS does not grow with the steps it logs (under 5 MB per "
            "million, against 38 for rows kept in memory)",
            f"{live['mb_per_million_steps']:+.1f} MB per million steps",
            None if ctx.quick else live["mb_per_million_steps"] < 5.0,
            "quick mode logs 200,000 steps: too few to tell MB per million" if ctx.quick else "",
        ),
        Target(
            "18M-step history: NaN acted on within 100 ms while `history` is hammered",
            shown(lambda f: f"max {f['nan_ms']['max_ms']:.0f} ms" if f["nan_ms"] else "-"),
            judged(lambda f: bool(f["nan_ms"]) and f["nan_ms"]["max_ms"] < 100),
            why,
        ),
    ]
    return section
