"""The tail of training.log, followed while the screen is open.

There is no log command in the protocol: the file is read directly, which only works
when the run directory is on this machine. Over a forwarded socket the screen says so.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from trainwarden.tui.sanitize import clean_line

TAIL_BYTES = 256 * 1024
MAX_LINES = 5000
POLL_S = 1.0
NOT_LOCAL = (
    "log not available over a forwarded socket: the TUI reads RUN/training.log directly. "
    "On the training machine: tail -f RUN/training.log"
)


def read_from(path: Path, offset: int | None) -> tuple[list[str], int]:
    """Complete lines from `offset` (None: the last TAIL_BYTES) and the offset after them."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        skip_partial = False
        if offset is None or offset > size:  # first read, or the file was replaced
            offset = max(size - TAIL_BYTES, 0)
            skip_partial = offset > 0
        f.seek(offset)
        data = f.read(size - offset)
    start = 0
    if skip_partial:
        newline = data.find(b"\n")
        start = newline + 1 if newline >= 0 else len(data)
    end = data.rfind(b"\n")
    if end < start:
        return [], offset + start
    return data[start:end].decode("utf-8", errors="replace").split("\n"), offset + end + 1


class LogScreen(Screen[None]):
    BINDINGS = [Binding("escape,l,q", "close", "back")]

    def __init__(self, log_path: Path | None) -> None:
        super().__init__()
        self.log_path = log_path
        self.read_offset: int | None = None

    def compose(self) -> ComposeResult:
        title = str(self.log_path) if self.log_path else "training.log"
        yield Static(Text(f" {clean_line(title)}"), id="log-title", markup=False)
        if self.log_path is None:
            yield Static(Text(NOT_LOCAL), id="log-unavailable", markup=False)
        else:
            yield Log(id="log", max_lines=MAX_LINES, auto_scroll=True)
        yield Footer()

    def on_mount(self) -> None:
        if self.log_path is not None:
            self.run_worker(self.follow(), exclusive=True, group="log")

    async def follow(self) -> None:
        log = self.query_one(Log)
        assert self.log_path is not None
        reported: str | None = None
        while True:
            try:
                lines, self.read_offset = await asyncio.to_thread(
                    read_from, self.log_path, self.read_offset
                )
                problem = None
            except OSError as exc:
                lines, problem = [], f"cannot read {self.log_path}: {exc.strerror}"
            if problem is not None and problem != reported:
                lines = [problem]
            reported = problem
            if lines:
                log.write_lines([clean_line(line) for line in lines])
            await asyncio.sleep(POLL_S)

    def action_close(self) -> None:
        self.dismiss(None)
