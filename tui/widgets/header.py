"""One line: the run, its state in colour, the trainer, restarts, the resume audit and the
Slurm job the daemon runs in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from trainwarden.supervisor.journal_text import causes_text, slurm_short_text
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
    Phase.GPU_FAULT: "halted",
    Phase.NO_CHECKPOINT: "halted",
    Phase.PIVOTING: "pivoting",
}
"""The badge's style (a component class below) for each phase."""
SHOWS_REASON = HALTED - {Phase.FINISHED}
"""Halted phases whose reason is worth a place on the line (a finished run needs none)."""


# What goes first when the line is too narrow: the highest number (a field is dropped
# whole, so no number is ever cut).
KEEP, WARNING, PROGRESS, ETA, AUDIT, RESTARTS, PID, SLURM, UPTIME, STEPS, CAUSES = range(11)
BAR_MIN, BAR_MAX = 8, 24
"""Cells of the progress bar: it grows into the room the other fields leave."""


@dataclass
class Field:
    text: Text
    rank: int
    """KEEP ... CAUSES: the order in which fields are dropped, last first (the restarts'
    causes and step/total first: `trainwarden status` and the telemetry panel show them too;
    then the trainer's uptime; the Slurm job after it, as its end is a deadline the run
    meets; the pid, which a user needs to act on the trainer, late)."""
    bar: float | None = None
    """Set for the progress bar: the fraction done (its text is drawn at fit time)."""
    after: Text | None = None
    """Drawn after the bar (its percentage), dropped with it."""


def progress_bar(done: float, width: int, full: Style | str = "", empty: Style | str = "") -> Text:
    """`━━━━━╸────`: heavy for done, light for to do, so it reads without colour."""
    halves = round(done * width * 2)
    whole, half = divmod(halves, 2)
    bar = Text("━" * whole + "╸" * half, full)
    bar.append("─" * (width - whole - half), empty)
    return bar


