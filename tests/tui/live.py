"""Helpers for pilot tests against a real daemon: wait on the app without blocking its loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from tests.support import wait_for_async
from tests.tui.screen_text import screen_text


async def until(
    pilot: Pilot[Any], predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition"
) -> Any:
    """wait_for_async with the pilot's pause (the app keeps running) and its screen in the
    timeout message."""
    return await wait_for_async(
        predicate,
        timeout,
        0.1,
        what,
        pause=pilot.pause,
        explain=lambda: f"screen:\n{screen_text(pilot.app)}",
    )


async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """A blocking helper (a daemon's start, a status request) off the app's loop."""
    return await asyncio.to_thread(function, *args)
