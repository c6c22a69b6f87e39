"""The pivot form: a cap and a floor per data arm, checked as you type, confirmed before sending.

Validation is the trainer contract's validate_policy (trainwarden.supervisor.contract),
the very function the trainer and daemon apply, run against the arms the trainer
reported; so a form the TUI accepts is one the daemon will too (and its messages read
the same everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from trainwarden.supervisor.contract import validate_policy
from trainwarden.tui.sanitize import clean
from trainwarden.tui.screens.confirm import ConfirmScreen


@dataclass(frozen=True)
class PivotRequest:
    caps: dict[str, float]
    floors: dict[str, float]

    def describe(self) -> str:
        return ", ".join(f"{arm} {self.floors[arm]:g}-{self.caps[arm]:g}" for arm in self.caps)


def parse_number(text: str) -> float | str:
    """A float, or the text itself so the validator names the bad value."""
    try:
        return float(text.strip())
    except ValueError:
        return text


class PivotScreen(ModalScreen[PivotRequest | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, arms: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.arms = arms
        self.names = list(arms)

    def compose(self) -> ComposeResult:
        with Vertical(id="pivot", classes="dialog"):
            yield Static(
                Text("pivot: new caps and floors per data arm"),
                classes="dialog-title",
                markup=False,
            )
            with VerticalScroll(id="pivot-rows"):
                with Horizontal(classes="pivot-row pivot-head"):
                    yield Static(Text("arm"), classes="pivot-arm", markup=False)
                    yield Static(Text("p now"), classes="pivot-prob", markup=False)
                    yield Static(Text("cap"), classes="pivot-value", markup=False)
                    yield Static(Text("floor"), classes="pivot-value", markup=False)
                for index, name in enumerate(self.names):
                    arm = self.arms[name]
                    prob = arm.get("prob")
                    with Horizontal(classes="pivot-row"):
                        yield Static(Text(clean(name, 20)), classes="pivot-arm", markup=False)
                        yield Static(
                            Text(f"{prob:.2f}" if isinstance(prob, int | float) else "-"),
                            classes="pivot-prob",
                            markup=False,
                        )
                        yield Input(
                            _initial(arm.get("cap"), 1.0),
                            id=f"cap-{index}",
                            classes="pivot-value",
                            compact=True,
                        )
                        yield Input(
                            _initial(arm.get("floor"), 0.0),
                            id=f"floor-{index}",
                            classes="pivot-value",
                            compact=True,
                        )
            yield Static("", id="pivot-problems", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Pivot…", id="pivot-submit", variant="warning", compact=True)
                yield Button("Cancel (esc)", id="pivot-cancel", compact=True)

    def on_mount(self) -> None:
        self.validate_form()
        if self.names:
            self.query_one("#cap-0", Input).focus()

    def policy(self) -> dict[str, Any]:
        arms = {}
        for index, name in enumerate(self.names):
            arms[name] = {
                "cap": parse_number(self.query_one(f"#cap-{index}", Input).value),
                "floor": parse_number(self.query_one(f"#floor-{index}", Input).value),
            }
        return {"arms": arms}

    def validate_form(self) -> list[str]:
        problems = validate_policy(self.policy(), self.names)
        box = self.query_one("#pivot-problems", Static)
        if problems:
            box.update(Text("\n".join(clean(p, 300) for p in problems), style="bold"))
            box.set_class(True, "-invalid")
        else:
            box.update(Text("valid: floors sum to at most 1, caps to at least 1"))
            box.set_class(False, "-invalid")
        self.query_one("#pivot-submit", Button).disabled = bool(problems)
        return problems

    def on_input_changed(self, event: Input.Changed) -> None:
        self.validate_form()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "pivot-submit":
            self.submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def submit(self) -> None:
        if self.validate_form():
            return
        arms = self.policy()["arms"]
        request = PivotRequest(
            caps={name: float(arms[name]["cap"]) for name in self.names},
            floors={name: float(arms[name]["floor"]) for name in self.names},
        )
        body = Text(
            "The trainer saves, stops and restarts with a fresh bandit under these bounds; "
            "weights and optimizer state are kept. .state.json and .samples.json are archived.\n\n"
        )
        body.append(request.describe(), "bold")

        def answered(yes: bool | None) -> None:
            if yes:
                self.dismiss(request)

        self.app.push_screen(ConfirmScreen("Pivot the run?", body, yes_label="Pivot"), answered)


def _initial(value: Any, default: float) -> str:
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else default
    return f"{number:g}"
