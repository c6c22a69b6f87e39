"""5. The reference trainer's checkpoint write: the .bin writer against torch.save and a
raw sequential write of the same bytes, all with fsync, on the same disk; and how long a
save blocks the trainer's step loop.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import PYTHON, REPO, Context, Section, Target
from bench.plots import grouped_bars

TITLE = "5. Checkpoint write"
METHODS = (".bin writer", "torch.save", "raw write")
SAVE_EVERY = 10
CHECKPOINT_LINE = re.compile(r"checkpoint: \S+ saved \(.*, ([0-9.]+) s\)")


def build(quick: bool) -> tuple[Any, Any, str]:
    """(model, optimizer, description): GPT-2 small's shape in full mode, ~50 MB in quick."""
    import torch

    from trainwarden.trainer.model import GPT
    from trainwarden.trainer.presets import PRESETS
    from trainwarden.trainer.startup import build_optimizer

    preset = PRESETS["gpt2-124m"]
    if quick:
        preset = replace(
            preset, name="bench-50mb", n_layer=5, n_head=4, d_model=256, vocab_size=256
        )
    torch.manual_seed(0)
    model = GPT(preset)
    optimizer = build_optimizer(model, preset)
    with torch.no_grad():
        # Moments as a trained run has them: values, not the zeros of step 0.
        for state in optimizer.state.values():
            state.exp_avg.normal_(0, 1e-3)
            state.exp_avg_sq.uniform_(0, 1e-6)
    n_params = sum(p.numel() for p in model.parameters())
    return model, optimizer, f"{preset.name} shape, {n_params:,} parameters"


def tensors(model: Any, optimizer: Any) -> list[Any]:
    """Weights, then Adam m, then Adam v, in parameter order: what the .bin file holds."""
    params = list(model.parameters())
    return (
        [p.detach() for p in params]
        + [optimizer.state[p].exp_avg for p in params]
        + [optimizer.state[p].exp_avg_sq for p in params]
    )


def write_bin(directory: Path, model: Any, optimizer: Any) -> Path:
    from trainwarden.trainer.checkpoint import save_checkpoint

    return save_checkpoint(directory, 1, model, optimizer, {"bench": True})


def write_torch(directory: Path, model: Any, optimizer: Any) -> Path:
    import torch

    path = directory / "checkpoint.pt"
    params = dict(model.named_parameters())
    state = {
        "model": model.state_dict(),
        "exp_avg": {name: optimizer.state[p].exp_avg for name, p in params.items()},
        "exp_avg_sq": {name: optimizer.state[p].exp_avg_sq for name, p in params.items()},
    }
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    return path


def write_raw(directory: Path, model: Any, optimizer: Any) -> Path:
    """The floor: the same bytes straight from the tensors' memory, one sequential file."""
    path = directory / "raw.bin"
    with open(path, "wb") as f:
        f.write(b"\0" * 8)
        for tensor in tensors(model, optimizer):
            tensor.numpy().tofile(f)
        f.flush()
        os.fsync(f.fileno())
    return path


WRITERS = {".bin writer": write_bin, "torch.save": write_torch, "raw write": write_raw}


