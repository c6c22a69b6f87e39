"""The GPU: bars for utilisation and memory, sparklines of the last minutes, a marked
warning when it throttles; or why there is no sample."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual.widgets import Static

from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean

BAR_CELLS = 10
SPARK_GLYPHS = "▁▂▃▄▅▆▇█"
THROTTLE_MARK = "⚠"


def bar(fraction: float | None, cells: int = BAR_CELLS) -> str:
    """`cells` cells filled in proportion to `fraction` (0..1); blank when unknown."""
    if fraction is None:
        return "·" * cells
    filled = round(min(max(fraction, 0.0), 1.0) * cells)
    return "█" * filled + "░" * (cells - filled)


def sparkline(
    values: Iterable[Any], cells: int, low: float | None = None, high: float | None = None
) -> str:
    """The newest `cells` values as block glyphs between `low` and `high` (default: their
    own range); a missing value is a space."""
    picked = list(values)[-cells:] if cells > 0 else []
    finite = [v for v in picked if fmt.finite(v)]
    if not finite:
        return ""
    low = min(finite) if low is None else low
    high = max(finite) if high is None else high
    span = high - low
    top = len(SPARK_GLYPHS) - 1
    glyphs = []
    for v in picked:
        if not fmt.finite(v):
            glyphs.append(" ")
        elif span <= 0:
            glyphs.append(SPARK_GLYPHS[top // 2])
        else:
            level = round((min(max(v, low), high) - low) / span * top)
            glyphs.append(SPARK_GLYPHS[level])
    return "".join(glyphs)


class GpuPanel(Static):
    COMPONENT_CLASSES = {"gpu--label", "gpu--value", "gpu--muted", "gpu--alarm", "gpu--spark"}

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", markup=False, **kwargs)  # type: ignore[arg-type]
        self.border_title = "gpu"

    def on_resize(self) -> None:
        # Fitted to the width: drawn again for the new one.
        self.app.panel_resized(self.id or "")  # type: ignore[attr-defined]

    def show(self, model: RunModel) -> None:
        label = self.get_component_rich_style("gpu--label")
        value = self.get_component_rich_style("gpu--value")
        muted = self.get_component_rich_style("gpu--muted")
        alarm = self.get_component_rich_style("gpu--alarm")
        spark = self.get_component_rich_style("gpu--spark")
        gpu = model.gpu
        text = Text(no_wrap=True, overflow="ellipsis")
        if not model.gpu_seen:
            text.append("waiting for the first sample", muted)
            self.update(text, layout=False)
            return
        if gpu is None:
            status = model.gpu_status
            if status and status.startswith("no NVIDIA GPU"):
                text.append("no NVIDIA GPU", value)
                text.append(clean(status[len("no NVIDIA GPU") :], 300), muted)
            else:
                text.append("no NVIDIA GPU", value)
                if status and status not in ("ok", "not sampled yet"):
                    text.append(f"\n{clean(status, 300)}", muted)
            self.update(text, layout=False)
            return
        width = self.content_size.width or 36
        history = list(model.gpu_samples) or [gpu]
        reasons = gpu.get("throttle_reasons")
        throttled = isinstance(reasons, list) and bool(reasons)
        if throttled:
            # First and marked, so it reads without colour and survives a short panel.
            assert isinstance(reasons, list)
            text.append(f"{THROTTLE_MARK} throttled: ", alarm)
            text.append(", ".join(clean(r, 40) for r in reasons), alarm)
            text.append("  ")
        text.append(clean(gpu.get("name") or "GPU", 60), value)
        index = gpu.get("index")
        if isinstance(index, int):
            text.append(f"  #{index}", muted)

        util = gpu.get("util_percent")
        util_text = f" {util:>3}% " if fmt.finite(util) else "   -  "
        text.append("\nutil ", label)
        text.append(bar(util / 100 if fmt.finite(util) else None), value)
        text.append(util_text, value)
        room = width - 5 - BAR_CELLS - len(util_text)
        text.append(sparkline((s.get("util_percent") for s in history), room, 0, 100), spark)

        used, total = gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes")
        fraction = used / total if fmt.finite(used) and fmt.finite(total) and total else None
        text.append("\nmem  ", label)
        text.append(bar(fraction), value)
        text.append(f" {fmt.gib(used)}/{fmt.gib(total)} GiB", value)

        temp = gpu.get("temperature_c")
        power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
        temp_text = f"{temp}°C " if fmt.finite(temp) else "- "
        power_text = f"{power:.0f}" if fmt.finite(power) else "-"
        if fmt.finite(limit):
            power_text += f"/{limit:.0f}"
        power_text += " W "
        cells = max((width - 5 - len(temp_text) - 2 - len(power_text)) // 2, 0)
        text.append("\ntemp ", label)
        text.append(temp_text, value)
        text.append(sparkline((s.get("temperature_c") for s in history), cells), spark)
        text.append("  ")
        text.append(power_text, value)
        power_high = limit if fmt.finite(limit) else None
        text.append(sparkline((s.get("power_w") for s in history), cells, 0, power_high), spark)

        text.append("\nthrottle ", label)
        if throttled:
            text.append(f"{THROTTLE_MARK} yes", alarm)
        else:
            text.append("none" if isinstance(reasons, list) else "-", value)
        clock = gpu.get("sm_clock_mhz")
        if fmt.finite(clock):
            text.append(f"  {clock} MHz", muted)
        ecc = gpu.get("ecc_volatile_errors")
        if fmt.finite(ecc) and ecc:
            text.append(f"  {THROTTLE_MARK} ECC errors {ecc}", alarm)
        self.update(text, layout=False)
