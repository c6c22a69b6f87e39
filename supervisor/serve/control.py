"""The control socket: a Unix stream server speaking newline-delimited JSON.

Connections (outboxes, read-ahead, admission) are in `connection`, the time slices
requests are answered in are in `turns`, the read commands' answers in `reads`.

Acting commands run one at a time, except that stop and shutdown pre-empt a waiting save
or pivot (see PRE_EMPT).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from trainwarden.supervisor.core.policy import ACTING, BadRequest, Command, parse_command
from trainwarden.supervisor.core.policy import Reply as PolicyReply
from trainwarden.supervisor.errors import LockHeld
from trainwarden.supervisor.protocol import (
    MAX_LINE,
    ErrorCode,
    OkReply,
    ProgressLine,
    Push,
    RequestId,
    Topic,
    connect_path,
    encode,
)
from trainwarden.supervisor.serve.connection import (
    TOO_LARGE,
    WRITE_BUFFER_HIGH,
    Connection,
    admission,
    evictable,
    hang_up_after,
    hung_up,
    parse_request,
    read_lines,
    serve_unix,
    writer_peer_uid,
)
from trainwarden.supervisor.serve.memory import map_large_allocations, release_memory
from trainwarden.supervisor.serve.queues import bounded_push, error_reply
from trainwarden.supervisor.serve.reads import READS, CommandError, ReadCommands
from trainwarden.supervisor.serve.supervised import Supervised
from trainwarden.supervisor.serve.turns import Turns
from trainwarden.supervisor.socket_place import SocketPlace, check_socket_place, resolve_group

log = logging.getLogger("trainwarden.control")

TRIM_DELAY_S = 2.0
"""How long after the connections thinned out (to half their peak, at least TRIM_AFTER
closed) freed memory is handed back to the system: once per flood, not per client (a full
collection takes the loop for a while)."""
TRIM_AFTER = 8
PRE_EMPT = {"stop": ("save", "pivot"), "shutdown": ("save", "pivot")}
"""Acting commands that may start while another waits, and whose waits they end (the policy
answers a save "superseded"; a pivot before its checkpoint "pivot abandoned", and one past
it finishes first)."""


class ControlServer:
    def __init__(self, daemon: Supervised) -> None:
        self.daemon = daemon
        self.path = daemon.cfg.socket_path
        self.owner = os.getuid()
        self.allowed = {self.owner, *daemon.cfg.control.allow_uids}
        self.reads = ReadCommands(daemon, self.owner)
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

    def _admission(self, uid: int | None) -> tuple[ErrorCode, str] | None:
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
                {
                    "kind": "client_dropped",
                    "uid": conn.uid,
                    "reason": reason,
                    "queued_bytes": queued_bytes,
                }
            )

    # -------------------------------------------------------------- broadcast

    def listening(self, topic: Topic) -> bool:
        """Whether any client is subscribed to `topic` (nobody: nothing to build)."""
        return any(topic in conn.topics for conn in self.connections)

    def publish(self, topic: Topic, data: Any) -> None:
        line: bytes | None = None
        for conn in self.connections:
            if topic in conn.topics:
                if line is None:  # encoded once, for every subscriber
                    push: Push = {"topic": topic, "data": data}
                    line = bounded_push(push)
                conn.outbox.push_topic(topic, line)

    # -------------------------------------------------------------- one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid = writer_peer_uid(writer)
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
        if refusal is not None and refusal[0] == "busy" and uid == self.owner:
            # The daemon's own user is never locked out by its own idle connections.
            idlest = evictable(self.connections, self.owner)
            if idlest is not None:
                idlest.drop("evicted")
                self.connections.discard(idlest)
                refusal = self._admission(uid)
        if refusal is not None:
            code, why = refusal
            with contextlib.suppress(Exception):
                await hang_up_after(encode(error_reply(None, code, why)), reader, writer)
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
                    conn.outbox.put(
                        error_reply(None, "too_large", f"line exceeds {MAX_LINE} bytes")
                    )
                    break
                conn.working = True
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
                conn.working = False
                conn.idle_since = time.monotonic()
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

    @staticmethod
    def _parse(conn: Connection, line: bytes) -> tuple[RequestId, str, dict[str, Any]] | None:
        """The request on `line` as (id, command, arguments), or None once an error about
        it is queued."""
        request = parse_request(line)
        if isinstance(request, dict):
            conn.outbox.put(request)
            return None
        return request

    def _answer(
        self, conn: Connection, rid: RequestId, cmd: str, args: dict[str, Any]
    ) -> Coroutine[Any, Any, None] | None:
        """Answer a request now, or return what finishes answering it (a command that
        waits: an acting one, history)."""
        if cmd in ACTING:
            return self._reply(conn, rid, cmd, lambda: self._acting(conn, rid, cmd, args))
        handler = getattr(self.reads, f"cmd_{cmd}", None)
        if handler is None:
            known = ", ".join(sorted([*READS, *ACTING]))
            conn.outbox.put(
                error_reply(rid, "unknown_command", f"unknown command '{cmd}'; known: {known}")
            )
            return None
        if asyncio.iscoroutinefunction(handler):  # answered off the loop (history, events)
            return self._reply(conn, rid, cmd, lambda: handler(conn, args))
        try:
            result = handler(conn, args)
        except Exception as exc:
            self._failed(conn, rid, cmd, exc)
            return None
        conn.outbox.put(ok_reply(rid, result))
        return None

    async def _reply(
        self, conn: Connection, rid: RequestId, cmd: str, answer: Callable[[], Awaitable[Any]]
    ) -> None:
        try:
            result = await answer()
        except Exception as exc:
            self._failed(conn, rid, cmd, exc)
            return
        conn.outbox.put(ok_reply(rid, result))

    @staticmethod
    def _failed(conn: Connection, rid: RequestId, cmd: str, exc: Exception) -> None:
        if not isinstance(exc, CommandError):  # never let one request take the daemon down
            log.exception("control request %r failed", cmd, exc_info=exc)
            exc = CommandError("internal", f"{type(exc).__name__}: {exc}")
        conn.outbox.put(error_reply(rid, exc.code, str(exc)))

    async def _acting(
        self, conn: Connection, rid: RequestId, cmd: str, args: dict[str, Any]
    ) -> dict[str, Any] | None:
        command = parse_command(cmd, args)
        if isinstance(command, BadRequest):
            raise CommandError(command.code, command.message)
        if self.acting.locked() or self.pre_empting is not None:
            if self.pre_empting is None and self.acting_cmd in PRE_EMPT.get(cmd, ()):
                # A waiting save or pivot must not hold a stop off: the policy answers it.
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
            raise CommandError(reply.code or "internal", reply.message)
        return reply.result

    async def _operate(self, conn: Connection, rid: RequestId, command: Command) -> PolicyReply:
        """The daemon's reply to `command`, its progress lines sent as they come; abandoned
        as soon as the client hangs up."""

        def progress(message: str) -> None:
            line: ProgressLine = {"id": rid, "progress": message}
            conn.outbox.put(line)

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


def ok_reply(rid: RequestId, result: Any) -> OkReply:
    return {"id": rid, "ok": True, "result": result}
