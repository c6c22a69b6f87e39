"""Step, loss, throughput, MFU, ETA and checkpoint cadence, as label/value lines."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.text import Text
from textual.widgets import Static

from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean

LABEL_WIDTH = 7


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
        row(
            "loss",
            (fmt.loss(t.get("loss")), value),
            ("  ema ", muted),
            (fmt.loss(t.get("loss_ema")), value),
        )
        row(
            "speed",
            (f"{fmt.compact(t.get('tokens_per_s'))} tok/s", value),
            ("  ", muted),
            (f"{_rate(t.get('steps_per_min'))} st/min", value),
        )
        mfu = t.get("mfu")
        if fmt.finite(mfu):
            row(
                "MFU",
                (fmt.percent(mfu), value),
                ("  run avg ", muted),
                (fmt.percent(t.get("mfu_avg")), value),
            )
        else:
            reason = t.get("mfu_unknown_reason")
            row("MFU", ("unknown", value), (f"  {clean(reason, 200)}" if reason else "", muted))
        eta = t.get("eta_s")
        row("ETA", (fmt.duration(eta) if eta is not None else fmt.UNKNOWN, value))
        last_step = t.get("last_checkpoint_step")
        next_step = t.get("next_checkpoint_step")
        parts: list[tuple[str, object]] = []
        if last_step is not None:
            age = model.checkpoint_age_s()
            parts += [
                (fmt.integer(last_step), value),
                (f" {fmt.duration(age)} ago" if age is not None else "", muted),
            ]
        else:
            parts.append(("none yet", muted))
        if model.saving:
            parts.append(("  saving…", busy))
        elif next_step is not None:
            parts += [("  next ", muted), (fmt.integer(next_step), value)]
        row("ckpt", *parts)
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
            warning = "  LOW: the next checkpoint may not fit" if model.disk_low else ""
            row(
                "disk",
                (f"{fmt.size(free)} free", alarm if model.disk_low else value),
                (warning, alarm),
            )


def _rate(value: object) -> str:
    if not fmt.finite(value):
        return fmt.UNKNOWN
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"  # type: ignore[operator]
