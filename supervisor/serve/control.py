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
import logging
import os
import select
import socket
import struct
from collections import deque
from typing import Any

from trainwarden.supervisor import PROTOCOL_VERSION, __version__
from trainwarden.supervisor.contract import MAX_STEP
from trainwarden.supervisor.core.policy import ACTING, BadRequest, parse_command
from trainwarden.supervisor.errors import LockHeld, ProtocolError
from trainwarden.supervisor.protocol import (
    MAX_LINE,
    REPLACEABLE_TOPICS,
    TOPICS,
    connect_path,
    decode,
    encode,
)
from trainwarden.supervisor.serve.supervised import Supervised
from trainwarden.supervisor.socket_place import SocketPlace, check_socket_place, resolve_group
from trainwarden.supervisor.store.journal import tail_records

log = logging.getLogger("trainwarden.control")

MAX_QUEUED = 2000
MAX_CONNECTIONS = 256
READ_AHEAD = 64
"""Request lines read ahead of the one being answered, per connection."""
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


class Outbox:
    """What one connection has yet to be sent."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] = {}
        self.ordered: deque[dict[str, Any]] = deque()
        self.wake = asyncio.Event()
        self.overflowed = False

    def push_topic(self, topic: str, data: Any) -> None:
        if topic in REPLACEABLE_TOPICS:
            self.latest[topic] = data
        else:
            self.put({"topic": topic, "data": data})
            return
        self.wake.set()

    def put(self, message: dict[str, Any]) -> None:
        if len(self.ordered) >= MAX_QUEUED:
            self.overflowed = True
        else:
            self.ordered.append(message)
        self.wake.set()

    def take(self) -> list[dict[str, Any]]:
        messages = list(self.ordered)
        self.ordered.clear()
        messages += [{"topic": t, "data": d} for t, d in self.latest.items()]
        self.latest.clear()
        self.wake.clear()
        return messages


class Connection:
    def __init__(self, writer: asyncio.StreamWriter, uid: int | None) -> None:
        self.writer = writer
        self.uid = uid
        self.outbox = Outbox()
        self.topics: set[str] = set()
        self.closed = False
        self.finishing = False
        """No more requests (EOF or daemon exit): flush what is queued, then close."""
        self.pump_task: asyncio.Task[None] | None = None
        self.lines: asyncio.Queue[bytes | None] = asyncio.Queue(READ_AHEAD)
        """Request lines read ahead; None: no more (EOF or a read error)."""
        self.gone = asyncio.Event()
        """The client hung up (or the connection closed): nobody reads a reply any more."""

    async def pump(self) -> None:
        """Send the outbox until the connection closes; drops it when it overflows."""
        try:
            while not self.closed:
                await self.outbox.wake.wait()
                if self.outbox.overflowed:
                    log.warning("dropping a client that does not keep up (uid %s)", self.uid)
                    break
                for message in self.outbox.take():
                    self.writer.write(encode(message))
                await self.writer.drain()
                if self.finishing and not self.outbox.ordered:
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.gone.set()
            self.outbox.wake.set()
            with contextlib.suppress(Exception):
                self.writer.close()


def hung_up(writer: asyncio.StreamWriter) -> bool:
    """The peer closed its end entirely (POLLHUP), not merely its writing half: a client
    that half-closes after its request still reads the reply."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    return any(mask & (select.POLLHUP | select.POLLERR) for _fd, mask in poller.poll(0))


