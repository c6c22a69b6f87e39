"""One control connection: what it may queue, how its lines are read, who it comes from.

Each connection has an outbox (serve.queues) drained by its own writer task, so the
daemon only ever appends to outboxes and never waits for a client. Telemetry-like topics keep only the
newest frame; replies, events and checkpoint lists are kept in order up to a bound,
past which the connection is dropped (a stuck subscriber costs the daemon nothing).

Each connection's lines are read ahead by a reader task, so a client that hangs up while
its request waits (a save --wait, a stop) is noticed at once and its request abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from trainwarden.supervisor.errors import ProtocolError
from trainwarden.supervisor.protocol import (
    MAX_LINE,
    ErrorCode,
    ErrorReply,
    RequestId,
)
from trainwarden.supervisor.serve.queues import Inbox, Outbox, error_reply
from trainwarden.supervisor.wire import decode, peer_uid

log = logging.getLogger("trainwarden.control")

WRITE_BUFFER_HIGH = 16 << 10
"""The transport's high-water mark (asyncio's default is 64 KiB) and the socket's send
buffer: what a client that does not read can have in flight beyond its outbox."""
READ_CHUNK = 64 << 10
"""The StreamReader's buffer limit: a connection buffers about twice this unread; longer
lines are assembled in pieces up to MAX_LINE."""
ACCEPT_BATCH = 8
"""Connections taken in per pass of the loop (the rest wait in the listen queue)."""
LISTEN_BACKLOG = 512
"""Connections the kernel queues for us before it refuses newcomers (EAGAIN)."""
TOO_LARGE = b"\0too large"
"""What the reader task queues for a line over MAX_LINE (never a real line: no newline)."""
FIRST_REQUEST_S = 30.0
"""A connection's first request must have come whole this soon after it connected."""
LINE_S = 30.0
"""A later request must come whole this soon after its first byte (a connection may stay
silent between requests for as long as it likes: a TUI does)."""


