"""9. torch-pt verification latency per checkpoint: the long-lived worker (torch imported
once) against a fresh interpreter per checkpoint, as every torch-pt verification used to be.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import Context, Section, Target, fmt_ms

TITLE = "9. Checkpoint verification (torch-pt), per checkpoint"
FULL_FILES = 10
QUICK_FILES = 3
HIDDEN = 832
"""Width of the MLP: 512 -> 832 -> 512 with AdamW moments makes a ~10 MB checkpoint."""
TARGET_MS = 100.0


def write_checkpoints(directory: Path, count: int) -> list[Path]:
    """`count` torch.save checkpoints (steps 1..count) of a small MLP after one AdamW step:
    model state_dict, optimizer state (both moments) and the step."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 512)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    paths = []
    for step in range(1, count + 1):
        model(torch.randn(4, 512)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        path = directory / f"ckpt_{step:06d}.pt"
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save(state, path)
        paths.append(path)
    return paths


def one_shot(path: Path) -> float:
    """Seconds for the old way: a fresh `python -I` that imports torch and checks one file
    (the same probe code, given one request and then end of input), as each torch-pt
    verification did before the worker."""
    from trainwarden.plugins.formats.torch_probe import PROBE, PROBE_MARK
    from trainwarden.plugins.formats.torch_pt import DEFAULT_STEP_KEYS

    request = json.dumps({"path": str(path), "step_keys": list(DEFAULT_STEP_KEYS)})
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-I", "-c", PROBE],
        input=(request + "\n").encode(),
        capture_output=True,
        timeout=120,
        cwd="/",
        env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    seconds = time.perf_counter() - t0
    answer = done.stdout.decode().strip()
    if not answer.startswith(PROBE_MARK) or "error" in json.loads(answer[len(PROBE_MARK) :]):
        raise RuntimeError(f"the one-shot probe did not pass {path.name}: {answer!r}")
    return seconds


def run(ctx: Context) -> Section:
    from trainwarden.plugins.formats.torch_pt import TorchPt

    count = QUICK_FILES if ctx.quick else FULL_FILES
    directory = ctx.work.dir("torch-verify")
    paths = write_checkpoints(directory, count + 1)
    size_mb = statistics.median(p.stat().st_size for p in paths) / 1e6
    fmt = TorchPt({})
    try:
        t0 = time.perf_counter()
        fmt.verify(paths[0])  # starts the worker: interpreter, torch import, first load
        cold_ms = 1000 * (time.perf_counter() - t0)
        worker = fmt.worker_pid
        old_ms: list[float] = []
        new_ms: list[float] = []
        # The two ways take turns, file after file; every file is new to the worker, so its
        # cache of files that passed never answers.
        for path in paths[1:]:
            old_ms.append(1000 * one_shot(path))
            t0 = time.perf_counter()
            fmt.verify(path)
            new_ms.append(1000 * (time.perf_counter() - t0))
        assert fmt.worker_pid == worker, "the worker was restarted during the measurement"
    finally:
        fmt.close()
    for path in paths:
        path.unlink()

    figures: dict[str, Any] = {
        "fresh interpreter per checkpoint (before)": old_ms,
        "worker, first verification (starts it)": [cold_ms],
        "worker, warm (now)": new_ms,
    }
    section = Section(
        key="torch-verify",
        title=TITLE,
        intro=(
            f"{count + 1} torch.save checkpoints of {size_mb:.1f} MB each (an MLP 512 -> "
            f"{HIDDEN} -> 512: its state_dict, AdamW's state with both moments, the step), "
            "in the page cache. Each is checked as the daemon checks a torch-pt commit: "
            '`torch.load(map_location="cpu", weights_only=True, mmap=True)` in a `python -I` '
            "process, then its keys, step and parameter count. 'Before': a fresh interpreter "
            "per checkpoint, which pays for starting Python and importing torch every time. "
            "'Now': `TorchPt.verify`, whose one worker imported torch once; the first "
            "verification starts it and is shown apart. Each warm file is new to the worker "
            "(a different path), so its cache of files that passed never answers. The two "
            "ways take turns, file after file."
        ),
        header=["verification", "files", "median ms", "max ms", "all (ms)"],
    )
    for label, values in figures.items():
        section.rows.append(
            [
                label,
                str(len(values)),
                fmt_ms(statistics.median(values)),
                fmt_ms(max(values)),
                ", ".join(fmt_ms(v) for v in values),
            ]
        )
    warm_median = statistics.median(new_ms)
    old_median = statistics.median(old_ms)
    section.notes.append(
        f"The warm worker checks a checkpoint {old_median / warm_median:,.0f}x faster than a "
        "fresh interpreter does."
    )
    if ctx.quick:
        section.notes.append(f"Quick mode: {count} files per way; the full run uses {FULL_FILES}.")
    section.raw = {"bytes_median": size_mb * 1e6, **figures}
    section.targets.append(
        Target(
            f"torch-pt verification of a 10 MB checkpoint under {TARGET_MS:.0f} ms (warm worker)",
            f"median {fmt_ms(warm_median)} ms, max {fmt_ms(max(new_ms))} ms "
            f"({size_mb:.1f} MB; before: median {fmt_ms(old_median)} ms)",
            warm_median < TARGET_MS,
        )
    )
    return section
