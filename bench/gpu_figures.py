"""The pure parts of bench/gpu_check.py: what its figures mean and how its table reads.

No torch, no GPU, no processes: MFU arithmetic, throughput from step lines, the save
reports, the resume comparison and the table, so a CPU machine tests them all.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainwarden.supervisor.contract import parse_save_report
from trainwarden.supervisor.shell.telemetry import flops_per_token
from trainwarden.trainer.presets import Preset

STEP_LINE = re.compile(r"^step: (\d+), loss: ([^,]+), dt: ([0-9.]+)")
LEGACY_SAVE_ELAPSED = re.compile(r", ([0-9]+(?:\.[0-9]+)?) s\)\s*$")
"""`checkpoint: step_000004.bin saved (final, 1490.0 MB, 3.21 s)`: a save line from
before the stall and write figures; that trainer's loop waited for the whole write."""

PART_SHARES: dict[str, float] = {
    "adamw": 0.06,
    "eager": 0.14,
    "compile": 0.28,
    "save-async": 0.14,
    "save-sync": 0.14,
    "resume": 0.20,
}
"""Each part's share of --minutes (the rest is start-up and NVML, which take seconds)."""


@dataclass(frozen=True)
class Row:
    check: str
    result: str
    detail: str = ""


def part_budgets(minutes: float) -> dict[str, float]:
    """Seconds each part may take, out of `minutes` for the whole check."""
    return {part: share * minutes * 60.0 for part, share in PART_SHARES.items()}


def model_flops_per_token(preset: Preset) -> float:
    """Training FLOPs per token of a preset: 6N plus attention (DESIGN.md section 5)."""
    attention = {"n_layer": preset.n_layer, "seq_len": preset.seq_len, "d_model": preset.d_model}
    return flops_per_token(preset.n_params, attention)


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction; None without a known peak."""
    if peak_tflops is None or peak_tflops <= 0:
        return None
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12)


@dataclass(frozen=True)
class StepLine:
    loss: str
    """As printed: comparing the text compares the value at the printed precision."""
    dt_s: float


def step_lines(lines: Iterable[str]) -> dict[int, StepLine]:
    """The step lines of one trainer run, by step (a replayed step keeps its newest line)."""
    steps = {}
    for line in lines:
        match = STEP_LINE.match(line)
        if match:
            steps[int(match.group(1))] = StepLine(match.group(2), float(match.group(3)))
    return steps


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float
    median_step_s: float
    timed_steps: int


def throughput(
    steps: Mapping[int, StepLine], tokens_per_step: int, warmup: int
) -> Throughput | None:
    """Tokens per second over the steps after the first `warmup` (compile, allocator
    warm-up, cuDNN autotuning happen there); None when no step is left to time."""
    timed = [line.dt_s for step, line in sorted(steps.items()) if step > warmup]
    if not timed or sum(timed) <= 0:
        return None
    return Throughput(
        tokens_per_step * len(timed) / sum(timed), statistics.median(timed), len(timed)
    )


@dataclass(frozen=True)
class SaveFigures:
    stall_s: float
    write_s: float | None


def save_figures(lines: Iterable[str]) -> list[SaveFigures]:
    """The stall and write time of each committed save a trainer reported."""
    saves = []
    for line in lines:
        report = parse_save_report(line)
        if report is None:
            continue
        if report.stall_s is not None:
            saves.append(SaveFigures(report.stall_s, report.write_s))
            continue
        legacy = LEGACY_SAVE_ELAPSED.search(line)
        if legacy is not None:
            elapsed = float(legacy.group(1))
            saves.append(SaveFigures(elapsed, elapsed))
    return saves


def save_row(label: str, saves: Sequence[SaveFigures], size_mb: float) -> Row:
    if not saves:
        return Row(label, "no save reported", "the trainer printed no `checkpoint: ... saved` line")
    stalls = [save.stall_s for save in saves]
    writes = [save.write_s for save in saves if save.write_s is not None]
    write = f", write median {statistics.median(writes):.3f} s" if writes else ""
    return Row(
        label,
        f"stall median {statistics.median(stalls):.3f} s",
        f"max {max(stalls):.3f} s{write}; {len(saves)} saves of {size_mb:.1f} MB",
    )


@dataclass(frozen=True)
class ResumeComparison:
    compared: int
    """Step lines of the interrupted runs that the straight run also logged (a step
    replayed after a kill counts once per time it was logged)."""
    differing: int
    max_abs_diff: float
    missing: tuple[int, ...]
    """Steps of the straight run the interrupted runs never logged."""

    @property
    def exact(self) -> bool:
        return self.compared > 0 and self.differing == 0 and not self.missing

    def text(self) -> str:
        if self.compared == 0:
            return "nothing to compare"
        if self.missing:
            return f"{len(self.missing)} steps never logged"
        if self.exact:
            return "bit-exact"
        return f"max |loss diff| {self.max_abs_diff:.3g}"


def compare_losses(
    reference: Mapping[int, str], logged: Iterable[tuple[int, str]]
) -> ResumeComparison:
    """Every (step, loss) the interrupted and resumed runs logged, replays included,
    against the loss the straight run logged at that step."""
    compared = differing = 0
    worst = 0.0
    seen = set()
    for step, loss in logged:
        seen.add(step)
        if step not in reference:
            continue
        compared += 1
        if loss != reference[step]:
            differing += 1
            worst = max(worst, _abs_diff(reference[step], loss))
    missing = tuple(sorted(set(reference) - seen))
    return ResumeComparison(compared, differing, worst, missing)


def _abs_diff(a: str, b: str) -> float:
    try:
        difference = abs(float(a) - float(b))
    except ValueError:
        return math.inf
    return math.inf if math.isnan(difference) else difference


def percent(fraction: float | None) -> str:
    return "unknown" if fraction is None else f"{100 * fraction:.1f} %"


def format_table(rows: Sequence[Row]) -> str:
    """One Markdown table: check, result, detail."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| check | result | detail |", "|---|---|---|"]
    lines += [f"| {cell(r.check)} | {cell(r.result)} | {cell(r.detail)} |" for r in rows]
    return "\n".join(lines)
