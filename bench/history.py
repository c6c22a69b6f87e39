"""4. History scale: what a long run's loss history costs the daemon and the TUI.

For each history length a run directory gets a `.loss.json` written directly in the
documented line format (`{"step", "loss", "dt", "t", "seg"}`, with three restarts that
replay steps under a newer seg, as a long run's file looks). Then: daemon start-up (spawn
-> the socket answers `hello`), its RSS, the `history` query (points=1000, whole range,
round trip through the socket) and, when bench/bench_tui.py provides it, the TUI's first
frame.
"""

from __future__ import annotations

import math
import random
import statistics
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import PYTHON, REPO, Context, Section, Target, rss_mb
from bench.peers import trainwarden_config
from bench.plots import scaling
from tests.support import poll
from trainwarden.supervisor.protocol import Client

TITLE = "4. History scale"
FULL_SIZES = (1_000, 10_000, 100_000, 200_000, 1_000_000)
QUICK_SIZES = (1_000, 100_000)
TARGET_STEPS = 200_000
FULL_REPEATS = 3
N_PARAMS = 1000
TUI_TIMEOUT_S = 60.0
TUI_RUNNER = (
    "import sys; from pathlib import Path; from bench.bench_tui import headless_launch; "
    "print('FIRST_FRAME_S', headless_launch(Path(sys.argv[1])), flush=True)"
)


