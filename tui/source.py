"""The daemon as a data source: one subscribed connection, kept up with backoff.

Everything here runs on the app's asyncio loop (the protocol client is asyncio), so no
socket call ever blocks the UI. Results reach the app as messages. Operator commands go
over a short-lived connection of their own: the daemon answers one request at a time
per connection, and a `save --wait` or a `stop` would otherwise hold up the periodic
history refresh for as long as the trainer takes to save.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from textual.message import Message

from trainwarden.supervisor.errors import CommandRefused, DaemonNotRunning, ProtocolError
from trainwarden.supervisor.protocol import TOPICS, AsyncClient, HistoryArgs
from trainwarden.tui.messages import (
    Connected,
    Disconnected,
    HistoryReceived,
    StatusReceived,
    TopicPushed,
)

log = logging.getLogger("trainwarden.tui")

CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 15.0
POLL_INTERVAL_S = 5.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 5.0

Post = Callable[[Message], object]
HistoryWanted = Callable[[], HistoryArgs]
"""The history request the chart needs now: its points, and the step range it shows."""


class DataSource(Protocol):
    """What the app needs from whatever feeds it (the daemon, or a test's fixed data)."""

    log_path: Path | None

    async def run(self, post: Post, history_args: HistoryWanted) -> None:
        """Post messages until cancelled; never raises."""

    def want_history(self) -> None:
        """Fetch the history again soon (the chart changed size, mode, or fell behind)."""

    async def request(
        self, cmd: str, timeout: float | None = REQUEST_TIMEOUT_S, **args: Any
    ) -> Any:
        """One operator command; its result, or CommandRefused/DaemonNotRunning/ProtocolError."""


def describe_failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "the daemon did not answer in time"
    if isinstance(exc, CommandRefused):
        return f"{exc.code}: {exc}"
    if isinstance(exc, DaemonNotRunning | ProtocolError):
        return str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return f"{type(exc).__name__}: {exc}"


def local_log_path(socket_path: Path, hello: dict[str, Any]) -> Path | None:
    """The run log the daemon names, when the socket is the run's own (so the run is on
    this machine).

    A socket forwarded over SSH lives elsewhere; then the run directory the daemon names
    is on another machine, whatever happens to exist at that path here.
    """
    run_dir, log = hello.get("run_dir"), hello.get("log")
    if not isinstance(run_dir, str) or not isinstance(log, str):
        return None
    try:
        root = Path(run_dir).resolve()
        if not socket_path.resolve().is_relative_to(root):
            return None
    except (OSError, RuntimeError):
        return None
    return Path(log) if root.is_dir() else None


class DaemonSource:
    def __init__(
        self, socket_path: Path, log_path: Path | None = None, daemon_uid: int | None = None
    ) -> None:
        self.socket_path = socket_path
        self.daemon_uid = daemon_uid
        self.log_path = log_path
        self._log_path_given = log_path is not None
        self._history_wanted = asyncio.Event()

    def want_history(self) -> None:
        self._history_wanted.set()

    async def _open(self) -> AsyncClient:
        client = AsyncClient(self.socket_path, self.daemon_uid)
        try:
            await asyncio.wait_for(client.connect(), CONNECT_TIMEOUT_S)
        except BaseException:
            await client.close()
            raise
        return client

    async def request(
        self, cmd: str, timeout: float | None = REQUEST_TIMEOUT_S, **args: Any
    ) -> Any:
        client = await self._open()
        try:
            return await client.request(cmd, timeout=timeout, **args)
        finally:
            await client.close()

    async def run(self, post: Post, history_args: HistoryWanted) -> None:
        delay = BACKOFF_INITIAL_S
        while True:
            try:
                await self._session(post, history_args)
                reason = "the daemon closed the connection"
                delay = BACKOFF_INITIAL_S
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a dead daemon is a state to show, not a crash
                reason = describe_failure(exc)
            post(Disconnected(reason, delay))
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _session(self, post: Post, history_args: HistoryWanted) -> None:
        client = await self._open()
        poller: asyncio.Task[None] | None = None
        try:
            # Pipelined: over an SSH-forwarded socket each round trip costs real time.
            hello, subscribed, status, history = await asyncio.gather(
                client.request("hello", timeout=REQUEST_TIMEOUT_S),
                client.request("subscribe", topics=list(TOPICS), timeout=REQUEST_TIMEOUT_S),
                client.request("status", timeout=REQUEST_TIMEOUT_S),
                client.request("history", **history_args(), timeout=REQUEST_TIMEOUT_S),
            )
            if not self._log_path_given:
                self.log_path = local_log_path(self.socket_path, hello or {})
            post(Connected(hello or {}))
            snapshot = (subscribed or {}).get("snapshot") or {}
            for topic, data in snapshot.items():
                if data is not None:
                    post(TopicPushed(topic, data))
            post(StatusReceived(status or {}))
            post(HistoryReceived(history or {}))
            poller = asyncio.create_task(self._poll(client, post, history_args))
            async for message in client.messages():
                post(TopicPushed(str(message.get("topic")), message.get("data")))
        finally:
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(BaseException):
                    await poller
            await client.close()

    async def _poll(self, client: AsyncClient, post: Post, history_args: HistoryWanted) -> None:
        """History every few seconds or when the chart wants it, status every few seconds;
        never overlapping."""
        loop = asyncio.get_running_loop()
        status_due = loop.time() + POLL_INTERVAL_S
        while True:
            # However often the chart asks, the status still comes on its own cadence.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._history_wanted.wait(), max(status_due - loop.time(), 0.0)
                )
            self._history_wanted.clear()
            try:
                if loop.time() >= status_due:
                    status_due = loop.time() + POLL_INTERVAL_S
                    post(StatusReceived(await client.request("status", timeout=REQUEST_TIMEOUT_S)))
                history = await client.request(
                    "history", **history_args(), timeout=REQUEST_TIMEOUT_S
                )
                post(HistoryReceived(history))
            except (CommandRefused, TimeoutError) as exc:
                # A refused or slow refresh is retried next round; a closed connection
                # (ProtocolError) ends this task along with the session.
                log.warning("refresh failed: %s", describe_failure(exc))
