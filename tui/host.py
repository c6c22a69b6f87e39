"""What the app's helpers (`commands`, `chart_feed`) use of the app, so they need not import it."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from textual.screen import Screen

from trainwarden.tui.model import RunModel
from trainwarden.tui.screens.main import MainScreen
from trainwarden.tui.source import DataSource


class AppHost(Protocol):
    model: RunModel
    source: DataSource
    read_only: bool

    @property
    def main_screen(self) -> MainScreen: ...

    def tell(
        self, message: str, severity: str = "information", timeout: float | None = None
    ) -> None: ...

    def tell_failure(self, what: str, exc: BaseException) -> None: ...

    def request_render(self) -> None: ...

    def run_worker(
        self, work: Coroutine[Any, Any, None], *, group: str = ..., exclusive: bool = ...
    ) -> Any: ...

    def push_screen(
        self, screen: Screen[Any], callback: Callable[[Any], None] | None = ...
    ) -> Any: ...
