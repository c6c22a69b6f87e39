"""Keys and what each panel shows."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

QUIT_LEAVES_RUN = "quit the TUI; the run goes on"
KEYS = (
    ("s", "save a checkpoint now (waits for it to be committed)"),
    ("x", "stop the trainer after it saves (asks first; the daemon stays)"),
    ("r", "start the trainer again (after a stop or a halt)"),
    ("p", "pivot: edit the data arms' caps and floors (asks first)"),
    ("P", "pin / unpin the selected checkpoint (asks before an unpin retention would act on)"),
    ("l", "the tail of training.log (local runs only)"),
    ("m", "samples: every data arm's recent samples in full (the run's audit trail)"),
    ("c", "loss chart range: whole run, last 1k steps, last 10k, last 10 % of the run"),
    ("y", "loss chart scale: linear or log"),
    ("o", "overlay another run's loss on the chart (its parent, a branch, a path), or none"),
    ("?", "this help"),
)
PALETTE_LINE = "ctrl+p  command palette: every action by name, with a line of help"
"""Apart from the one-letter keys, so their column stays narrow."""
PANELS = (
    (
        "header",
        "run, state (backoff shows its countdown), trainer pid and uptime, restarts, "
        "the resume audit of the last restart",
    ),
    (
        "telemetry",
        "step, loss and its moving average, throughput, MFU (now and run average), "
        "ETA, the newest and the next checkpoint; after a crash before any step, the "
        "trainer's last output line",
    ),
    (
        "loss",
        "the whole run, one point per dot column; the dashed line is ln(V), the loss of "
        "uniform guessing",
    ),
    (
        "  marks",
        "R restart, C crash, D divergence (div), P pivot, S spike (its first step, "
        "rolled back), » skip (where the skipped data starts), × validation (val); "
        "a narrow legend shows the letters alone",
    ),
    (
        "gpu",
        "utilisation and memory bars, sparklines of utilisation, power and temperature "
        "over the last minutes, SM clock; a marked warning when it throttles; "
        "'no NVIDIA GPU' on a CPU run",
    ),
    (
        "checkpoints",
        "verified (✓) checkpoints, newest first; 'next del' is the one retention "
        "deletes next; quarantined files are listed apart",
    ),
    (
        "bandit",
        "per data arm: probability, cap, floor, pulls, reward average, newest sample "
        "(wide terminals); ✗ marks a zombie arm whose data source is gone",
    ),
    (
        "events",
        "the daemon's journal, newest first; the newest incident (crash, divergence, hang, "
        "spike, GPU fault, halt) stays in the top row until a newer one; checkpoints and "
        "their retention deletes fold into one row (`trainwarden events` lists everything)",
    ),
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", "close")]

    def __init__(self, read_only: bool = False, quit_means: str = QUIT_LEAVES_RUN) -> None:
        super().__init__()
        self.read_only = read_only
        self.quit_means = quit_means

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold")
        keys.add_column()
        # q first: what quitting does to the run matters most, and shows even at 60x20.
        for key, what in (("q", self.quit_means), *KEYS):
            keys.add_row(key, what)
        panels = Table.grid(padding=(0, 2))
        panels.add_column(style="bold")
        panels.add_column()
        for name, what in PANELS:
            panels.add_row(name, what)
        dialog = VerticalScroll(id="help", classes="dialog")
        # In the border, so it shows however small the terminal and wherever the scroll is.
        dialog.border_subtitle = "escape closes"
        with dialog:
            yield Static(Text("trainwarden - keys"), classes="dialog-title", markup=False)
            yield Static(keys, markup=False)
            yield Static(Text(PALETTE_LINE), markup=False)
            if self.read_only:
                yield Static(
                    Text("read-only: s, x, r, p and P are refused (started with --read-only)"),
                    classes="dialog-warning",
                    markup=False,
                )
            yield Static(Text("panels"), classes="dialog-title", markup=False)
            yield Static(panels, markup=False)

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
