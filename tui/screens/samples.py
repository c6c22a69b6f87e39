"""Every arm's recent samples in full: the run's audit trail of what it trained on."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean

SAMPLE_CHARS = 4000
"""A sample longer than this is cut (with an ellipsis): the trainer writes what it likes."""
REFRESH_S = 2.0


def samples_by_arm(model: RunModel) -> dict[str, list[dict[str, Any]]]:
    """Each arm's samples, newest first; arms in the bandit's order, then any others."""
    samples = (model.samples or {}).get("samples")
    by_arm: dict[str, list[dict[str, Any]]] = {name: [] for name in model.arm_names()}
    for sample in samples if isinstance(samples, list) else []:
        if isinstance(sample, dict):
            by_arm.setdefault(str(sample.get("arm")), []).append(sample)
    for listed in by_arm.values():
        listed.sort(key=_step_of, reverse=True)
    return by_arm


def _step_of(sample: dict[str, Any]) -> int:
    step = sample.get("step")
    return step if isinstance(step, int) else -1


def samples_text(model: RunModel) -> Text:
    text = Text()
    by_arm = samples_by_arm(model)
    if not any(by_arm.values()):
        text.append("no samples yet: the trainer has written none to .samples.json", "dim")
        return text
    for arm, listed in by_arm.items():
        if text:
            text.append("\n\n")
        text.append(clean(arm, 60), "bold")
        text.append(f"  {len(listed)} sample{'s' if len(listed) != 1 else ''}", "dim")
        if not listed:
            text.append("\n  none", "dim")
        for sample in listed:
            step = sample.get("step")
            text.append(f"\n@{step:,}  " if isinstance(step, int) else "\n@?  ", "dim")
            text.append(clean(sample.get("text", ""), SAMPLE_CHARS))
    return text


class SamplesScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,m,q", "close", "back")]

    def __init__(self, model: RunModel) -> None:
        super().__init__(id="samples")
        self.model = model
        self.shown_version = -1

    def compose(self) -> ComposeResult:
        yield Static(Text(" samples: each arm's newest first  (escape closes)"), id="samples-title")
        with VerticalScroll(id="samples-scroll"):
            yield Static(id="samples-body", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_samples()
        self.set_interval(REFRESH_S, self.refresh_samples)
        self.query_one("#samples-scroll").focus()

    def refresh_samples(self) -> None:
        version = self.model.versions["bandit"]
        if version != self.shown_version:
            self.shown_version = version
            self.query_one("#samples-body", Static).update(samples_text(self.model))

    def action_close(self) -> None:
        self.dismiss()
