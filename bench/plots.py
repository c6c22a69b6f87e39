"""The PNG figures RESULTS.md shows (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLORS = {
    "trainwarden": "#1b7837",
    "torchrun": "#c51b7d",
    "supervisord": "#2166ac",
    "bash until-loop": "#8c510a",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(name: str, i: int) -> Any:
    return COLORS.get(name, f"C{i % 10}")


def latency_cdf(
    path: Path,
    samples_ms: Mapping[str, Sequence[float]],
    title: str,
    target_ms: float | None = 50,
) -> None:
    """Share of samples at or below each latency, one line per tool, log x axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    for i, (name, values) in enumerate(samples_ms.items()):
        if not values:
            continue
        xs = sorted(max(v, 1e-3) for v in values)
        ys = [(k + 1) / len(xs) for k in range(len(xs))]
        style = ":" if name.startswith("floor") else "-"
        ax.step(xs, ys, where="post", label=f"{name} (n={len(xs)})", color=_color(name, i),
                linestyle=style)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("share of samples <= x")
    if target_ms is not None:
        ax.axvline(target_ms, color="grey", linewidth=0.8, linestyle="--")
        ax.text(target_ms, 0.02, f" {target_ms:g} ms target", color="grey", fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def grouped_bars(
    path: Path,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    title: str,
    log: bool = False,
    hline: tuple[float, str] | None = None,
) -> None:
    """Bars per group (x) and series (colour); nan values are left out."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [v if v is not None and not math.isnan(v) else 0.0 for v in values]
        bars = ax.bar(xs, ys, width, label=name, color=_color(name, i))
        for bar, value in zip(bars, values, strict=True):
            if value is None or math.isnan(value):
                continue
            ax.annotate(_short(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)  # fmt: skip
    ax.set_xticks(range(len(groups)), groups)
    if log:
        ax.set_yscale("log")
    if hline is not None:
        ax.axhline(hline[0], color="grey", linewidth=0.8, linestyle="--")
        ax.text(-0.45, hline[0], f" {hline[1]}", color="grey", fontsize=8, va="bottom")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def bars_per_group(
    path: Path,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    title: str,
    hlines: Mapping[int, tuple[float, str]] | None = None,
) -> None:
    """One panel per group, each with its own linear y axis (a zero stays visible)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.0), dpi=110)
    if len(groups) == 1:
        axes = [axes]
    names = list(series)
    for g, (ax, group) in enumerate(zip(axes, groups, strict=True)):
        values = [series[n][g] for n in names]
        heights = [v if v is not None and not math.isnan(v) else 0.0 for v in values]
        bars = ax.bar(range(len(names)), heights, color=[_color(n, i) for i, n in enumerate(names)])
        for bar, value in zip(bars, values, strict=True):
            label = "-" if value is None or math.isnan(value) else _short(value)
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
        if hlines and g in hlines:
            y, text = hlines[g]
            ax.axhline(y, color="grey", linewidth=0.8, linestyle="--")
            ax.text(len(names) - 0.5, y, f"{text} ", color="grey", fontsize=8, ha="right",
                    va="bottom")  # fmt: skip
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_title(group, fontsize=10)
        ax.set_ylabel(ylabel if g == 0 else "")
        ax.grid(True, axis="y", alpha=0.3)
        ax.margins(y=0.15)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _short(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2g}"


def scaling(
    path: Path,
    steps: Sequence[int],
    series: Mapping[str, Sequence[float]],
    title: str,
) -> None:
    """Log-log curves of each figure against history length, with a slope-1 guide per
    curve (anchored at its largest point): flat or parallel to it is linear or better."""
    plt = _pyplot()
    names = list(series)
    columns = 2 if len(names) > 1 else 1
    rows = math.ceil(len(names) / columns)
    fig, grid = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.6 * rows), dpi=110,
                             squeeze=False)  # fmt: skip
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    for ax, name in zip(axes, names, strict=False):
        pairs = [(s, v) for s, v in zip(steps, series[name], strict=True) if v and v == v]
        if not pairs:
            ax.set_title(f"{name}\n(not measured)")
            continue
        xs, ys = zip(*pairs, strict=True)
        ax.plot(xs, ys, "o-", color="#1b7837", label="measured")
        x_end, y_end = xs[-1], ys[-1]
        ax.plot(xs, [y_end * x / x_end for x in xs], ":", color="grey", label="linear guide")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("logged steps")
        ax.set_title(name, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
