"""Step, loss, validation loss, throughput, MFU, ETA and checkpoint cadence, as
label/value lines."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.text import Text
from textual.widgets import Static

from trainwarden.supervisor.protocol import HALTED, Phase
from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean

LABEL_WIDTH = 7
SPARK_CELLS = 12
"""Cells of the tokens/s sparkline (the last model.SPARK_WINDOW_S of frames)."""
SPARK_MIN_CELLS = 4
"""Fewer free cells than this on the speed row: no sparkline."""
SLOW_START_S = 60.0
"""A start that logged no step for this long shows the trainer's last output line."""
BLOCKS = "▁▂▃▄▅▆▇█"
NOT_RUNNING = HALTED | {Phase.BACKOFF}
"""Phases with no trainer: a crash before any step leaves its last output line to show."""


def sparkline(values: list[float], cells: int) -> str:
    """The values in `cells` buckets (the mean of each), scaled from their min to max.
    Bar heights differ, so it reads without colour; a flat series is a flat line."""
    if len(values) < 2:
        return ""  # one frame has no shape
    cells = min(cells, len(values))
    buckets = [
        values[i * len(values) // cells : (i + 1) * len(values) // cells] for i in range(cells)
    ]
    means = [sum(b) / len(b) for b in buckets if b]
    low, high = min(means), max(means)
    if high - low <= 1e-9 * max(abs(high), 1.0):
        return BLOCKS[3] * len(means)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((m - low) / (high - low) * top)] for m in means)