async def hang_up_after(
    reply: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Send a refused client its one reply and hang up without resetting it.

    A Unix socket closed with unread data resets its peer, whose reads then fail instead
    of ending, and it may lose the reply. Reading "briefly" first does not settle that: a
    client (or a loaded loop) can be slower than any deadline. So shut our reading side,
    after which nothing more can be queued to us, read to its end what already was (at
    most a socket buffer, and the end comes at once), and only then close.
    """
    writer.write(reply)
    await writer.drain()
    writer.write_eof()
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.shutdown(socket.SHUT_RD)
    while await asyncio.wait_for(reader.read(1 << 16), 5.0):
        pass


def evictable(connections: Iterable[Connection], owner: int) -> Connection | None:
    """At the limit, the owner's connection a newcomer of the owner's takes the place of:
    the longest idle of its own with no request being answered, preferring one that has
    subscribed to nothing (a TUI stays attached while a silent socket is there to go)."""
    idle = [c for c in connections if c.uid == owner and not c.closed and not c.working]
    if not idle:
        return None
    return min(idle, key=lambda c: (bool(c.topics), c.idle_since))


def admission(
    uid: int | None, owner: int, allowed: set[int], connected: list[int | None], max_clients: int
) -> tuple[ErrorCode, str] | None:
    """Why a newcomer from `uid` is refused (code, message), or None to let it in.

    The owner's uid and the other allowed uids each have `max_clients` connections: the
    owner's own count apart, so other users can never lock the daemon's user out.
    """
    if uid not in allowed:
        return "forbidden", f"uid {uid} may not control this run; add it to [control] allow_uids"
    same_side = sum(1 for other in connected if (other == owner) == (uid == owner))
    if same_side >= max_clients:
        whose = "the daemon's user" if uid == owner else "other users"
        return "busy", (
            f"too many connections ({same_side} of {whose}, [control] max_clients = "
            f"{max_clients}); try again later"
        )
    return None


class Connection:
    def __init__(
        self,
        writer: asyncio.StreamWriter,
        uid: int | None,
        slow_client_s: float = 10.0,
        on_drop: Callable[[Connection, str, int], None] | None = None,
    ) -> None:
        self.writer = writer
        self.uid = uid
        self.slow_client_s = slow_client_s
        self.on_drop = on_drop
        self.outbox = Outbox()
        self.topics: set[str] = set()
        self.closed = False
        self.finishing = False
        """No more requests (EOF or daemon exit): flush what is queued, then close."""
        self.pump_task: asyncio.Task[None] | None = None
        self.lines = Inbox()
        """Request lines read ahead; None: no more (EOF or a read error)."""
        self.gone = asyncio.Event()
        """The client hung up (or the connection closed): nobody reads a reply any more."""
        self.working = False
        """A request of it is being answered."""
        self.idle_since = time.monotonic()
        """When it connected or its last request was answered."""

    def unsent_bytes(self) -> int:
        transport = self.writer.transport
        return self.outbox.bytes + (transport.get_write_buffer_size() if transport else 0)

    async def pump(self) -> None:
        """Send the outbox until the connection closes; drops the connection when its
        outbox overflows or its client leaves what is sent unread for slow_client_s."""
        transport = self.writer.transport
        try:
            while not self.closed:
                await self.outbox.wake.wait()
                while not self.closed and (line := self.outbox.pop()) is not None:
                    if self.outbox.overflowed:
                        self.drop("overflow")
                        return
                    self.writer.write(line)
                    # Only a full transport buffer makes drain wait: the client is not
                    # reading, and may not keep us waiting past slow_client_s.
                    if transport.get_write_buffer_size() > 0:
                        try:
                            async with asyncio.timeout(self.slow_client_s):
                                await self.writer.drain()
                        except TimeoutError:
                            self.drop("slow")
                            return
                if self.outbox.overflowed:
                    self.drop("overflow")
                    return
                if self.finishing and self.outbox.empty:
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            self.close()

    def drop(self, reason: str) -> None:
        queued = self.unsent_bytes()
        log.warning(
            "dropping a client that does not keep up (uid %s, %s, %d bytes unsent)",
            self.uid,
            reason,
            queued,
        )
        if self.on_drop is not None:
            self.on_drop(self, reason, queued)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.gone.set()
            self.outbox.wake.set()
            self.outbox.room.set()
            self.outbox.ordered.clear()
            self.outbox.latest.clear()
            self.outbox.bytes = 0
            with contextlib.suppress(Exception):
                self.writer.close()


def hung_up(writer: asyncio.StreamWriter) -> bool:
    """The peer closed its end entirely (POLLHUP), not merely its writing half: a client
    that half-closes after its request still reads the reply."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    return any(mask & (select.POLLHUP | select.POLLERR) for _fd, mask in poller.poll(0))


async def read_line(reader: asyncio.StreamReader) -> bytes:
    """The next line (b"" at EOF, a last line without newline as it is; TOO_LARGE for one
    over MAX_LINE, consumed whole), read in pieces of the reader's small limit."""
    pieces: list[bytes] = []
    size = 0
    while True:
        try:
            piece = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            piece = exc.partial
            if size + len(piece) > MAX_LINE:
                return TOO_LARGE
            return b"".join([*pieces, piece])
        except asyncio.LimitOverrunError as exc:
            piece = await reader.read(exc.consumed or READ_CHUNK)
            size += len(piece)
            if size <= MAX_LINE:
                pieces.append(piece)
            continue
        if size + len(piece) > MAX_LINE + 1:
            return TOO_LARGE
        return b"".join([*pieces, piece])


async def read_later_line(reader: asyncio.StreamReader) -> bytes:
    """A request line after the first: no deadline for its first byte, LINE_S for the rest
    (TimeoutError past it)."""
    try:
        head = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        return b""
    if head == b"\n":
        return head
    rest = await asyncio.wait_for(read_line(reader), LINE_S)
    if rest == TOO_LARGE or len(rest) >= MAX_LINE + 1:
        return TOO_LARGE
    return head + rest


async def read_lines(reader: asyncio.StreamReader, conn: Connection) -> None:
    """Queue the connection's request lines; at its end, None (and `gone` if it hung up).
    A connection whose first request has not come whole within FIRST_REQUEST_S, or a later
    one within LINE_S of its first byte, is ended: silent or trickling connections hold no
    slot for long."""
    first = True
    try:
        while True:
            try:
                if first:
                    line = await asyncio.wait_for(read_line(reader), FIRST_REQUEST_S)
                    first = False
                else:
                    line = await read_later_line(reader)
            except TimeoutError:
                conn.drop("no request" if first else "partial request")
                return
            except (ConnectionError, OSError):
                conn.gone.set()
                return
            if line == TOO_LARGE:
                await conn.lines.put(TOO_LARGE)
                return
            if not line:
                if hung_up(conn.writer):
                    conn.gone.set()
                return
            if line.strip():
                await conn.lines.put(line)
    finally:
        conn.lines.end()


async def serve_unix(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], address: str
) -> asyncio.AbstractServer:
    """A Unix stream server at `address` that takes in at most ACCEPT_BATCH connections per
    pass of the loop, while the kernel queues up to LISTEN_BACKLOG."""
    # asyncio accepts up to `backlog` connections per wake-up, all in the same pass (and
    # listens with it): a small batch there, then the kernel's queue made long again.
    server = await asyncio.start_unix_server(serve, address, limit=READ_CHUNK, backlog=ACCEPT_BATCH)
    for listening in server.sockets:
        with socket.fromfd(listening.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.listen(LISTEN_BACKLOG)
    return server


def writer_peer_uid(writer: asyncio.StreamWriter) -> int | None:
    """The connected client's uid (None when the transport has no socket)."""
    sock = writer.get_extra_info("socket")
    return None if sock is None else peer_uid(sock)


def parse_request(line: bytes) -> tuple[RequestId, str, dict[str, Any]] | ErrorReply:
    """A request line as (id, command, arguments), or the error reply that refuses it.
    Any bytes at all give one or the other (tests/supervisor/test_request_parsing.py)."""
    try:
        message = decode(line)
    except ProtocolError as exc:
        return error_reply(None, "bad_request", str(exc))
    rid = message.get("id")
    if rid is not None and (not isinstance(rid, int | str) or isinstance(rid, bool)):
        return error_reply(None, "bad_request", "'id' must be an integer or a string")
    cmd = message.get("cmd")
    if not isinstance(cmd, str):
        return error_reply(rid, "bad_request", "'cmd' must be a string naming a command")
    return rid, cmd, {k: v for k, v in message.items() if k not in ("id", "cmd")}