def fit(fields: list[Field], width: int) -> Text:
    """The fields that fit `width` cells, in their order, dropping the lesser first."""
    kept = list(fields)

    def cells(bar: int) -> int:
        return sum(
            f.text.cell_len
            + (f.after.cell_len if f.after is not None else 0)
            + (bar if f.bar is not None else 0)
            for f in kept
        )

    while width > 0 and cells(BAR_MIN) > width and any(f.rank > KEEP for f in kept):
        # The lesser first, and of equals the one furthest right.
        worst = max(f.rank for f in kept)
        last = max(i for i, f in enumerate(kept) if f.rank == worst)
        del kept[last]
    bar_width = BAR_MIN if width <= 0 else min(max(width - cells(0) - 1, BAR_MIN), BAR_MAX)
    line = Text(no_wrap=True, overflow="ellipsis")
    for f in kept:
        line.append_text(f.text)
        if f.bar is not None:
            line.append_text(progress_bar(f.bar, bar_width, "bold", "dim"))
        if f.after is not None:
            line.append_text(f.after)
    return line


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

    def on_resize(self) -> None:
        # Fitted to the width: drawn again for the new one.
        self.app.panel_resized(self.id or "")  # type: ignore[attr-defined]

    def style_of(self, name: str) -> str:
        return str(self.get_component_rich_style(f"run-header--{name}"))

    def show(self, model: RunModel) -> None:
        self.update(self.compose_line(model), layout=False)

    def compose_line(self, model: RunModel) -> Text:
        muted = self.get_component_rich_style("run-header--muted")
        name = Text(
            f" {clean(model.run_name, 24)} ", self.get_component_rich_style("run-header--name")
        )
        if not model.connected:
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append_text(name)
            self._read_only(line)
            line.append(" ")
            retry = model.retry_in_s()
            label = " DISCONNECTED - retrying"
            label += f" in {retry:.0f}s " if retry is not None and retry >= 0.5 else "… "
            line.append(label, self.get_component_rich_style("run-header--disconnected"))
            if model.disconnect_reason:
                line.append(f" {clean(model.disconnect_reason, 120)}", muted)
            if model.phase is not None:
                line.append(f"  last known: {model.phase}", muted)
            return line
        fields: list[Field] = [Field(name, KEEP)]
        if self.read_only:
            fields.append(Field(Text(" READ-ONLY ", self.style_of("read-only")), KEEP))
        fields.append(Field(Text(" ") + self._badge(model), KEEP))
        state = model.state.value or {}
        pid = state.get("trainer_pid")
        if isinstance(pid, int) and pid > 0:
            fields.append(Field(Text(f"  pid {pid}"), PID))
            uptime = model.trainer_uptime_s()
            if uptime is not None:
                fields.append(Field(Text(f" up {fmt.duration(uptime)}"), UPTIME))
        restarts = state.get("restarts")
        if isinstance(restarts, int):
            style = "" if restarts == 0 else self.style_of("backoff")
            fields.append(Field(Text(f"  restarts {restarts}", style), RESTARTS))
            causes = clean(causes_text(state.get("restarts_by_cause")), 200)
            if causes:
                fields.append(Field(Text(f" ({causes})", muted), CAUSES))
        job = clean(slurm_short_text(state.get("slurm"), model.slurm_ends_in_s()), 60)
        if job:
            fields.append(Field(Text(f"  {job}", muted), SLURM))
        audit = (model.telemetry.value or {}).get("resume_audit")
        status = audit.get("status") if isinstance(audit, dict) else None
        if status == "verified":
            fields.append(Field(Text("  ") + Text(" resume ✓ ", self.style_of("verified")), AUDIT))
        elif status == "drift" and isinstance(audit, dict):
            fields.append(self._warning(f"resume drift @{clean(audit.get('step'), 12)}"))
        elif status == "unverified":
            fields.append(Field(Text("  resume unverified", muted), AUDIT))
        if model.disk_full:
            names = ", ".join(clean(Path(f).name, 40) for f in model.disk_full)
            fields.append(self._warning(f"DISK FULL: holding {names}"))
        elif model.disk_low:
            fields.append(self._warning("DISK LOW"))
        if state.get("config_changed") is True:
            # Short here; the telemetry panel's hint says what to do, whole.
            fields.append(self._warning("CONFIG CHANGED"))
        if (model.gpu or {}).get("alarming") is True:
            fields.append(self._warning("GPU THROTTLED"))
        reason = model.detail.get("reason")
        if reason and model.phase in SHOWS_REASON:
            fields.append(Field(Text(f"  {clean(reason, 160)}", muted), WARNING))
        fields += self._progress(model)
        line = fit(fields, self.size.width)
        # The edited config is a warning above; its hint is the telemetry panel's.
        hints = [h for h in model.hints() if h != state.get("config_notice")]
        if hints:
            # The first one on the line, cut at its end if it must; the telemetry panel
            # lists them all, whole.
            line.append("  ")
            line.append(f" ! {clean(hints[0], 300)} ", self.style_of("drift"))
        return line

    def _read_only(self, line: Text) -> None:
        if self.read_only:
            line.append(" READ-ONLY ", self.get_component_rich_style("run-header--read-only"))

    def _warning(self, text: str) -> Field:
        """A warning: marked with `!` so it reads without colour too."""
        return Field(Text("  ") + Text(f" ! {text} ", self.style_of("drift")), WARNING)

    def _progress(self, model: RunModel) -> list[Field]:
        """The run's progress bar (step / total) and, while the trainer steps, its ETA."""
        t = model.telemetry.value or {}
        step, total = t.get("step"), model.total_steps
        fields: list[Field] = []
        if isinstance(step, int) and total:
            done = min(max(step / total, 0.0), 1.0)
            # Floored: 100% only at the total.
            percent = Text(f" {int(done * 100)}%".rjust(5))
            fields.append(Field(Text("  "), PROGRESS, bar=done, after=percent))
            fields.append(
                Field(
                    Text(f" {fmt.integer(step)}/{fmt.integer(total)}", self.style_of("muted")),
                    STEPS,
                )
            )
        eta = t.get("eta_s")
        if model.stepping and fmt.finite(eta):
            fields.append(Field(Text(f"  ETA {fmt.duration(eta)}"), ETA))
        return fields

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
