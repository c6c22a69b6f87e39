"""The control socket: a Unix stream server speaking newline-delimited JSON.

Each connection has an outbox drained by its own writer task, so the daemon only ever
appends to outboxes and never waits for a client. Telemetry-like topics keep only the
newest frame; replies, events and checkpoint lists are kept in order up to a bound,
past which the connection is dropped (a stuck subscriber costs the daemon nothing).

Each connection's lines are read ahead by a reader task, so a client that hangs up while
its request waits (a save --wait, a stop) is noticed at once and its request abandoned.
Acting commands run one at a time, except that stop and shutdown pre-empt a waiting save
(the policy answers the save "superseded").
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from trainwarden.supervisor import PROTOCOL_VERSION, __version__
from trainwarden.supervisor.contract import MAX_STEP
from trainwarden.supervisor.core.policy import ACTING, BadRequest, parse_command
from trainwarden.supervisor.errors import LockHeld, ProtocolError
from trainwarden.supervisor.protocol import (
    HISTORY_MAX_POINTS,
    MAX_LINE,
    REPLACEABLE_TOPICS,
    RUN_NAME_MAX,
    TOPICS,
    clip_text,
    connect_path,
    decode,
    encode,
)
from trainwarden.supervisor.serve.supervised import Supervised
from trainwarden.supervisor.socket_place import SocketPlace, check_socket_place, resolve_group
from trainwarden.supervisor.store.journal import tail_records

log = logging.getLogger("trainwarden.control")

MAX_QUEUED = 2000
"""Messages one connection's outbox holds at most (with OUTBOX_BYTES: a drop past it)."""
OUTBOX_BYTES = 64 << 10
"""Encoded bytes queued for one connection past which its next request waits (its client
is not reading); past OUTBOX_LIMIT, or MAX_QUEUED messages, the connection is dropped."""
OUTBOX_LIMIT = OUTBOX_BYTES + MAX_LINE + 1
"""Room for one reply of the longest line beyond OUTBOX_BYTES (replies stop there)."""
WRITE_BUFFER_HIGH = 16 << 10
"""The transport's high-water mark (asyncio's default is 64 KiB) and the socket's send
buffer: what a client that does not read can have in flight beyond its outbox."""
SLICE_S = 0.002
"""Request work the loop does between two looks at its other events (the log, the
trainer, timers): past it, the remaining requests wait for the next turn."""
TRIM_DELAY_S = 2.0
"""How long after the connections thinned out (to half their peak, at least TRIM_AFTER
closed) freed memory is handed back to the system: once per flood, not per client (a full
collection takes the loop for a while)."""
TRIM_AFTER = 8
READ_AHEAD = 64
"""Request lines read ahead of the one being answered, per connection."""
READ_AHEAD_BYTES = 64 << 10
"""Bytes of request lines read ahead, per connection (one longer line is read alone)."""
READ_CHUNK = 64 << 10
"""The StreamReader's buffer limit: a connection buffers about twice this unread; longer
lines are assembled in pieces up to MAX_LINE."""
ACCEPT_BATCH = 8
"""Connections taken in per pass of the loop (the rest wait in the listen queue)."""
LISTEN_BACKLOG = 512
"""Connections the kernel queues for us before it refuses newcomers (EAGAIN)."""
TOO_LARGE = b"\0too large"
"""What the reader task queues for a line over MAX_LINE (never a real line: no newline)."""
PRE_EMPT = {"stop": ("save",), "shutdown": ("save",)}
"""Acting commands that may start while another waits, and whose waits they end."""