def clear(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            path.unlink()
    os.sync()


def staging_only(model: Any, optimizer: Any) -> float:
    """The .bin writer's per-tensor work alone, into a sink that discards: no disk."""
    from trainwarden.trainer.checkpoint import _write_float32

    class Discard:
        def write(self, data: Any) -> int:
            return len(data)

    sink = Discard()
    t0 = time.perf_counter()
    for tensor in tensors(model, optimizer):
        _write_float32(sink, tensor)
    return time.perf_counter() - t0


def write_speeds(ctx: Context) -> dict[str, Any]:
    import torch

    directory = ctx.work.dir("checkpoint", "writes")
    model, optimizer, description = build(ctx.quick)
    seconds: dict[str, list[float]] = {m: [] for m in METHODS}
    sizes: dict[str, int] = {}
    staging: list[float] = []
    with torch.no_grad():
        for _ in range(2):
            for method in METHODS:  # interleaved, so a noisy moment hits every method
                clear(directory)
                t0 = time.perf_counter()
                path = WRITERS[method](directory, model, optimizer)
                seconds[method].append(time.perf_counter() - t0)
                sizes[method] = path.stat().st_size
            clear(directory)
            staging.append(staging_only(model, optimizer))
    del model, optimizer
    return {
        "description": description,
        "seconds": seconds,
        "bytes": sizes,
        "staging_only_s": min(staging),
        "commit_fixed_s": commit_fixed_s(ctx.work.dir("checkpoint", "fixed")),
    }


def commit_fixed_s(directory: Path) -> float:
    """save_checkpoint of a 1-parameter model (median of 3): the commit protocol's fixed
    cost (sidecar written atomically, fsyncs of the files and the directory)."""
    import torch

    from trainwarden.trainer.adamw import AdamW

    model = torch.nn.Linear(1, 1, bias=False)
    optimizer = AdamW(
        [{"params": model.parameters(), "weight_decay": 0.0}], 1e-3, (0.9, 0.95), 1e-8
    )
    times = []
    for _ in range(3):
        clear(directory)
        t0 = time.perf_counter()
        write_bin(directory, model, optimizer)
        times.append(time.perf_counter() - t0)
    clear(directory)
    return statistics.median(times)


def step_stall(ctx: Context) -> dict[str, Any]:
    """The tiny reference trainer on CPU, saving every SAVE_EVERY steps: step-line arrival
    times around each save against the steps without one."""
    steps = 30 if ctx.quick else 60
    run_dir = ctx.work.dir("checkpoint", "trainer")
    argv = [
        PYTHON, "-m", "trainwarden.trainer", "--run-dir", str(run_dir), "--preset", "tiny",
        "--device", "cpu", "--steps", str(steps), "--save-every", str(SAVE_EVERY),
        "--sample-every", "0",
    ]  # fmt: skip
    arrivals: dict[int, float] = {}
    reported: list[float] = []
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    ctx.work.procs.append(proc)  # type: ignore[arg-type]
    assert proc.stdout is not None
    for raw in proc.stdout:
        now = time.monotonic()
        line = raw.decode(errors="replace")
        if line.startswith("step: "):
            arrivals[int(line.split(",", 1)[0].split()[1])] = now
        elif match := CHECKPOINT_LINE.search(line):
            reported.append(float(match.group(1)))
    proc.wait(60)
    gaps = {s: arrivals[s] - arrivals[s - 1] for s in arrivals if s - 1 in arrivals}
    after_save = [g for s, g in gaps.items() if (s - 1) % SAVE_EVERY == 0]
    # Step 1 pays for warm-up; the steps right after a save are the ones measured.
    plain = [g for s, g in gaps.items() if (s - 1) % SAVE_EVERY != 0 and s > 2]
    return {
        "steps": steps,
        "returncode": proc.returncode,
        "plain_step_ms": 1000 * statistics.median(plain) if plain else float("nan"),
        "step_after_save_ms": 1000 * statistics.median(after_save) if after_save else float("nan"),
        "stall_ms": 1000 * (statistics.median(after_save) - statistics.median(plain))
        if plain and after_save
        else float("nan"),
        "reported_save_ms": 1000 * statistics.median(reported) if reported else float("nan"),
        "saves": len(reported),
        "checkpoint_bytes": max(
            (p.stat().st_size for p in (run_dir / "checkpoints").glob("step_*.bin")), default=0
        ),
    }


def run(ctx: Context) -> Section:
    speeds = write_speeds(ctx)
    stall = step_stall(ctx)
    seconds, sizes = speeds["seconds"], speeds["bytes"]
    best = {m: min(seconds[m]) for m in METHODS}
    rate = {m: sizes[m] / best[m] for m in METHODS}
    section = Section(
        key="checkpoint",
        title=TITLE,
        intro=(
            f"One model, {speeds['description']}: weights plus AdamW's m and v. Each method "
            "writes all of it to the same directory and fsyncs: the reference trainer's "
            "`trainer.checkpoint.save_checkpoint` (sidecar JSON first, then the .bin to a "
            ".tmp name, fsync, rename, fsync of the directory), `torch.save` of the model's "
            "state_dict and both moment dicts, and a raw write of the same float32 bytes "
            "straight from the tensors' memory (`numpy.tofile`), the floor. The methods take "
            "turns, round after round; the best round counts (the file is deleted and "
            "`sync` run between writes)."
        ),
        header=[
            "method",
            "file MB",
            "seconds (best)",
            "seconds (all rounds)",
            "MB/s",
            "share of raw speed",
        ],  # fmt: skip
        plots=["checkpoint_write.png"],
    )
    for m in METHODS:
        section.rows.append(
            [
                m,
                f"{sizes[m] / 1e6:,.1f}",
                f"{best[m]:.3f}",
                ", ".join(f"{s:.3f}" for s in seconds[m]),
                f"{rate[m] / 1e6:,.0f}",
                f"{100 * rate[m] / rate['raw write']:.0f} %",
            ]  # fmt: skip
        )
    stall_table = [
        ["tiny (reference trainer, measured)", f"{stall['checkpoint_bytes'] / 1e6:.2f}",
         f"{stall['plain_step_ms']:.1f}", f"{stall['step_after_save_ms']:.1f}",
         f"{stall['stall_ms']:.1f}", f"{stall['reported_save_ms']:.1f}"],
        [f"{speeds['description'].split(',')[0]} (the .bin write above)",
         f"{sizes['.bin writer'] / 1e6:,.1f}", "-", "-", f"{1000 * best['.bin writer']:,.0f}",
         f"{1000 * best['.bin writer']:,.0f}"],
    ]  # fmt: skip
    from bench.report import table

    section.extra_markdown = (
        "Training stall per checkpoint. The reference trainer saves inside its step loop, "
        f"so a save delays the next step line by its whole duration. Measured on the tiny "
        f"preset ({stall['steps']} steps on CPU, a save every {SAVE_EVERY}; step lines timed "
        "as they arrive through a pipe) as the median gap after a save minus the median "
        "gap without one, beside the trainer's own `checkpoint: ... (N s)` figure; for the "
        "large model, the .bin write time above is the stall.\n\n"
        + table(
            [
                "model",
                "checkpoint MB",
                "step ms",
                "step after a save ms",
                "stall ms",
                "save as the trainer reports it, ms",
            ],  # fmt: skip
            stall_table,
        )
    )
    ratio = rate[".bin writer"] / rate["raw write"]
    staging, fixed = speeds["staging_only_s"], speeds["commit_fixed_s"]
    why = (
        f"of the writer's {best['.bin writer']:.2f} s (best round), preparing each tensor "
        f"(`_write_float32` into a discarding sink) takes {staging:.2f} s (best round) with "
        "no disk involved "
        f"and the commit protocol (sidecar written atomically, fsync of the .tmp and twice of "
        f"the directory) {fixed:.3f} s, measured on a 1-parameter model; the rest is writing "
        f"and syncing, {best['raw write']:.2f} s for the raw write straight from the "
        "tensors' memory"
    )
    section.notes += [
        f".bin writer vs raw write: {100 * ratio:.0f} % of the raw speed; torch.save: "
        f"{100 * rate['torch.save'] / rate['raw write']:.0f} %.",
        f"Where the .bin writer's time goes: {why}. The staging also converts other dtypes "
        "and devices to CPU float32, which a GPU run needs; tensors already on the CPU in "
        "float32 could be written from their own memory.",
        "All three go through the page cache and then wait for fsync, so on this "
        "virtual disk the figures mostly measure the device; rounds vary by the other "
        "work on the machine.",
    ]
    if stall["returncode"] != 0:
        section.notes.append(f"The tiny trainer exited {stall['returncode']}.")
    grouped_bars(
        ctx.out / "checkpoint_write.png",
        ["write speed (best round)"],
        {m: [rate[m] / 1e6] for m in METHODS},
        "MB/s (with fsync)",
        f"Checkpoint write, {sizes['raw write'] / 1e6:,.0f} MB",
    )
    section.raw = {"writes": speeds, "mb_per_s": {m: rate[m] / 1e6 for m in METHODS},
                   "stall": stall}  # fmt: skip
    section.targets.append(
        Target(
            ".bin writer within 90 % of a raw sequential write",
            f"{100 * ratio:.0f} % ({rate['.bin writer'] / 1e6:,.0f} vs "
            f"{rate['raw write'] / 1e6:,.0f} MB/s)",
            ratio >= 0.9,
            "" if ratio >= 0.9 else why,
        )
    )
    return section
