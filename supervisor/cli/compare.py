"""`trainwarden compare RUN_A RUN_B`: two runs that share an ancestor step (one branched
from the other, or both from one run), read from their files (no daemon needed): the
branch point, the loss of both at matching steps after it (raw and EMA-smoothed, and the
validation loss where both have one), the first step where they differ by more than the
tolerance, and which is lower over the last window."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainwarden.supervisor.cli.output import print_json
from trainwarden.supervisor.config_schema import TelemetryConfig
from trainwarden.supervisor.errors import TrainwardenError, UsageError
from trainwarden.supervisor.store.branches import BranchFileInvalid, read_branch
from trainwarden.supervisor.store.lossdb import encode_loss
from trainwarden.supervisor.store.runseries import RunSeries, Series, read_run_series, spans

DEFAULT_TOLERANCE = 0.0
"""Any difference: branches made from one checkpoint start bit-identical."""
DEFAULT_WINDOW = 100
"""Steps (of the newest matching ones) over which the lower run is judged."""
TABLE_ROWS = 20
VAL_ROWS = 8


class NoHistory(TrainwardenError):
    """A run has logged no step yet: nothing to compare."""


@dataclass(frozen=True)
class Ancestor:
    run: Path
    """The run both lineages take the shared steps from."""
    step: int
    """The newest step both lineages share (the branch point)."""


def common_ancestor(a: RunSeries, b: RunSeries) -> Ancestor | None:
    """The newest step both lineages take from the same run; None when they share none."""
    spans_b = {path: (after, through) for path, after, through in spans(b.lineage)}
    best: Ancestor | None = None
    for path, after_a, through_a in spans(a.lineage):
        if path not in spans_b:
            continue
        after_b, through_b = spans_b[path]
        if through_a is None and through_b is None:
            continue  # one run compared with itself: refused before this
        shared = min(s for s in (through_a, through_b) if s is not None)
        floor = max((s for s in (after_a, after_b) if s is not None), default=-1)
        if shared > floor and (best is None or shared > best.step):
            best = Ancestor(path, shared)
    return best


def ema(losses: np.ndarray, beta: float) -> np.ndarray:
    """The bias-corrected moving average the daemon shows, non-finite losses left out of
    it (nan until the first finite one).

    Over the finite losses in blocks: within a block the recurrence is a cumulative sum
    of the losses scaled by beta^-i, short enough that beta^-i stays a modest number; a
    Python loop per step would take seconds over weeks of steps."""
    finite = np.isfinite(losses)
    values = losses[finite]
    smoothed = np.empty(len(values))
    block = int(min(max(100 / -math.log10(beta), 1), 256))
    powers = np.arange(block)
    up, down, carry = beta**-powers, beta**powers, beta ** (powers + 1)
    previous = 0.0
    for j in range(0, len(values), block):
        chunk = values[j : j + block]
        n = len(chunk)
        run = np.cumsum(chunk * up[:n]) * down[:n] * (1.0 - beta) + previous * carry[:n]
        smoothed[j : j + n] = run
        previous = float(run[-1])
    smoothed /= 1.0 - beta ** (np.arange(len(values)) + 1.0)
    latest = np.cumsum(finite) - 1  # the finite loss at or before each step
    out = np.full(len(losses), math.nan)
    seen = latest >= 0
    out[seen] = smoothed[latest[seen]]
    return out


def _at(series: Series, values: np.ndarray, steps: np.ndarray) -> np.ndarray:
    return values[np.searchsorted(series.steps, steps)]


def _differ(x: float, y: float, tolerance: float) -> bool:
    if math.isfinite(x) and math.isfinite(y):
        return abs(x - y) > tolerance
    return not (math.isnan(x) and math.isnan(y)) and x != y


def _evenly(n: int, rows: int) -> list[int]:
    """At most `rows` indices spread evenly over range(n), first and last included."""
    if n <= rows:
        return list(range(n))
    return sorted({round(i * (n - 1) / (rows - 1)) for i in range(rows)})


def _mean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else None


def _lower(a: float | None, b: float | None) -> str | None:
    if a is None or b is None or a == b:
        return None
    return "a" if a < b else "b"


def _losses(values: np.ndarray) -> list[float | str]:
    if np.isfinite(values).all():
        return values.tolist()  # type: ignore[no-any-return]
    return [encode_loss(v) for v in values.tolist()]


def compare(
    a: RunSeries, b: RunSeries, ancestor: Ancestor, tolerance: float, window: int, beta: float
) -> dict[str, Any]:
    """Everything `compare` shows, as JSON-safe values (non-finite losses as lossdb writes them)."""
    ema_a, ema_b = ema(a.train.losses, beta), ema(b.train.losses, beta)
    # Each series holds a step once, in order: no need for intersect1d's own unique().
    steps = np.intersect1d(a.train.steps, b.train.steps, assume_unique=True)
    steps = steps[steps >= ancestor.step]
    loss_a, loss_b = _at(a.train, a.train.losses, steps), _at(b.train, b.train.losses, steps)
    smooth_a, smooth_b = _at(a.train, ema_a, steps), _at(b.train, ema_b, steps)
    val_steps = np.intersect1d(a.val.steps, b.val.steps, assume_unique=True)
    val_steps = val_steps[val_steps >= ancestor.step]
    val_a, val_b = _at(a.val, a.val.losses, val_steps), _at(b.val, b.val.losses, val_steps)

    after = steps > ancestor.step
    first = None
    after_rows = zip(
        steps[after].tolist(), loss_a[after].tolist(), loss_b[after].tolist(), strict=True
    )
    for step, x, y in after_rows:
        if _differ(x, y, tolerance):
            first = {"step": step, "a": encode_loss(x), "b": encode_loss(y)}
            break
    lower: dict[str, Any] | None = None
    if after.any():
        last = int(steps[-1])
        recent = after & (steps > last - window)
        mean_a, mean_b = _mean(loss_a[recent]), _mean(loss_b[recent])
        lower = {
            "run": _lower(mean_a, mean_b),
            "from_step": int(steps[recent][0]),
            "to_step": last,
            "a_mean": mean_a,
            "b_mean": mean_b,
            "val": None,
        }
        val_after = (val_steps > ancestor.step) & (val_steps > last - window)
        if val_after.any():
            x, y = float(val_a[val_after][-1]), float(val_b[val_after][-1])
            fx, fy = (v if math.isfinite(v) else None for v in (x, y))
            lower["val"] = {
                "run": _lower(fx, fy),
                "step": int(val_steps[val_after][-1]),
                "a": encode_loss(x),
                "b": encode_loss(y),
            }
    return {
        "a": _describe(a),
        "b": _describe(b),
        "branch": {"run": str(ancestor.run), "step": ancestor.step},
        "tolerance": tolerance,
        "window": window,
        "ema_beta": beta,
        "steps": steps.tolist(),
        "a_loss": _losses(loss_a),
        "b_loss": _losses(loss_b),
        "a_ema": _losses(smooth_a),
        "b_ema": _losses(smooth_b),
        "val_steps": val_steps.tolist(),
        "a_val": _losses(val_a),
        "b_val": _losses(val_b),
        "first_difference": first,
        "lower": lower,
    }


def _describe(run: RunSeries) -> dict[str, Any]:
    return {
        "run": str(run.run),
        "lineage": [[str(path), step] for path, step in run.lineage],
        "last_step": int(run.train.steps[-1]) if len(run.train) else None,
    }


def _load(path: str) -> RunSeries:
    run_dir = Path(path).expanduser()
    if not run_dir.is_dir():
        raise UsageError(f"{path}: no such run directory (give the folder of a run)")
    try:
        series = read_run_series(run_dir)
    except (OSError, BranchFileInvalid) as exc:
        raise UsageError(f"{path}: cannot read its history ({exc})") from None
    if not len(series.train):
        raise NoHistory(f"{path}: no loss history yet (.loss.json has no step): nothing to compare")
    return series


def _lost_parent(run: RunSeries) -> Path | None:
    """The parent the oldest reachable run of the lineage names but that is gone."""
    try:
        info = read_branch(run.lineage[0][0])
    except BranchFileInvalid:
        return None
    return info.parent if info is not None and not info.parent.is_dir() else None


def cmd_compare(args: argparse.Namespace) -> int:
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    window = DEFAULT_WINDOW if args.window is None else args.window
    if tolerance < 0 or not math.isfinite(tolerance):
        raise UsageError(f"--tolerance {tolerance:g}: give a loss difference >= 0")
    if window < 1:
        raise UsageError(f"--window {window}: give a number of steps >= 1")
    a, b = _load(args.run_a), _load(args.run_b)
    if a.run == b.run:
        raise UsageError(f"{args.run_a} and {args.run_b} are the same run: name two runs")
    ancestor = common_ancestor(a, b)
    if ancestor is None:
        for name, run in ((args.run_a, a), (args.run_b, b)):
            if (lost := _lost_parent(run)) is not None:
                raise UsageError(
                    f"{name} is a branch of {lost}, which is not reachable: put the parent "
                    "back at that path to compare from the branch point"
                )
        raise UsageError(
            f"{args.run_a} and {args.run_b} share no ancestor step: compare a run with its "
            "branch or two branches of one run (`trainwarden branch`)"
        )
    result = compare(a, b, ancestor, tolerance, window, TelemetryConfig().ema_beta)
    if args.json:
        print_json(result)
    else:
        print(format_compare(result, args.run_a, args.run_b))
    return 0


def _cell(value: float | str | None, width: int = 8) -> str:
    if value is None:
        return "".rjust(width)
    if isinstance(value, str):
        return value.rjust(width)
    return f"{value:.4f}".rjust(width)


def format_compare(result: dict[str, Any], name_a: str, name_b: str) -> str:
    branch = result["branch"]
    where = {
        result["a"]["run"]: f"A is B's ancestor ({name_a})",
        result["b"]["run"]: f"B is A's ancestor ({name_b})",
    }.get(branch["run"], f"both from {branch['run']}")
    lines = [f"A  {name_a}", f"B  {name_b}", f"branch point: step {branch['step']:,}, {where}"]
    steps = result["steps"]
    rows_after = [i for i, step in enumerate(steps) if step > branch["step"]]
    if not rows_after:
        lines.append("no step after the branch point in both runs yet")
        return "\n".join(lines)
    first = result["first_difference"]
    tolerance = result["tolerance"]
    if first is None:
        lines.append(f"no difference > {tolerance:g} at the {len(rows_after):,} matching steps")
    else:
        lines.append(
            f"first difference > {tolerance:g}: step {first['step']:,} "
            f"(A {_cell(first['a'], 0)}, B {_cell(first['b'], 0)})"
        )
    lower = result["lower"]
    winner = {"a": "A", "b": "B", None: "neither"}[lower["run"]]
    text = (
        f"lower over the last {result['window']:,} steps "
        f"({lower['from_step']:,}-{lower['to_step']:,}): {winner}, train mean "
        f"A {_cell(lower['a_mean'], 0)} vs B {_cell(lower['b_mean'], 0)}"
    )
    val = lower["val"]
    if val is not None:
        val_winner = {"a": "A", "b": "B", None: "neither"}[val["run"]]
        text += (
            f"; validation at step {val['step']:,}: {val_winner}, "
            f"A {_cell(val['a'], 0)} vs B {_cell(val['b'], 0)}"
        )
    lines.append(text)
    val_at = dict(
        zip(result["val_steps"], zip(result["a_val"], result["b_val"], strict=True), strict=True)
    )
    shown = {steps[rows_after[i]] for i in _evenly(len(rows_after), TABLE_ROWS)}
    val_after = [s for s in result["val_steps"] if s > branch["step"]]
    shown |= {val_after[i] for i in _evenly(len(val_after), VAL_ROWS)}
    if first is not None:
        shown.add(first["step"])
    index = {step: i for i, step in enumerate(steps)}
    has_val = bool(val_after)
    header = f"{'step':>9}  {'A loss':>8} {'A ema':>8}  {'B loss':>8} {'B ema':>8}"
    lines += ["", header + (f"  {'A val':>8} {'B val':>8}" if has_val else "")]
    for step in sorted(shown):
        i = index.get(step)
        row = f"{step:>9,}  "
        if i is None:
            row += " " * 36
        else:
            row += (
                f"{_cell(result['a_loss'][i])} {_cell(result['a_ema'][i])}  "
                f"{_cell(result['b_loss'][i])} {_cell(result['b_ema'][i])}"
            )
        if has_val:
            va, vb = val_at.get(step, (None, None))
            row += f"  {_cell(va)} {_cell(vb)}"
        lines.append(row.rstrip())
    return "\n".join(lines)