async def _hang_up_after(
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


def admission(
    uid: int | None, owner: int, allowed: set[int], connected: list[int | None], max_clients: int
) -> tuple[str, str] | None:
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


def _bounded_line(message: dict[str, Any]) -> bytes:
    """`message` as its line, or, if that would exceed MAX_LINE, what is sent instead: an
    error for a reply, a `truncated` marker for a push."""
    line = encode(message)
    if len(line) <= MAX_LINE + 1:
        return line
    if "topic" in message:
        return encode({"topic": message["topic"], "data": {"truncated": True, "bytes": len(line)}})
    why = f"the reply would be {len(line)} bytes, over the {MAX_LINE}-byte line limit"
    return encode(_error(message.get("id"), "too_large", why))


class Turns:
    """Time slices for answering requests, so many busy clients cannot starve the loop:
    within one pass of the loop requests are answered for at most SLICE_S, then the rest
    wait until the loop has been round once (its I/O and timers handled).

    A request's work is done inside its turn (see ControlServer._answer), so the slice
    measures it. Requests past the slice queue in arrival order and are woken a slice's
    worth at a time (sized by what the last slice answered), one batch per pass: a crowd of
    waiting clients costs the loop nothing until its turn comes.
    """

    def __init__(self) -> None:
        self.slice_start: float | None = None
        self.answered = 0
        """Turns given in the current slice (what the next batch of waiters is sized by)."""
        self.exhausted = False
        """The current slice ran out (someone found no time left in it)."""
        self.waiting: deque[tuple[asyncio.Future[None], Callable[[], bool]]] = deque()
        self.firsts: deque[tuple[asyncio.Future[None], Callable[[], bool]]] = deque()
        """Connections' first requests: woken before the others."""
        self.woken: deque[tuple[asyncio.Future[None], Callable[[], bool]]] = deque()
        """Waiters woken for a slice that ended before they ran: first in the next."""
        self.scheduled = False

    async def turn(self, moot: Callable[[], bool] = lambda: False, first: bool = False) -> None:
        """Wait for a turn; `moot` says the turn is no longer wanted (its client left): it
        is then given at once, without counting against the slice or the batch. A `first`
        request (a connection's first) waits only behind other first ones: a client that
        asks once is never queued behind the pipelines of clients that ask thousands."""
        loop = asyncio.get_running_loop()
        woken = False
        while True:
            if woken and moot():
                return
            now = time.monotonic()
            if self.slice_start is None:
                # The slice lasts for the rest of this pass: the reset runs in the next.
                self.slice_start = now
                self.answered = 0
                self.exhausted = False
                self._schedule(loop)
            queued = bool(self.firsts or self.woken or (self.waiting and not first))
            if now - self.slice_start < SLICE_S:
                if woken or not queued:
                    self.answered += 1
                    return
            else:
                self.exhausted = True
            place = loop.create_future()
            (self.woken if woken else self.firsts if first else self.waiting).append((place, moot))
            self._schedule(loop)
            try:
                await place
            except asyncio.CancelledError:
                for queue in (self.firsts, self.waiting, self.woken):
                    with contextlib.suppress(ValueError):
                        queue.remove((place, moot))
                raise
            woken = True

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.scheduled:
            self.scheduled = True
            loop.call_soon(self._next_slice)

    def _next_slice(self) -> None:
        self.scheduled = False
        self.slice_start = None
        # As many as the last slice had time for; twice as many if it had time left.
        batch = max(1, self.answered if self.exhausted else 2 * self.answered)
        ready, self.woken = self.woken, deque()
        while batch and (ready or self.firsts or self.waiting):
            queue = ready if ready else self.firsts if self.firsts else self.waiting
            place, moot = queue.popleft()
            if not place.done():
                place.set_result(None)
                batch -= 0 if moot() else 1
        self.woken.extend(ready)
        if self.woken or self.firsts or self.waiting:
            # Wake the next batch in the next pass, whoever else asks for a turn.
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._next_slice)


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

    def put(self, message: dict[str, Any]) -> None:
        self.put_line(_bounded_line(message))

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


M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter: allocations from this size up get their own mapping."""
LARGE_ALLOCATION = 128 << 10


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 (glibc only)
    except (OSError, AttributeError):
        return None
    return libc


_libc = _glibc()


def map_large_allocations() -> None:
    """Have every allocation over LARGE_ALLOCATION mapped on its own, so it goes back to
    the system when freed. glibc raises its mmap threshold each time such a block is
    freed, after which request lines, replies and read buffers of a flood of clients
    land in the heap and keep RSS at the flood's peak long after the clients left."""
    if _libc is not None:
        _libc.mallopt(M_MMAP_THRESHOLD, LARGE_ALLOCATION)


