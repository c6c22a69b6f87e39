"""Helpers for pilot tests against a real daemon: wait on the app without blocking its loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from tests.tui.screen_text import screen_text


async def until(
    pilot: Pilot[Any], predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition"
) -> Any:
    """Poll `predicate` while the app keeps running; its value, or AssertionError with the screen."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}; screen:\n{screen_text(pilot.app)}"
            )
        await pilot.pause(0.1)


async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """A blocking helper (a daemon's start, a status request) off the app's loop."""
    return await asyncio.to_thread(function, *args)