def write_history(path: Path, steps: int) -> int:
    """`steps` steps in three segments plus replays after each restart; returns lines."""
    rng = random.Random(steps)
    restarts = [steps // 4, steps // 2, 3 * steps // 4]
    replay = max(1, min(500, steps // 20))
    lines = 0
    seg, t = 1, 1.7e9
    with open(path, "wb") as f:
        step = 1
        while step <= steps:
            loss = 10.0 / math.sqrt(step) + 2.0 + rng.random() * 0.05
            f.write(
                orjson.dumps({"step": step, "loss": loss, "dt": 0.25, "t": t, "seg": seg}) + b"\n"
            )
            lines += 1
            t += 0.25
            if restarts and step == restarts[0] + replay:
                # A crash here; the restart resumes from the checkpoint `replay` steps back.
                restarts.pop(0)
                seg += 1
                step -= replay
            step += 1
    return lines


TUI_NOTE = (
    "TUI first frame: bench/bench_tui.py's `headless_launch` (the app in a fresh headless "
    "process, from spawning it to the first frame in which every panel holds data)"
)


def tui_first_frame_s(ctx: Context, socket: Path, log: Path) -> float:
    """One TUI launch against the running daemon, in a child we can stop if it hangs."""
    proc = ctx.work.popen([PYTHON, "-c", TUI_RUNNER, str(socket)], cwd=REPO, stdout=log)
    try:
        proc.wait(TUI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        ctx.work.stop(proc, grace=1.0)
        raise RuntimeError(f"no complete frame within {TUI_TIMEOUT_S:.0f} s") from None
    text = log.read_text(errors="replace")
    for line in reversed(text.splitlines()):
        if line.startswith("FIRST_FRAME_S "):
            return float(line.split()[1])
    raise RuntimeError((text.strip().splitlines() or ["no output"])[-1])


def write_run_state(run_dir: Path, steps: int) -> None:
    """Checkpoints, bandit state and samples, so every TUI panel has something to show."""
    ckpt_dir = run_dir / "checkpoints"
    ckpt_dir.mkdir(exist_ok=True)
    for step in (steps - steps // 10, steps - steps // 20, steps):
        (ckpt_dir / f"step_{step:06d}.bin").write_bytes(
            struct.pack("<ii", step, N_PARAMS) + bytes(12 * N_PARAMS)
        )
    arms = {
        name: {"pulls": steps // 3, "ema_reward": 0.5, "prob": 1 / 3, "cap": 1.0, "floor": 0.0}
        for name in ("docs", "code", "tests")
    }
    state = {"step": steps, "arms": arms, "zombies": [], "policy": {}, "phase": {"pivots": 0}}
    (run_dir / ".state.json").write_bytes(orjson.dumps(state))
    samples = [{"step": steps, "arm": a, "text": f"a {a} sample", "t": time.time()} for a in arms]
    (run_dir / ".samples.json").write_bytes(orjson.dumps({"samples": samples}))


def query_ms(socket: Path, repeats: int) -> tuple[float, int]:
    """Median round trip of `history points=1000` over the whole range; points returned."""
    times = []
    points = 0
    with Client(socket, timeout=60.0) as client:
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = client.request("history", points=1000)
            times.append((time.perf_counter() - t0) * 1000)
            points = len(result["step"])
    return statistics.median(times), points


def prepare(ctx: Context, steps: int) -> tuple[Path, dict[str, Any]]:
    run_dir = ctx.work.dir("history", f"steps-{steps}")
    # The trainer only has to exist: `sleep` keeps the CPU free for the daemon.
    trainwarden_config(run_dir, ["sleep", "3600"])
    lines = write_history(run_dir / ".loss.json", steps) if steps else 0
    if steps:
        write_run_state(run_dir, steps)
    figures: dict[str, Any] = {
        "steps": steps,
        "lines": lines,
        "file_mb": (run_dir / ".loss.json").stat().st_size / 1e6 if steps else 0.0,
        "startup_all_s": [],
        "rss_all_mb": [],
        "peak_rss_all_mb": [],
    }
    return run_dir, figures


def start_once(
    ctx: Context, run_dir: Path, figures: dict[str, Any], last: bool, largest: int = 0
) -> None:
    """One daemon start on run_dir; on the last one also the queries and the TUI."""
    daemon = ctx.work.daemon(run_dir).start(wait=False)
    try:
        answered = daemon.wait_ready(120.0, interval=0.005)
        figures["startup_all_s"].append(answered - daemon.started_t)
        figures["rss_all_mb"].append(rss_mb(daemon.pid))
        figures["peak_rss_all_mb"].append(rss_mb(daemon.pid, "VmHWM"))
        if not last:
            return
        figures["query_ms"], figures["query_points"] = query_ms(
            daemon.socket, 3 if ctx.quick else 7
        )
        # Quick mode launches the TUI once, on the longest history only.
        tui_here = figures["steps"] == largest or (figures["steps"] and not ctx.quick)
        if tui_here:
            # A TUI needs the first GPU/host sample before its frame is complete.
            poll(lambda: daemon.request("status").get("host"), 10.0, 0.1)
            frames = []
            for launch in range(1 if ctx.quick else 2):
                log = run_dir / f"tui-{launch}.out"
                try:
                    frames.append(tui_first_frame_s(ctx, daemon.socket, log))
                except Exception as exc:  # the TUI's own benchmark: report, keep going
                    figures["tui_error"] = f"{type(exc).__name__}: {exc}"
            if frames:
                figures["tui_first_frame_s"] = statistics.median(frames)
    finally:
        daemon.stop()


def measure_all(ctx: Context, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Figures for an empty history and each size; the starts of all sizes interleaved,
    round after round, so each size sees the same machine load."""
    runs = [prepare(ctx, steps) for steps in (0, *sizes)]
    repeats = 1 if ctx.quick else FULL_REPEATS
    # A first start, not counted, to bring the interpreter and imports into the page cache.
    start_once(ctx, runs[0][0], {"startup_all_s": [], "rss_all_mb": [], "peak_rss_all_mb": []},
               last=False)  # fmt: skip
    for attempt in range(repeats):
        for run_dir, figures in runs:
            start_once(ctx, run_dir, figures, attempt == repeats - 1, max(sizes))
    for _, figures in runs:
        figures["startup_s"] = statistics.median(figures["startup_all_s"])
        figures["rss_mb"] = statistics.median(figures["rss_all_mb"])
        figures["peak_rss_mb"] = max(figures["peak_rss_all_mb"])
    return [figures for _, figures in runs]


def loader_seconds(ctx: Context, steps: int) -> dict[str, float]:
    """In process, no daemon: LossHistory.load of a history with replays against one of the
    same steps written as a single segment (best of 2 each)."""
    from trainwarden.supervisor.store.losshistory import LossHistory

    directory = ctx.work.dir("history", "loader")
    replayed, single = directory / "replayed.json", directory / "single.json"
    write_history(replayed, steps)
    with open(single, "wb") as f:
        for step in range(1, steps + 1):
            f.write(orjson.dumps({"step": step, "loss": 3.0, "dt": 0.25, "t": 1.7e9 + step,
                                  "seg": 1}) + b"\n")  # fmt: skip
    out = {}
    for name, path in (("with_replays_s", replayed), ("single_segment_s", single)):
        best = math.inf
        for _ in range(2):
            t0 = time.perf_counter()
            LossHistory.load(path)
            best = min(best, time.perf_counter() - t0)
        out[name] = best
    replayed.unlink()
    single.unlink()
    return out


def growth_exponent(steps: list[int], values: list[float], base: float = 0.0) -> float:
    """d log(value - base) / d log(steps) between the two largest sizes: 1 is linear,
    2 quadratic, ~0 flat."""
    (s1, v1), (s2, v2) = list(zip(steps, values, strict=True))[-2:]
    a, b = v1 - base, v2 - base
    if a <= 0 or b <= 0:
        return math.nan
    return math.log(b / a) / math.log(s2 / s1)


def run(ctx: Context) -> Section:
    sizes = QUICK_SIZES if ctx.quick else FULL_SIZES
    empty, *rows = measure_all(ctx, sizes)

    section = Section(
        key="history",
        title=TITLE,
        intro=(
            "A run directory with a `.loss.json` of N logged steps (three restarts, each "
            "replaying up to 500 steps under a new `seg`, so the loader has to keep the "
            "newest segment per step) and a trainer that only sleeps. Start-up = spawning "
            "`trainwarden daemon RUN` -> its socket answering `hello` (polled every 5 ms); "
            "RSS right after; `history` = a `points=1000` query over the whole range, the "
            "median round trip of several through the socket. The empty row is the same "
            "daemon with no history: interpreter and imports. Start-up and RSS are medians "
            f"of {1 if ctx.quick else FULL_REPEATS} start(s) per size, the sizes taking turns "
            "after one uncounted warm-up start; the run also holds three checkpoints, bandit "
            "state and samples, so a TUI has every panel to fill."
        ),
        header=[
            "logged steps",
            ".loss.json MB",
            "start-up s",
            "start-up above empty s",
            "RSS MB",
            "peak RSS MB",
            "history query ms",
            "TUI first frame s",
        ],  # fmt: skip
        plots=["history_scale.png"],
    )
    for f in [empty, *rows]:
        tui_cell = f"{f['tui_first_frame_s']:.2f}" if "tui_first_frame_s" in f else "-"
        section.rows.append(
            [
                f"{f['steps']:,}" if f["steps"] else "0 (empty)",
                f"{f['file_mb']:.1f}",
                f"{f['startup_s']:.3f}",
                f"{f['startup_s'] - empty['startup_s']:.3f}",
                f"{f['rss_mb']:.0f}",
                f"{f['peak_rss_mb']:.0f}",
                f"{f['query_ms']:.2f}",
                tui_cell,
            ]
        )
    section.notes.append(TUI_NOTE + ".")
    for f in rows:
        if "tui_error" in f:
            section.notes.append(f"TUI at {f['steps']:,} steps failed: {f['tui_error']}.")

    steps = [f["steps"] for f in rows]
    curves = {
        "daemon start-up (s)": [f["startup_s"] for f in rows],
        "daemon RSS (MB)": [f["rss_mb"] for f in rows],
        "history query (ms)": [f["query_ms"] for f in rows],
    }
    if any("tui_first_frame_s" in f for f in rows):
        curves["TUI first frame (s)"] = [f.get("tui_first_frame_s", math.nan) for f in rows]
    scaling(ctx.out / "history_scale.png", steps, curves, "Cost against history length")
    exponents = {name: growth_exponent(steps, values) for name, values in curves.items()}
    section.notes.append(
        "Growth between the two largest sizes, as the exponent k in cost ~ steps^k "
        "(0 = flat, 1 = linear, 2 = quadratic): "
        + ", ".join(f"{name} k = {k:.2f}" for name, k in exponents.items() if k == k)
        + ". Per logged step, above the empty daemon: "
        + "; ".join(
            f"{f['steps']:,} steps: start-up {_per_step(f['startup_s'] - empty['startup_s'], f['steps'], 1e6, 'us', '.1f')}, "
            f"RSS {_per_step(f['rss_mb'] - empty['rss_mb'], f['steps'], 1e6, 'B', '.0f')}"
            for f in rows
        )
        + " (flat or falling per-step figures mean linear or better)."
    )
    at_target = _at(rows, TARGET_STEPS, empty)
    loader_steps = min(TARGET_STEPS, max(sizes))
    loader = loader_seconds(ctx, loader_steps)
    section.raw = {
        "loader_in_process": {"steps": loader_steps, **loader},
        "empty": empty,
        "sizes": rows,
        "growth_exponents": exponents,
        "at_200k": at_target,
    }
    estimated = (
        ""
        if at_target["measured"]
        else " (extrapolated linearly from the two sizes quick mode measures; not judged)"
    )

    def judged(met: bool) -> bool | None:
        return met if at_target["measured"] else None

    worst = max((k for k in exponents.values() if k == k), default=math.nan)
    section.targets += [
        Target(
            "history curves linear or better (growth exponent <= ~1)",
            f"largest k = {worst:.2f}",
            worst <= 1.15 if worst == worst else None,
            "k between the two largest sizes; above 1.15 would mean worse than linear",
        ),
        Target(
            "200,000-step history: daemon start-up < 1 s",
            f"{at_target['startup_s']:.2f} s{estimated}",
            judged(at_target["startup_s"] < 1.0),
            f"of which {empty['startup_s']:.2f} s is the empty daemon's start-up (interpreter, "
            f"imports) and the rest loading .loss.json, about "
            f"{1e6 * (at_target['startup_s'] - empty['startup_s']) / TARGET_STEPS:.1f} us per "
            f"logged step here; in process, loading {loader_steps:,} steps took "
            f"{loader['with_replays_s']:.2f} s with three replays and "
            f"{loader['single_segment_s']:.2f} s as one segment",
        ),
        Target(
            "200,000-step history: daemon RSS < 150 MB",
            f"{at_target['rss_mb']:.0f} MB{estimated}",
            judged(at_target["rss_mb"] < 150),
        ),
        Target(
            "200,000-step history: decimated history query < 50 ms",
            f"{at_target['query_ms']:.1f} ms{estimated}",
            judged(at_target["query_ms"] < 50),
        ),
    ]
    tui_at = at_target.get("tui_first_frame_s")
    tui_largest = rows[-1].get("tui_first_frame_s")
    if tui_at is not None:
        tui_target = Target(
            "200,000-step history: TUI first full paint < 1.5 s",
            f"{tui_at:.2f} s{estimated}",
            tui_at < 1.5,
        )
    elif tui_largest is not None:
        tui_target = Target(
            "200,000-step history: TUI first full paint < 1.5 s",
            f"{tui_largest:.2f} s at {rows[-1]['steps']:,} steps",
            None,
            "quick mode launches the TUI on its largest size only",
        )
    else:
        tui_target = Target(
            "200,000-step history: TUI first full paint < 1.5 s", "-", None, TUI_NOTE
        )
    section.targets.append(tui_target)
    return section


def _at(rows: list[dict[str, Any]], steps: int, empty: dict[str, Any]) -> dict[str, Any]:
    """The figures at `steps`: measured, or interpolated linearly between neighbours."""
    for f in rows:
        if f["steps"] == steps:
            return {**f, "measured": True}
    keys = ["startup_s", "rss_mb", "query_ms", "tui_first_frame_s"]
    below = [f for f in rows if f["steps"] < steps] or [{**empty, "steps": 0}]
    above = [f for f in rows if f["steps"] > steps]
    lo = below[-1]
    hi = above[0] if above else rows[-1]
    if hi is lo:
        lo = rows[-2] if len(rows) > 1 else {**empty, "steps": 0}
    out: dict[str, Any] = {"steps": steps, "measured": False}
    for key in keys:
        if key in lo and key in hi:
            w = (steps - lo["steps"]) / (hi["steps"] - lo["steps"])
            out[key] = lo[key] + w * (hi[key] - lo[key])
    return out


def _per_step(above: float, steps: int, scale: float, unit: str, spec: str) -> str:
    """A cost above the empty daemon's, per logged step; a difference the run-to-run noise
    made negative (a small history started faster than the empty one) is said as such,
    not as a negative cost."""
    if above <= 0:
        return "within the empty daemon's"
    return f"{format(scale * above / steps, spec)} {unit}"
