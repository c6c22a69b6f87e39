"""The data-mixing bandit: one row per arm, zombies flagged, the newest sample of each arm."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Click
from textual.widgets import DataTable

from trainwarden.tui import fmt
from trainwarden.tui.model import RunModel
from trainwarden.tui.sanitize import clean
from trainwarden.tui.widgets.table import Cell, sync_rows

COLUMNS = ("arm", "p", "cap", "floor", "pulls", "ema", "sample")
WIDTHS = {"p": 4, "cap": 4, "floor": 5, "ema": 4}
SAMPLE_CHARS = 96


def _fraction(value: Any) -> str:
    return f"{value:.2f}" if fmt.finite(value) else fmt.UNKNOWN


class BanditPanel(Vertical):
    COMPONENT_CLASSES = {"bandit--zombie", "bandit--muted", "bandit--bounded"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title = "bandit"

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="bandit-table", cursor_type="none", show_cursor=False)
        table.can_focus = False
        for column in COLUMNS:
            table.add_column(column, key=column, width=WIDTHS.get(column))
        yield table

    async def on_click(self, event: Click) -> None:
        await self.app.run_action("samples")

    def show(self, model: RunModel) -> None:
        bandit = model.bandit or {}
        arms = bandit.get("arms")
        if not isinstance(arms, dict):
            arms = {}
        zombies = [z for z in bandit.get("zombies") or [] if isinstance(z, str)]
        samples = model.latest_samples()
        zombie_style = str(self.get_component_rich_style("bandit--zombie"))
        muted = str(self.get_component_rich_style("bandit--muted"))
        bounded = str(self.get_component_rich_style("bandit--bounded"))
        rows = []
        for name, arm in arms.items():
            arm = arm if isinstance(arm, dict) else {}
            prob, cap, floor = arm.get("prob"), arm.get("cap"), arm.get("floor")
            at_bound = False
            if fmt.finite(prob):
                at_cap = fmt.finite(cap) and cap < 1 and prob >= cap - 1e-9
                at_floor = fmt.finite(floor) and floor > 0 and prob <= floor + 1e-9
                at_bound = at_cap or at_floor
            rows.append(
                (
                    f"arm:{name}",
                    [
                        Cell(clean(name, 24)),
                        Cell(_fraction(prob), bounded if at_bound else ""),
                        Cell(_fraction(cap), muted),
                        Cell(_fraction(floor), muted),
                        Cell(fmt.integer(arm.get("pulls"))),
                        Cell(_fraction(arm.get("ema_reward"))),
                        self._sample(samples.get(str(name)), muted),
                    ],
                )
            )
        for name in zombies:
            rows.append(
                (
                    f"zombie:{name}",
                    [
                        Cell(f"✗ {clean(name, 22)}", zombie_style),
                        *(Cell("-", muted) for _ in range(5)),
                        Cell("zombie: its data source is gone; never pulled again", zombie_style),
                    ],
                )
            )
        sync_rows(self.query_one(DataTable), rows, COLUMNS)
        phase = bandit.get("phase")
        if not isinstance(phase, dict):
            phase = {}
        subtitle = []
        if isinstance(bandit.get("step"), int):
            subtitle.append(f"step {bandit['step']:,}")
        if isinstance(phase.get("pivots"), int) and phase["pivots"]:
            subtitle.append(f"pivots {phase['pivots']}")
        if zombies:
            subtitle.append("zombie: " + ", ".join(clean(z, 20) for z in zombies))
        if not rows:
            subtitle.append("the trainer reports no bandit state")
        subtitle.append("m samples")
        # A Text, not a str: a str border title would be parsed as markup.
        self.border_subtitle = Text("  ".join(subtitle))

    @staticmethod
    def _sample(sample: dict[str, Any] | None, muted: str) -> Cell:
        if sample is None:
            return Cell("-", muted)
        step = sample.get("step")
        text = clean(sample.get("text", ""), SAMPLE_CHARS)
        cell = Cell(f"@{step} " if isinstance(step, int) else "", muted)
        cell.append(text)
        return cell
