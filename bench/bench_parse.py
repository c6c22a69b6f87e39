"""Throughput of the log parsers and the cost of a 200,000-step loss history.

    .venv/bin/python bench/bench_parse.py [--lines 200000] [--steps 200000]

Prints lines/s per parser (a step line, and a line that is not one), the time to load,
query and hold a long history, and the log follower's write-to-callback latency.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainwarden.plugins.parsers.hf_trainer import HfTrainerParser  # noqa: E402
from trainwarden.plugins.parsers.jsonl import JsonlParser  # noqa: E402
from trainwarden.plugins.parsers.llmc import LlmcParser  # noqa: E402
from trainwarden.plugins.parsers.nanogpt import NanoGptParser  # noqa: E402
from trainwarden.plugins.parsers.step_line import StepLineParser  # noqa: E402
from trainwarden.supervisor.inputs.logfollow import LogFollower  # noqa: E402
from trainwarden.supervisor.store.lossdb import LossWriter  # noqa: E402
from trainwarden.supervisor.store.losshistory import LossHistory  # noqa: E402

PARSERS: list[tuple[str, Callable[[dict], object], str]] = [
    ("step-line", StepLineParser, "step: {step}, loss: 3.41, dt: 0.25"),
    (
        "step-line +extras",
        StepLineParser,
        "step: {step}, loss: 3.41, dt: 0.25, lr: 6e-4, tokens: 32768",
    ),
    (
        "llmc",
        LlmcParser,
        "step {step:4d}/5000 | train loss 3.412345 | norm 1.2000 | lr 6.00e-04 | 250.12 ms"
        " | 31.2% bf16 MFU | 131072 tok/s",
    ),
    ("nanogpt", NanoGptParser, "iter {step}: loss 3.4100, time 250.00ms, mfu 31.00%"),
    (
        "hf-trainer",
        HfTrainerParser,
        "{{'loss': 3.41, 'grad_norm': 1.2, 'learning_rate': 0.0006, 'epoch': 0.12}}",
    ),
    ("jsonl", JsonlParser, '{{"step": {step}, "loss": 3.41, "dt": 0.25}}'),
]
OTHER_LINE = "UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed"


def lines_per_s(parse: Callable[[str], object], lines: list[str], repeats: int = 3) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for line in lines:
            parse(line)
        best = min(best, time.perf_counter() - start)
    return len(lines) / best


def bench_parsers(n_lines: int) -> None:
    print(f"parser throughput ({n_lines:,} lines, best of 3)")
    for name, cls, template in PARSERS:
        parser = cls({"logging_steps": 1})
        lines = [template.format(step=i) for i in range(n_lines)]
        assert parser.parse(lines[1]) is not None, name  # type: ignore[attr-defined]
        rate = lines_per_s(parser.parse, lines)  # type: ignore[attr-defined]
        other = lines_per_s(parser.parse, [OTHER_LINE] * n_lines)  # type: ignore[attr-defined]
        print(f"  {name:18s} {rate:>12,.0f} step lines/s   {other:>12,.0f} other lines/s")


def bench_history(n_steps: int, directory: Path) -> None:
    path = directory / ".loss.json"
    rng = random.Random(0)
    with LossWriter(path) as writer:
        for step in range(1, n_steps + 1):
            seg = 1 if step <= n_steps * 3 // 4 else 2
            writer.append(
                step, 10.0 / math.sqrt(step) + rng.random() * 0.1, 0.25, 1.7e9 + step, seg
            )
        # A restart replaying 1,000 steps, as a history file really looks after one.
        for step in range(n_steps - 1000, n_steps + 1):
            writer.append(step, 10.0 / math.sqrt(step), 0.25, 1.8e9 + step, 3)
    size_mb = path.stat().st_size / 1e6
    print(f"\nloss history: {n_steps:,} steps + 1,001 replayed, {size_mb:.1f} MB file")

    load_s = []
    for _ in range(3):
        gc.collect()
        start = time.perf_counter()
        history = LossHistory.load(path)
        load_s.append(time.perf_counter() - start)
    print(f"  load                 {min(load_s) * 1000:8.1f} ms (best of 3; {history.load_stats})")

    gc.collect()
    tracemalloc.start()
    held = LossHistory.load(path)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"  memory               {current / 1e6:8.1f} MB held, "
        f"{peak / 1e6:.1f} MB peak while loading"
    )
    assert len(held) == n_steps

    for label, start_step, end_step, points in [
        ("query all -> 1000 pts", None, None, 1000),
        ("query all -> 200 pts", None, None, 200),
        ("query 10k -> 1000 pts", n_steps // 2, n_steps // 2 + 10_000, 1000),
        ("query 500 (raw)", n_steps - 500, n_steps, 1000),
    ]:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            history.query(start_step, end_step, points)
            times.append(time.perf_counter() - start)
        print(f"  {label:20s} {min(times) * 1000:8.2f} ms (best of 5)")

    start = time.perf_counter()
    for step in range(n_steps + 1, n_steps + 10_001):
        history.add(step, 1.0, 0.25, 0.0, 3)
    print(f"  add (live step)      {(time.perf_counter() - start) / 10_000 * 1e6:8.2f} us")


async def bench_follow_latency(directory: Path, count: int = 200) -> None:
    path = directory / "training.log"
    path.write_bytes(b"")
    arrived: asyncio.Queue[float] = asyncio.Queue()

    def on_lines(lines: list[str]) -> None:
        now = time.perf_counter()
        for _ in lines:
            arrived.put_nowait(now)

    follower = LogFollower(path, 0, on_lines, asyncio.get_running_loop())
    follower.start()
    await asyncio.sleep(0.2)
    latencies_ms = []
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for step in range(count):
            sent = time.perf_counter()
            os.write(fd, f"step: {step}, loss: 3.41, dt: 0.25\n".encode())
            latencies_ms.append((await asyncio.wait_for(arrived.get(), 5.0) - sent) * 1000)
            await asyncio.sleep(0.005)
    finally:
        os.close(fd)
        follower.stop()
    latencies_ms.sort()
    p99 = latencies_ms[int(len(latencies_ms) * 0.99) - 1]
    print(
        f"\nlog follower: write -> on_lines on the loop, {count} lines: "
        f"median {statistics.median(latencies_ms):.2f} ms, p99 {p99:.2f} ms, "
        f"max {latencies_ms[-1]:.2f} ms"
    )


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--lines", type=int, default=200_000)
    args.add_argument("--steps", type=int, default=200_000)
    options = args.parse_args()
    bench_parsers(options.lines)
    with tempfile.TemporaryDirectory() as tmp:
        bench_history(options.steps, Path(tmp))
        asyncio.run(bench_follow_latency(Path(tmp)))


if __name__ == "__main__":
    main()