async def read_lines(reader: asyncio.StreamReader, conn: Connection) -> None:
    """Queue the connection's request lines; at its end, None (and `gone` if it hung up)."""
    try:
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                await conn.lines.put(TOO_LARGE)
                return
            except (ConnectionError, OSError):
                conn.gone.set()
                return
            if not line:
                if hung_up(conn.writer):
                    conn.gone.set()
                return
            if line.strip():
                await conn.lines.put(line)
    finally:
        await conn.lines.put(None)  # after the lines before it, however many wait


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
        self.allowed = {os.getuid(), *daemon.cfg.control.allow_uids}
        self.connections: set[Connection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.acting = asyncio.Lock()
        self.acting_cmd: str | None = None
        self.pre_empting: str | None = None
        """A stop or shutdown that started while a save waited (see PRE_EMPT)."""
        self.answering: set[asyncio.Task[None]] = set()
        """Requests being answered, up to their reply's place in the outbox."""

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
            self.server = await asyncio.start_unix_server(
                self._serve, address, limit=MAX_LINE + 1, backlog=512
            )
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

    # -------------------------------------------------------------- broadcast

    def listening(self, topic: str) -> bool:
        """Whether any client is subscribed to `topic` (nobody: nothing to build)."""
        return any(topic in conn.topics for conn in self.connections)

    def publish(self, topic: str, data: Any) -> None:
        for conn in self.connections:
            if topic in conn.topics:
                conn.outbox.push_topic(topic, data)

    # -------------------------------------------------------------- one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid = peer_uid(writer)
        except OSError:
            uid = None
        if uid not in self.allowed or len(self.connections) >= MAX_CONNECTIONS:
            code, why = (
                ("forbidden", f"uid {uid} may not control this run; add it to [control] allow_uids")
                if uid not in self.allowed
                else ("busy", f"too many connections ({MAX_CONNECTIONS}); try again later")
            )
            with contextlib.suppress(Exception):
                await _hang_up_after(encode(_error(None, code, why)), reader, writer)
            writer.close()
            return
        conn = Connection(writer, uid)
        self.connections.add(conn)
        loop = asyncio.get_running_loop()
        pump = conn.pump_task = loop.create_task(conn.pump())
        lines = loop.create_task(read_lines(reader, conn))
        try:
            while not conn.closed:
                line = await conn.lines.get()
                if line is None:
                    break
                if line == TOO_LARGE:
                    conn.outbox.put(_error(None, "too_large", f"line exceeds {MAX_LINE} bytes"))
                    break
                answer = loop.create_task(self._request(conn, line))
                self.answering.add(answer)
                try:
                    await asyncio.shield(answer)
                finally:
                    self.answering.discard(answer)
        finally:
            lines.cancel()
            self.connections.discard(conn)
            # Let the pump flush what is queued, then close.
            conn.finishing = True
            conn.outbox.wake.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(pump), 5.0)
            conn.close()

    async def _request(self, conn: Connection, line: bytes) -> None:
        try:
            message = decode(line)
        except ProtocolError as exc:
            conn.outbox.put(_error(None, "bad_request", str(exc)))
            return
        rid = message.get("id")
        if rid is not None and (not isinstance(rid, int | str) or isinstance(rid, bool)):
            conn.outbox.put(_error(None, "bad_request", "'id' must be an integer or a string"))
            return
        cmd = message.get("cmd")
        if not isinstance(cmd, str):
            conn.outbox.put(_error(rid, "bad_request", "'cmd' must be a string naming a command"))
            return
        args = {k: v for k, v in message.items() if k not in ("id", "cmd")}
        try:
            if cmd in ACTING:
                result = await self._acting(conn, rid, cmd, args)
            else:
                handler = getattr(self, f"cmd_{cmd}", None)
                if handler is None:
                    known = ", ".join(sorted([*READS, *ACTING]))
                    conn.outbox.put(
                        _error(rid, "unknown_command", f"unknown command '{cmd}'; known: {known}")
                    )
                    return
                result = handler(conn, args)
                if asyncio.iscoroutine(result):  # answered off the loop (history)
                    result = await result
        except CommandError as exc:
            conn.outbox.put(_error(rid, exc.code, str(exc)))
            return
        except Exception as exc:  # never let one request take the daemon down
            log.exception("control request %r failed", cmd)
            conn.outbox.put(_error(rid, "internal", f"{type(exc).__name__}: {exc}"))
            return
        conn.outbox.put({"id": rid, "ok": True, "result": result})

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
            "run": self.daemon.cfg.run.name,
            "run_dir": str(self.daemon.cfg.run_dir),
            "log": str(self.daemon.cfg.log_path),
            "pid": os.getpid(),
        }

    def cmd_status(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self.daemon.status_view()

    def cmd_checkpoints(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self.daemon.checkpoints_view()

    def cmd_events(self, conn: Connection, args: dict[str, Any]) -> Any:
        n = _int_arg(args, "n", 50, 1, 100_000)
        return {"events": tail_records(self.daemon.files.journal, n)}

    async def cmd_history(self, conn: Connection, args: dict[str, Any]) -> Any:
        start = _int_arg(args, "start", None, 0, MAX_STEP)
        end = _int_arg(args, "end", None, 0, MAX_STEP)
        points = _int_arg(args, "points", 200, 1, 100_000)
        return await self.daemon.history_query(start, end, points)

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
