"""Waiting for a condition: one polling loop for tests and bench, and its asyncio twin for
Textual pilots (which must keep the app's loop running while they wait)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


class WaitTimeout(AssertionError):
    """What was awaited did not happen in time (an AssertionError, so pytest shows it as a
    failed expectation)."""


def poll(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> Any:
    """predicate()'s first truthy value, asked every `interval` s; None after `timeout` s.

    For callers that handle a miss themselves (bench reports it and goes on)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """predicate()'s first truthy value; WaitTimeout naming `what` after `timeout` s."""
    value = poll(predicate, timeout, interval)
    if not value:
        raise WaitTimeout(f"timed out after {timeout} s waiting for {what}")
    return value


async def wait_for_async(
    predicate: Callable[[], Any],
    timeout: float = 60.0,
    interval: float = 0.1,
    what: str = "condition",
    *,
    pause: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    explain: Callable[[], str] | None = None,
) -> Any:
    """wait_for on an event loop: `pause(interval)` between polls (a pilot's pause lets the
    app refresh), and `explain()` appended to the timeout message (the screen, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            context = f"; {explain()}" if explain is not None else ""
            raise WaitTimeout(f"timed out after {timeout} s waiting for {what}{context}")
        await pause(interval)
