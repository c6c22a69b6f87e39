"""The GPU's latest NVML sample, or why there is none."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean


class GpuPanel(Static):
    COMPONENT_CLASSES = {"gpu--label", "gpu--value", "gpu--muted", "gpu--alarm"}

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", markup=False, **kwargs)  # type: ignore[arg-type]
        self.border_title = "gpu"

    def show(self, model: RunModel) -> None:
        label = self.get_component_rich_style("gpu--label")
        value = self.get_component_rich_style("gpu--value")
        muted = self.get_component_rich_style("gpu--muted")
        alarm = self.get_component_rich_style("gpu--alarm")
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
        text.append(clean(gpu.get("name") or "GPU", 60), value)
        index = gpu.get("index")
        if isinstance(index, int):
            text.append(f"  #{index}", muted)
        text.append("\nutil ", label)
        text.append(
            f"{gpu['util_percent']}%" if fmt.finite(gpu.get("util_percent")) else "-", value
        )
        text.append("  mem ", label)
        text.append(
            f"{fmt.gib(gpu.get('mem_used_bytes'))}/{fmt.gib(gpu.get('mem_total_bytes'))} GiB", value
        )
        text.append("\ntemp ", label)
        temp = gpu.get("temperature_c")
        text.append(f"{temp}°C" if fmt.finite(temp) else "-", value)
        text.append("  power ", label)
        power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
        power_text = f"{power:.0f}" if fmt.finite(power) else "-"
        if fmt.finite(limit):
            power_text += f"/{limit:.0f}"
        text.append(f"{power_text} W", value)
        clock = gpu.get("sm_clock_mhz")
        if fmt.finite(clock):
            text.append(f"  {clock} MHz", muted)
        reasons = gpu.get("throttle_reasons")
        text.append("\nthrottle ", label)
        if isinstance(reasons, list) and reasons:
            text.append(
                ", ".join(clean(r, 40) for r in reasons), alarm if gpu.get("alarming") else value
            )
        else:
            text.append("none" if isinstance(reasons, list) else "-", value)
        ecc = gpu.get("ecc_volatile_errors")
        if fmt.finite(ecc) and ecc:
            text.append(f"  ECC errors {ecc}", alarm)
        self.update(text, layout=False)
