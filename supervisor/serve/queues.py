"""What one control connection holds: its outbox, the encoded lines it has yet to be sent
(replies, progress and events in order up to a bound, past which the connection is
dropped; of each replaceable topic only the newest frame), and its inbox, the request lines
read ahead of the one being answered. A line longer than the protocol allows is never
queued: a reply becomes the `too_large` error, a push its `truncated` marker."""

from __future__ import annotations

import asyncio
from collections import deque

from trainwarden.supervisor.protocol import (
    MAX_LINE,
    REPLACEABLE_TOPICS,
    ErrorCode,
    ErrorReply,
    ProgressLine,
    Push,
    Reply,
    RequestId,
    TooLarge,
    encode,
)

MAX_QUEUED = 2000
"""Messages one connection's outbox holds at most (with OUTBOX_BYTES: a drop past it)."""
OUTBOX_BYTES = 64 << 10
"""Encoded bytes queued for one connection past which its next request waits (its client
is not reading); past OUTBOX_LIMIT, or MAX_QUEUED messages, the connection is dropped."""
OUTBOX_LIMIT = OUTBOX_BYTES + MAX_LINE + 1
"""Room for one reply of the longest line beyond OUTBOX_BYTES (replies stop there)."""
READ_AHEAD = 64
"""Request lines read ahead of the one being answered, per connection."""
READ_AHEAD_BYTES = 64 << 10
"""Bytes of request lines read ahead, per connection (one longer line is read alone)."""


def error_reply(rid: RequestId, code: ErrorCode, message: str) -> ErrorReply:
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}}


def bounded_line(message: Reply | ProgressLine) -> bytes:
    """`message` as its line, or, if that would exceed MAX_LINE, the error sent instead."""
    line = encode(message)
    if len(line) <= MAX_LINE + 1:
        return line
    why = f"the reply would be {len(line)} bytes, over the {MAX_LINE}-byte line limit"
    return encode(error_reply(message["id"], "too_large", why))


def bounded_push(push: Push) -> bytes:
    """`push` as its line, or, if that would exceed MAX_LINE, the push with a `truncated`
    marker in place of its data."""
    line = encode(push)
    if len(line) <= MAX_LINE + 1:
        return line
    left_out: TooLarge = {"truncated": True, "bytes": len(line)}
    cut: Push = {"topic": push["topic"], "data": left_out}
    return encode(cut)


class Outbox:
    """What one connection has yet to be sent, as encoded lines."""

    def __init__(self) -> None:
        self.latest: dict[str, bytes] = {}
        """The newest line of each replaceable topic."""
        self.ordered: deque[bytes] = deque()
        self.bytes = 0
        """Encoded bytes in `ordered`."""
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        """Set while below OUTBOX_BYTES (or closed): the next request may be answered."""
        self.room.set()
        self.overflowed = False

    @property
    def full(self) -> bool:
        return self.bytes >= OUTBOX_BYTES or len(self.ordered) >= MAX_QUEUED

    def push_topic(self, topic: str, line: bytes) -> None:
        """Queue a push already encoded (once for every subscriber: see publish)."""
        if topic in REPLACEABLE_TOPICS:
            self.latest[topic] = line
            self.wake.set()
        else:
            self.put_line(line)

    def put(self, message: Reply | ProgressLine) -> None:
        self.put_line(bounded_line(message))

    def put_line(self, line: bytes) -> None:
        if self.overflowed:
            return
        if self.bytes + len(line) > OUTBOX_LIMIT or len(self.ordered) >= MAX_QUEUED:
            self.overflowed = True
        else:
            self.ordered.append(line)
            self.bytes += len(line)
            if self.full:
                self.room.clear()
        self.wake.set()

    def pop(self) -> bytes | None:
        """The next line to send (ordered ones first, then the newest of each topic)."""
        if self.ordered:
            line = self.ordered.popleft()
            self.bytes -= len(line)
            if not self.full:
                self.room.set()
            return line
        if self.latest:
            return self.latest.pop(next(iter(self.latest)))
        self.wake.clear()
        return None

    @property
    def empty(self) -> bool:
        return not self.ordered and not self.latest


class Inbox:
    """Request lines read ahead, bounded in lines and bytes; None ends them."""

    def __init__(self) -> None:
        self.lines: deque[bytes | None] = deque()
        self.bytes = 0
        self.ready = asyncio.Event()
        self.room = asyncio.Event()

    async def put(self, line: bytes) -> None:
        while self.lines and (
            len(self.lines) >= READ_AHEAD or self.bytes + len(line) > READ_AHEAD_BYTES
        ):
            self.room.clear()
            await self.room.wait()
        self.lines.append(line)
        self.bytes += len(line)
        self.ready.set()

    def end(self) -> None:
        self.lines.append(None)  # after the lines before it, however many wait
        self.ready.set()

    async def get(self) -> bytes | None:
        while not self.lines:
            self.ready.clear()
            await self.ready.wait()
        line = self.lines.popleft()
        if line is not None:
            self.bytes -= len(line)
        self.room.set()
        return line