def release_memory() -> None:
    """Free what closed connections held and give the heap's free pages back to the
    system. A connection's stream objects refer to each other, so only the cycle
    collector frees them (with their buffers), and it may not run for a long while."""
    gc.collect()
    if _libc is not None:
        _libc.malloc_trim(0)


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


async def read_lines(reader: asyncio.StreamReader, conn: Connection) -> None:
    """Queue the connection's request lines; at its end, None (and `gone` if it hung up)."""
    try:
        while True:
            try:
                line = await read_line(reader)
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


def peer_uid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class ControlServer:
    def __init__(self, daemon: Supervised) -> None:
        self.daemon = daemon
        self.path = daemon.cfg.socket_path
        self.owner = os.getuid()
        self.allowed = {self.owner, *daemon.cfg.control.allow_uids}
        self.connections: set[Connection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.acting = asyncio.Lock()
        self.acting_cmd: str | None = None
        self.pre_empting: str | None = None
        """A stop or shutdown that started while a save waited (see PRE_EMPT)."""
        self.answering: set[asyncio.Task[None]] = set()
        """Requests being answered, up to their reply's place in the outbox."""
        self.trim: asyncio.TimerHandle | None = None
        self.peak_connections = 0
        self.turns = Turns()
        """The most connections at once since memory was last handed back."""
        map_large_allocations()

    # -------------------------------------------------------------- socket setup

    async def start(self) -> None:
        cfg = self.daemon.cfg
        # Checked again at bind: the folder may have changed since the config was loaded.
        gid = resolve_group(cfg.path, cfg.control.group) if cfg.control.allow_uids else None
        place = check_socket_place(cfg.path, cfg.run_dir, cfg.control.socket, gid)
        self.path = place.path
        if place.state_dir is not None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._open_state_folders(place)
        if self.path.exists() or self.path.is_symlink():
            # check_socket_place found a socket of ours here: live (another daemon) or stale.
            if await self._answers():
                raise LockHeld(f"a live daemon already answers on {self.path}")
            self.path.unlink()
        address, fd = connect_path(self.path)
        socket_mode = 0o600 if gid is None else 0o660
        old_umask = os.umask(0o777 & ~socket_mode)
        try:
            self.server = await serve_unix(self._serve, address)
        finally:
            os.umask(old_umask)
            if fd is not None:
                os.close(fd)
        if gid is not None:
            os.chown(self.path, -1, gid)
        os.chmod(self.path, socket_mode)
        self.daemon.add_journal_listener(lambda record: self.publish("events", record))

    @staticmethod
    def _open_state_folders(place: SocketPlace) -> None:
        """The folders from .trainwarden/ down to the socket's: 0700, or searchable by the
        allowed users' group (0710: they reach the socket, and list nothing)."""
        assert place.state_dir is not None
        folder = place.path.parent
        for d in [folder, *folder.parents]:
            if place.gid is None:
                os.chmod(d, 0o700)
            else:
                os.chown(d, -1, place.gid)
                os.chmod(d, 0o710)
            if d == place.state_dir:
                break

    async def _answers(self) -> bool:
        address, fd = connect_path(self.path)
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(address), 1.0)
        except (OSError, TimeoutError):
            return False
        finally:
            if fd is not None:
                os.close(fd)
        writer.close()
        return True

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.trim is not None:
            self.trim.cancel()
        # Replies to the last commands (shutdown's own) must reach their clients first:
        # into their outboxes, then out.
        if self.answering:
            await asyncio.wait(self.answering, timeout=2.0)
        pumps = []
        for conn in list(self.connections):
            conn.finishing = True
            conn.outbox.wake.set()
            if conn.pump_task is not None:
                pumps.append(conn.pump_task)
        if pumps:
            await asyncio.wait(pumps, timeout=2.0)
        for conn in list(self.connections):
            conn.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _admission(self, uid: int | None) -> tuple[str, str] | None:
        # A closed connection still flushing or finishing its request holds no slot.
        connected = [conn.uid for conn in self.connections if not conn.closed]
        return admission(
            uid, self.owner, self.allowed, connected, self.daemon.cfg.control.max_clients
        )

    def _dropped(self, conn: Connection, reason: str, queued_bytes: int) -> None:
        self.connections.discard(conn)
        journal = self.daemon.journal
        if journal is not None:
            journal.append(
                "client_dropped", {"uid": conn.uid, "reason": reason, "queued_bytes": queued_bytes}
            )

    # -------------------------------------------------------------- broadcast

    def listening(self, topic: str) -> bool:
        """Whether any client is subscribed to `topic` (nobody: nothing to build)."""
        return any(topic in conn.topics for conn in self.connections)

    def publish(self, topic: str, data: Any) -> None:
        line: bytes | None = None
        for conn in self.connections:
            if topic in conn.topics:
                if line is None:  # encoded once, for every subscriber
                    line = _bounded_line({"topic": topic, "data": data})
                conn.outbox.push_topic(topic, line)

    # -------------------------------------------------------------- one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid = peer_uid(writer)
        except OSError:
            uid = None
        refusal = self._admission(uid)
        if refusal is not None and refusal[0] == "busy":
            # Slots of clients that hung up but are not yet noticed are free.
            for conn in [c for c in self.connections if c.closed or hung_up(c.writer)]:
                conn.gone.set()
                conn.close()
                self.connections.discard(conn)
            refusal = self._admission(uid)
        if refusal is not None:
            code, why = refusal
            with contextlib.suppress(Exception):
                await _hang_up_after(encode(_error(None, code, why)), reader, writer)
            writer.close()
            return
        sock = writer.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, WRITE_BUFFER_HIGH)
            writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        conn = Connection(writer, uid, self.daemon.cfg.control.slow_client_s, self._dropped)
        self.connections.add(conn)
        self.peak_connections = max(self.peak_connections, len(self.connections))
        loop = asyncio.get_running_loop()
        pump = conn.pump_task = loop.create_task(conn.pump())
        lines = loop.create_task(read_lines(reader, conn))
        answered = 0
        try:
            while not conn.closed:
                line = await conn.lines.get()
                if line is None:
                    break
                if line == TOO_LARGE:
                    conn.outbox.put(_error(None, "too_large", f"line exceeds {MAX_LINE} bytes"))
                    break
                request = self._parse(conn, line)
                if request is not None:
                    if not await self._take_turn(conn, request[1], answered == 0):
                        break
                    answered += 1
                    # Answered within the turn, so the slice counts the work; only a
                    # command that waits (an acting one, history) goes on in a task.
                    rest = self._answer(conn, *request)
                    if rest is not None:
                        answer = loop.create_task(rest)
                        self.answering.add(answer)
                        try:
                            await asyncio.shield(answer)
                        finally:
                            self.answering.discard(answer)
                # A client that sends without reading waits for its replies to go out
                # (its pump drops it after slow_client_s); one that reads still yields
                # between requests (and waits its turn), so pipelining cannot hold a
                # decision off.
                if conn.outbox.full:
                    await conn.outbox.room.wait()
                else:
                    await asyncio.sleep(0)
        finally:
            lines.cancel()
            self.connections.discard(conn)
            # Let the pump flush what is queued, then close.
            conn.finishing = True
            conn.outbox.wake.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(pump), 5.0)
            conn.close()
            thinned = len(self.connections) <= self.peak_connections // 2
            if self.trim is None and self.peak_connections >= TRIM_AFTER and thinned:
                self.trim = loop.call_later(TRIM_DELAY_S, self._release_memory)

    async def _take_turn(self, conn: Connection, cmd: str, first: bool) -> bool:
        """Wait for the turn to answer `cmd`; False if nobody would read the answer: the
        client asked and hung up (a crowd of them must not queue ahead of clients that
        wait for theirs). An acting command is still carried out, or abandoned, as asked."""
        if cmd in ACTING:
            await self.turns.turn(first=first)
            return True

        def left() -> bool:
            # Asked directly (one poll): its reader may not have seen the end yet.
            return conn.gone.is_set() or hung_up(conn.writer)

        if left():
            return False
        await self.turns.turn(left, first)
        return not left()

    def _release_memory(self) -> None:
        self.trim = None
        self.peak_connections = len(self.connections)
        release_memory()

    def _parse(self, conn: Connection, line: bytes) -> tuple[Any, str, dict[str, Any]] | None:
        """The request on `line` as (id, command, arguments), or None once an error about
        it is queued."""
        try:
            message = decode(line)
        except ProtocolError as exc:
            conn.outbox.put(_error(None, "bad_request", str(exc)))
            return None
        rid = message.get("id")
        if rid is not None and (not isinstance(rid, int | str) or isinstance(rid, bool)):
            conn.outbox.put(_error(None, "bad_request", "'id' must be an integer or a string"))
            return None
        cmd = message.get("cmd")
        if not isinstance(cmd, str):
            conn.outbox.put(_error(rid, "bad_request", "'cmd' must be a string naming a command"))
            return None
        return rid, cmd, {k: v for k, v in message.items() if k not in ("id", "cmd")}

    def _answer(
        self, conn: Connection, rid: Any, cmd: str, args: dict[str, Any]
    ) -> Coroutine[Any, Any, None] | None:
        """Answer a request now, or return what finishes answering it (a command that
        waits: an acting one, history)."""
        if cmd in ACTING:
            return self._reply(conn, rid, cmd, lambda: self._acting(conn, rid, cmd, args))
        handler = getattr(self, f"cmd_{cmd}", None)
        if handler is None:
            known = ", ".join(sorted([*READS, *ACTING]))
            conn.outbox.put(
                _error(rid, "unknown_command", f"unknown command '{cmd}'; known: {known}")
            )
            return None
        if asyncio.iscoroutinefunction(handler):  # answered off the loop (history, events)
            return self._reply(conn, rid, cmd, lambda: handler(conn, args))
        try:
            result = handler(conn, args)
        except Exception as exc:
            self._failed(conn, rid, cmd, exc)
            return None
        conn.outbox.put({"id": rid, "ok": True, "result": result})
        return None

    async def _reply(
        self, conn: Connection, rid: Any, cmd: str, answer: Callable[[], Awaitable[Any]]
    ) -> None:
        try:
            result = await answer()
        except Exception as exc:
            self._failed(conn, rid, cmd, exc)
            return
        conn.outbox.put({"id": rid, "ok": True, "result": result})

    @staticmethod
    def _failed(conn: Connection, rid: Any, cmd: str, exc: Exception) -> None:
        if not isinstance(exc, CommandError):  # never let one request take the daemon down
            log.exception("control request %r failed", cmd, exc_info=exc)
            exc = CommandError("internal", f"{type(exc).__name__}: {exc}")
        conn.outbox.put(_error(rid, exc.code, str(exc)))

    async def _acting(self, conn: Connection, rid: Any, cmd: str, args: dict[str, Any]) -> Any:
        command = parse_command(cmd, args)
        if isinstance(command, BadRequest):
            raise CommandError(command.code, command.message)
        if self.acting.locked() or self.pre_empting is not None:
            if self.pre_empting is None and self.acting_cmd in PRE_EMPT.get(cmd, ()):
                # A waiting save must not hold a stop off: the policy answers it.
                self.pre_empting = cmd
                try:
                    reply = await self._operate(conn, rid, command)
                finally:
                    self.pre_empting = None
            else:
                running = self.pre_empting or self.acting_cmd
                raise CommandError(
                    "busy",
                    f"another operator command ({running}) is in progress; try again when it finishes",
                )
        else:
            async with self.acting:
                self.acting_cmd = cmd
                try:
                    reply = await self._operate(conn, rid, command)
                finally:
                    self.acting_cmd = None
        if not reply.ok:
            raise CommandError(reply.code, reply.message)
        return reply.result

    async def _operate(self, conn: Connection, rid: Any, command: Any) -> Any:
        """The daemon's reply to `command`, its progress lines sent as they come; abandoned
        as soon as the client hangs up."""

        def progress(message: str) -> None:
            conn.outbox.put({"id": rid, "progress": message})

        loop = asyncio.get_running_loop()
        reply = loop.create_task(self.daemon.operator(command, conn.uid, progress))
        gone = loop.create_task(conn.gone.wait())
        try:
            await asyncio.wait({reply, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            reply.cancel()
            raise
        finally:
            gone.cancel()
        if not reply.done():
            reply.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reply
            raise CommandError("abandoned", "the client hung up before the reply")
        return reply.result()

    # -------------------------------------------------------------- read commands

    def cmd_hello(self, conn: Connection, args: dict[str, Any]) -> Any:
        return {
            "protocol": PROTOCOL_VERSION,
            "version": __version__,
            "run": clip_text(self.daemon.cfg.run.name, RUN_NAME_MAX),
            "run_dir": str(self.daemon.cfg.run_dir),
            "log": str(self.daemon.cfg.log_path),
            "pid": os.getpid(),
        }

    def cmd_status(self, conn: Connection, args: dict[str, Any]) -> Any:
        view = self.daemon.status_view()
        if isinstance(view.get("run"), str):
            view["run"] = clip_text(view["run"], RUN_NAME_MAX)
        return view

    def cmd_checkpoints(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self.daemon.checkpoints_view()

    async def cmd_events(self, conn: Connection, args: dict[str, Any]) -> Any:
        n = _int_arg(args, "n", 50, 1, 100_000)
        # Read off the loop (up to 100,000 records), then joined on it with what a full
        # disk holds in memory.
        written = await asyncio.to_thread(tail_records, self.daemon.files.journal, n)
        journal = self.daemon.journal
        return fit_events(written if journal is None else journal.with_held(written, n))

    async def cmd_history(self, conn: Connection, args: dict[str, Any]) -> Any:
        start = _int_arg(args, "start", None, 0, MAX_STEP)
        end = _int_arg(args, "end", None, 0, MAX_STEP)
        points = _int_arg(args, "points", 200, 1, 100_000)
        # More buckets than fit one line are not sent: the reply says how many it holds.
        return await self.daemon.history_query(start, end, min(points, HISTORY_MAX_POINTS))

    def cmd_subscribe(self, conn: Connection, args: dict[str, Any]) -> Any:
        topics = args.get("topics", list(TOPICS))
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise CommandError("bad_argument", "'topics' must be a list of topic names")
        unknown = [t for t in topics if t not in TOPICS]
        if unknown:
            raise CommandError(
                "bad_argument", f"unknown topic(s) {', '.join(unknown)}; known: {', '.join(TOPICS)}"
            )
        conn.topics.update(topics)
        views = {"checkpoints": self.daemon.checkpoints_view, "state": self.daemon.state_view}
        return {
            "snapshot": {t: views[t]() if t in views else self.daemon.snapshot(t) for t in topics}
        }


READS = ("hello", "status", "checkpoints", "events", "history", "subscribe")


EVENTS_MAX_BYTES = MAX_LINE // 2
"""Encoded journal records one `events` reply holds at most (the newest; then truncated)."""


def fit_events(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The newest records that fit EVENTS_MAX_BYTES, oldest first; `truncated` if any did not."""
    kept: list[dict[str, Any]] = []
    size = 0
    for record in reversed(records):
        size += len(encode(record))
        if size > EVENTS_MAX_BYTES:
            return {"events": kept[::-1], "truncated": True}
        kept.append(record)
    return {"events": kept[::-1]}


class CommandError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _error(rid: Any, code: str, message: str) -> dict[str, Any]:
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}}


def _int_arg(
    args: dict[str, Any], name: str, default: int | None, low: int, high: int | None
) -> Any:
    value = args.get(name, default)
    if value is None:
        return None
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise CommandError("bad_argument", f"'{name}' must be an integer {bound}, got {value!r}")
    return value
