"""Messages the socket side posts to the app.

Frames of the replaceable topics (the protocol's REPLACEABLE_TOPICS) supersede each
other: when the app falls behind, a backlog of telemetry collapses to the newest frame
instead of being drawn one by one.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from trainwarden.supervisor.protocol import REPLACEABLE_TOPICS


class Connected(Message):
    """A connection is up; `hello` is the daemon's hello reply."""

    def __init__(self, hello: dict[str, Any]) -> None:
        super().__init__()
        self.hello = hello


class Disconnected(Message):
    """The connection is gone (or never came up); the next try is `retry_in_s` away."""

    def __init__(self, reason: str, retry_in_s: float | None) -> None:
        super().__init__()
        self.reason = reason
        self.retry_in_s = retry_in_s


class StatusReceived(Message):
    def __init__(self, status: dict[str, Any]) -> None:
        super().__init__()
        self.status = status

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StatusReceived)


class TopicPushed(Message):
    def __init__(self, topic: str, data: Any) -> None:
        super().__init__()
        self.topic = topic
        self.data = data

    def can_replace(self, message: Message) -> bool:
        return (
            isinstance(message, TopicPushed)
            and message.topic == self.topic
            and self.topic in REPLACEABLE_TOPICS
        )


class HistoryReceived(Message):
    def __init__(self, history: dict[str, Any]) -> None:
        super().__init__()
        self.history = history

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, HistoryReceived)
