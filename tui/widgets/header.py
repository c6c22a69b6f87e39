"""One line: the run, its state in colour, the trainer, restarts and the resume audit."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Static

from trainwarden.supervisor.protocol import HALTED, Phase
from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean

STATE_CLASS: dict[str, str] = {
    Phase.RUNNING: "running",
    Phase.STARTING: "running",
    Phase.SAVING: "running",
    Phase.STOPPING: "stopped",
    Phase.STOPPED: "stopped",
    Phase.FINISHED: "finished",
    Phase.BACKOFF: "backoff",
    Phase.CRASH_LOOP: "halted",
    Phase.DIVERGED: "halted",
    Phase.PIVOTING: "pivoting",
}
"""The badge's style (a component class below) for each phase."""
SHOWS_REASON = HALTED - {Phase.FINISHED}
"""Halted phases whose reason is worth a place on the line (a finished run needs none)."""


class RunHeader(Static):
    COMPONENT_CLASSES = {
        "run-header--name",
        "run-header--running",
        "run-header--backoff",
        "run-header--halted",
        "run-header--stopped",
        "run-header--finished",
        "run-header--pivoting",
        "run-header--unknown",
        "run-header--disconnected",
        "run-header--verified",
        "run-header--drift",
        "run-header--muted",
        "run-header--read-only",
    }

    def __init__(self, read_only: bool = False, **kwargs: object) -> None:
        super().__init__("", markup=False, **kwargs)  # type: ignore[arg-type]
        self.read_only = read_only

    def style_of(self, name: str) -> str:
        return str(self.get_component_rich_style(f"run-header--{name}"))

    def show(self, model: RunModel) -> None:
        self.update(self.compose_line(model), layout=False)

    def compose_line(self, model: RunModel) -> Text:
        line = Text(no_wrap=True, overflow="ellipsis")
        muted = self.get_component_rich_style("run-header--muted")
        line.append(
            f" {clean(model.run_name, 24)} ", self.get_component_rich_style("run-header--name")
        )
        if self.read_only:
            line.append(" READ-ONLY ", self.get_component_rich_style("run-header--read-only"))
        line.append(" ")
        if not model.connected:
            retry = model.retry_in_s()
            label = " DISCONNECTED - retrying"
            label += f" in {retry:.0f}s " if retry is not None and retry >= 0.5 else "… "
            line.append(label, self.get_component_rich_style("run-header--disconnected"))
            if model.disconnect_reason:
                line.append(f" {clean(model.disconnect_reason, 120)}", muted)
            if model.phase is not None:
                line.append(f"  last known: {model.phase}", muted)
            return line
        line.append(self._badge(model))
        state = model.state.value or {}
        pid = state.get("trainer_pid")
        if isinstance(pid, int) and pid > 0:
            line.append(f"  pid {pid}")
            uptime = model.trainer_uptime_s()
            if uptime is not None:
                line.append(f" up {fmt.duration(uptime)}")
        restarts = state.get("restarts")
        if isinstance(restarts, int):
            line.append(f"  restarts {restarts}", "" if restarts == 0 else self.style_of("backoff"))
        audit = (model.telemetry.value or {}).get("resume_audit")
        status = audit.get("status") if isinstance(audit, dict) else None
        if status == "verified":
            line.append("  ")
            line.append(" resume ✓ ", self.get_component_rich_style("run-header--verified"))
        elif status == "drift" and isinstance(audit, dict):
            line.append("  ")
            line.append(
                f" resume drift @{clean(audit.get('step'), 12)} ",
                self.get_component_rich_style("run-header--drift"),
            )
        elif status == "unverified":
            line.append("  resume unverified", muted)
        if model.disk_full:
            names = ", ".join(clean(Path(f).name, 40) for f in model.disk_full)
            line.append("  ")
            line.append(
                f" DISK FULL: holding {names} ",
                self.get_component_rich_style("run-header--drift"),
            )
        elif model.disk_low:
            line.append("  ")
            line.append(" DISK LOW ", self.get_component_rich_style("run-header--drift"))
        reason = model.detail.get("reason")
        if reason and model.phase in SHOWS_REASON:
            line.append(f"  {clean(reason, 160)}", muted)
        hints = model.hints()
        if hints:
            # The first one whole on the line; the telemetry panel lists them all.
            line.append("  ")
            line.append(
                f" {clean(hints[0], 300)} ", self.get_component_rich_style("run-header--drift")
            )
        return line

    def _badge(self, model: RunModel) -> Text:
        phase = model.phase
        if phase is None:
            return Text(" WAITING ", self.get_component_rich_style("run-header--unknown"))
        label = phase.replace("_", " ").upper()
        if phase == Phase.BACKOFF:
            restart_in = model.restart_in_s()
            if restart_in is not None:
                label += f" restart in {restart_in:.0f}s"
        elif phase == Phase.PIVOTING:
            stage = model.detail.get("pivot_stage") or model.detail.get("stage")
            if stage:
                label += f": {clean(stage, 30)}"
            step = model.detail.get("pivot_step")
            if isinstance(step, int):
                label += f" @{step}"
        style = STATE_CLASS.get(phase, "unknown")
        return Text(f" {label} ", self.get_component_rich_style(f"run-header--{style}"))