class TelemetryPanel(Static):
    COMPONENT_CLASSES = {
        "telemetry--label",
        "telemetry--value",
        "telemetry--muted",
        "telemetry--busy",
    }

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", markup=False, **kwargs)  # type: ignore[arg-type]
        self.border_title = "telemetry"

    def on_resize(self) -> None:
        # Fitted to the width: drawn again for the new one.
        self.app.panel_resized(self.id or "")  # type: ignore[attr-defined]

    def show(self, model: RunModel) -> None:
        label = self.get_component_rich_style("telemetry--label")
        value = self.get_component_rich_style("telemetry--value")
        muted = self.get_component_rich_style("telemetry--muted")
        busy = self.get_component_rich_style("telemetry--busy")
        t = model.telemetry.value or {}
        text = Text(no_wrap=True, overflow="ellipsis")

        def row(name: str, *parts: tuple[str, object]) -> None:
            if text:
                text.append("\n")
            text.append(name.ljust(LABEL_WIDTH), label)
            for part, style in parts:
                text.append(part, style)  # type: ignore[arg-type]

        for hint in model.hints():
            # First, a clause a row, so that 80 columns show it whole: a run with a hint
            # has little else worth reading.
            width = max(self.content_size.width - LABEL_WIDTH, 20)
            clauses = clean(hint, 300).split("; ")
            lines = [
                line
                for clause in clauses
                for line in textwrap.wrap(
                    clause, width, max_lines=3, placeholder=" …", break_on_hyphens=False
                )
            ]
            for i, line in enumerate(lines):
                row("" if i else "hint", (line, busy))
        step, total = t.get("step"), model.total_steps
        progress = ""
        if fmt.finite(step) and total:  # total_steps > 0
            progress = f"  {step / total:.1%}"
        total_text = f" / {fmt.integer(total)}" if total else ""
        row("step", (fmt.integer(step), value), (total_text, muted), (progress, muted))
        stale = model.step_stale()
        step_age = model.step_age_s()
        aged = f" ({fmt.duration(step_age)} ago)" if stale and step_age is not None else ""
        loss, ema = fmt.loss(t.get("loss")), fmt.loss(t.get("loss_ema"))
        loss_parts: list[tuple[str, object]] = [(loss, muted if stale else value), (aged, muted)]
        # The EMA when it fits whole (a stale row's age comes first).
        if LABEL_WIDTH + len(loss) + len(aged) + 6 + len(ema) <= self.content_size.width:
            loss_parts += [("  ema ", muted), (ema, muted if stale else value)]
        row("loss", *loss_parts)
        not_stepping = self._not_stepping(model)
        start_line = self._start_line(model)
        crash_line = self._crash_line(model)
        if start_line is not None:
            row("start", *start_line)
        elif crash_line is not None:
            row("output", *crash_line)
        elif not_stepping is not None:
            # The trainer is not stepping: no speed is true now.
            row("speed", (fmt.UNKNOWN, value), (f"  {not_stepping}", muted))
        else:
            speed = f"{fmt.compact(t.get('tokens_per_s'))} tok/s"
            pace = f"{fmt.rate(t.get('steps_per_min'))} st/min"
            # The sparkline takes the room left on the row, if there is enough for a shape.
            room = self.content_size.width - LABEL_WIDTH - len(speed) - len(pace) - 4
            cells = min(room, SPARK_CELLS) if room >= SPARK_MIN_CELLS else 0
            row(
                "speed",
                (speed, value),
                ("  ", muted),
                (pace, value),
                ("  ", muted),
                (sparkline(model.speed_samples(), cells) if cells else "", value),
            )
        mfu = t.get("mfu")
        if not_stepping is not None:
            row(
                "MFU",
                (fmt.UNKNOWN, value),
                ("  run avg ", muted),
                (fmt.percent(t.get("mfu_avg")), value),
            )
        elif fmt.finite(mfu):
            row(
                "MFU",
                (fmt.percent(mfu), value),
                ("  run avg ", muted),
                (fmt.percent(t.get("mfu_avg")), value),
            )
        else:
            reason = t.get("mfu_unknown_reason")
            text_room = self.content_size.width - LABEL_WIDTH
            row("MFU", *mfu_unknown(clean(reason, 200) if reason else "", text_room, value, muted))
        eta = t.get("eta_s")
        if model.phase == Phase.FINISHED and model.connected:
            row("ETA", ("done", value))
        elif not_stepping is not None:
            row("ETA", (fmt.UNKNOWN, value), (f"  {not_stepping}", muted))
        else:
            row("ETA", (fmt.duration(eta) if eta is not None else fmt.UNKNOWN, value))
        last_step, age = model.newest_checkpoint()
        next_step = t.get("next_checkpoint_step")
        parts: list[tuple[str, object]] = []
        if last_step is not None:
            parts += [
                (fmt.integer(last_step), value),
                (f" {fmt.duration(age)} ago" if age is not None else "", muted),
            ]
        else:
            parts.append(("none yet", muted))
        if model.saving:
            parts.append(("  saving…", busy))
        elif next_step is not None and model.phase != Phase.FINISHED:
            parts += [("  next ", muted), (fmt.integer(next_step), value)]
        stall = model.newest_checkpoint_stall_s()
        if stall is not None:
            # Whole or not at all: a cut "stall 0." would be a false figure.
            stall_text = f"  stall {_seconds(stall)}"
            used = LABEL_WIDTH + sum(len(part) for part, _ in parts)
            if used + len(stall_text) <= self.content_size.width:
                parts.append((stall_text, muted))
        row("ckpt", *parts)
        # Under the checkpoint row: at 80x24 the six rows above are what fits.
        val_step, val_loss = t.get("val_step"), t.get("val_loss")
        if fmt.finite(val_step):  # no row before the run's first evaluation
            val_parts: list[tuple[str, object]] = [
                (fmt.loss(val_loss), value),
                (f" at {fmt.integer(val_step)}", muted),
            ]
            if not fmt.finite(val_loss):
                # Not a divergence: the trainer goes on; say so where the value is.
                val_parts.append(("  not acted on", busy))
            row("val", *val_parts)
        # Below the fold at 80x24; shown when the terminal is taller.
        row(
            "dt",
            (f"{t['dt'] * 1000:.0f} ms" if fmt.finite(t.get("dt")) else fmt.UNKNOWN, value),
            ("  loss avg ", muted),
            (fmt.loss(t.get("loss_avg")), value),
        )
        self._host_rows(model, row, value, muted, busy)
        self.update(text, layout=False)

    @staticmethod
    def _not_stepping(model: RunModel) -> str | None:
        """Why the trainer is not stepping now (None while it is)."""
        if not model.connected:
            return "disconnected"
        if model.stepping:
            return None
        phase = model.phase
        return "not stepping" if phase is None else f"trainer {phase.replace('_', ' ')}"

    def _start_line(self, model: RunModel) -> list[tuple[str, object]] | None:
        """A start that has logged no step for a minute: what the trainer says it does."""
        if not model.connected or model.phase != Phase.STARTING:
            return None
        uptime = model.trainer_uptime_s()
        line = (model.telemetry.value or {}).get("last_line")
        if uptime is None or uptime < SLOW_START_S or not isinstance(line, str):
            return None
        age = model.last_line_age_s()
        muted = self.get_component_rich_style("telemetry--muted")
        return [
            (f"up {fmt.duration(uptime)}: ", muted),
            (clean(line, 200), self.get_component_rich_style("telemetry--value")),
            (f" ({fmt.duration(age)} ago)" if age is not None else "", muted),
        ]

    def _crash_line(self, model: RunModel) -> list[tuple[str, object]] | None:
        """A trainer that has not logged a step and is not running (it crashed before its
        first one, and the daemon backs off or halted): its last output line is the cause."""
        t = model.telemetry.value or {}
        line = t.get("last_line")
        if not model.connected or model.stepping or t.get("step") is not None:
            return None
        if model.phase not in NOT_RUNNING or not isinstance(line, str) or not line.strip():
            return None
        return [(clean(line, 200), self.get_component_rich_style("telemetry--value"))]

    @staticmethod
    def _host_rows(model: RunModel, row: Any, value: Any, muted: Any, alarm: Any) -> None:
        host = model.host or {}
        if not host:
            return
        cpu, rss = host.get("trainer_cpu_percent"), host.get("trainer_rss_bytes")
        if fmt.finite(cpu):
            row(
                "proc",
                (f"cpu {cpu:.0f}%", value),
                (f"  rss {fmt.gib(rss)} GiB" if fmt.finite(rss) else "", muted),
                (f"  {host.get('trainer_processes')} proc", muted),
            )
        used, total = host.get("mem_used_bytes"), host.get("mem_total_bytes")
        load = host.get("load_avg_1m")
        row(
            "host",
            (f"mem {fmt.gib(used)}/{fmt.gib(total)} GiB", value),
            (f"  load {load:.1f}" if fmt.finite(load) else "", muted),
        )
        free = host.get("disk_free_bytes")
        if fmt.finite(free):
            warning = "  ! LOW: the next checkpoint may not fit" if model.disk_low else ""
            row(
                "disk",
                (f"{fmt.size(free)} free", alarm if model.disk_low else value),
                (warning, alarm),
            )


def mfu_unknown(reason: str, width: int, value: object, muted: object) -> list[tuple[str, object]]:
    """The MFU row without a figure: `unknown`, the key to set, then why, as much as fits.
    The daemon's reason ends in what to do ("unknown GPU 'X': set [telemetry] peak_tflops"):
    that part is kept first, so that every width names the key."""
    cause, _, action = reason.rpartition(": set ")
    if not action or not cause:
        return [("unknown", value), (f"  {reason}" if reason else "", muted)]
    key = action.split()[-1]
    for parts in (
        [("unknown", value), (f"  {cause}: set {action}", muted)],
        [("unknown", value), (f"  set {action}", muted)],
        [("unknown", value), (f"  set {key}", muted)],
        [("?", value), (f" set {key}", muted)],
    ):
        if sum(len(text) for text, _ in parts) <= width:
            return parts
    return [("?", value), (f" {key}", muted)]


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:,.0f} s"
