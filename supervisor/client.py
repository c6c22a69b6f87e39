"""The clients of the control socket: a blocking one for the CLI, an asyncio one for the TUI.

Both speak the framing of wire.py and raise the errors of errors.py: DaemonNotRunning
when nobody answers (or we may not use the socket), UntrustedServer when the uid that
serves the socket (SO_PEERCRED) is not ours or root's, nor one the operator named as the
daemon's user (--daemon-user, [control] daemon_user) serving from a folder only its owner
may write to (whoever owns the folder proves nothing: a user who made it first does),
CommandRefused with the daemon's error code, ProtocolError for a broken or closed connection. What a reply holds is
described by the types in trainwarden.supervisor.protocol, which re-exports these
clients; this module imports only wire.py and the errors, so it sits below protocol.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import itertools
import os
import pwd
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from trainwarden.supervisor.errors import (
    CommandRefused,
    DaemonNotRunning,
    NobodyAnswers,
    ProtocolError,
    UntrustedServer,
    UsageError,
)
from trainwarden.supervisor.wire import MAX_LINE, connect_path, decode, encode, peer_uid

CLOSED = "_closed"
"""The topic of the sentinel AsyncClient queues when the connection ends (never on the wire)."""


def not_running_message(socket_path: Path) -> str:
    if socket_path.parent.name != ".trainwarden":
        # Not a run's own socket (a forwarded one, or [control] socket elsewhere): which
        # run it serves is not known here, so name no directory to start a daemon in.
        return (
            f"no trainwarden daemon answers on {socket_path}; is the daemon running, and the "
            "ssh tunnel to it up if this socket is a forwarded one?"
        )
    run_dir = socket_path.parent.parent
    return (
        f"no trainwarden daemon answers on {socket_path}; start one with "
        f"`trainwarden daemon --detach {run_dir}` (or `systemctl start trainwarden@...`)"
    )


def unreachable(socket_path: Path, exc: OSError) -> DaemonNotRunning:
    """The one-line error for a socket nobody answers on, or one we may not use."""
    if isinstance(exc, PermissionError):
        return DaemonNotRunning(f"permission denied on {socket_path}: {_denied_by(socket_path)}")
    return NobodyAnswers(not_running_message(socket_path), socket_path)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _denied_by(socket_path: Path) -> str:
    """What keeps us from the socket: a folder above it, its folder, or the socket."""
    uid = os.getuid()
    groups = ", ".join(_group(g) for g in sorted({os.getgid(), *os.getgroups()}))
    folder = socket_path.parent
    try:
        st = os.stat(folder)
        what = f"its folder {folder}"
        if os.access(folder, os.X_OK):
            st = os.stat(socket_path)
            what = "the socket"
        what += f" (mode {stat.S_IMODE(st.st_mode):04o}, group {_group(st.st_gid)})"
    except OSError:
        what = f"a folder above {folder}"
    return (
        f"{what} does not let uid {uid} in (your groups: {groups}); another user reaches a "
        "daemon only when its [control] allow_uids lists them and its [control] group names "
        "a group they are in (the folder is then 0710 and the socket 0660 in that group)"
    )


def _check_server(
    socket_path: Path, sock: socket.socket, folder_fd: int | None, daemon_uid: int | None
) -> None:
    """UntrustedServer unless the socket is served by us, root, or `daemon_uid` (the user
    the operator named as the daemon's) from a folder only its owner can write to."""
    served_by = peer_uid(sock)
    if served_by in (os.getuid(), 0):
        return
    me = os.getuid()
    if daemon_uid is None or served_by != daemon_uid:
        raise UntrustedServer(
            f"{socket_path} is served by uid {served_by} ({_user(served_by)}), not by you"
            f" (uid {me}) or root; nothing was sent. If that user runs the daemon, name it:"
            f" --daemon-user {_user(served_by)} (or [control] daemon_user in the run's config)"
        )
    try:
        st = os.fstat(folder_fd) if folder_fd is not None else os.stat(socket_path.parent)
    except OSError as exc:
        raise UntrustedServer(
            f"{socket_path}: cannot check its folder ({exc}); nothing was sent"
        ) from None
    if st.st_uid not in (daemon_uid, 0) or stat.S_IMODE(st.st_mode) & 0o022:
        raise UntrustedServer(
            f"{socket_path}: its folder (owner uid {st.st_uid}, mode"
            f" {stat.S_IMODE(st.st_mode):04o}) may be written by others than"
            f" {_user(daemon_uid)}, so anyone could have put that socket there; nothing was sent"
        )


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def daemon_uid_of(name: str | int | None) -> int | None:
    """The uid of a --daemon-user / [control] daemon_user (a name or a number); UsageError
    for an unknown name."""
    if name is None or isinstance(name, int):
        return name
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise UsageError(f"--daemon-user {name}: no such user on this machine") from None


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


class Client:
    """A blocking client for the CLI: one request, one reply."""

    def __init__(
        self, socket_path: Path, timeout: float | None = 30.0, daemon_uid: int | None = None
    ) -> None:
        self.socket_path = socket_path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        fd = None
        try:
            address, fd = connect_path(socket_path)  # a long path opens its folder: may fail too
            self._connect(address, timeout)
            _check_server(socket_path, self.sock, fd, daemon_uid)
        except UntrustedServer:
            self.sock.close()
            raise
        except (
            FileNotFoundError,
            ConnectionRefusedError,
            NotADirectoryError,
            PermissionError,
        ) as exc:
            self.sock.close()
            raise unreachable(socket_path, exc) from None
        finally:
            _close(fd)
        self.buffer = b""
        self.ids = itertools.count(1)
        self.heard = False
        """Whether the daemon has sent anything on this connection."""

    def _connect(self, address: str, timeout: float | None) -> None:
        # A full listen backlog (hundreds of clients at once) answers EAGAIN: retry briefly.
        deadline = time.monotonic() + (timeout if timeout is not None else 30.0)
        while True:
            try:
                self.sock.connect(address)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConnectionRefusedError(f"{address}: backlog full") from None
                time.sleep(0.01)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_message(self) -> dict[str, Any]:
        """The next message: any line the daemon may send (up to MAX_LINE bytes)."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE:
                raise ProtocolError(f"the daemon sent a line over the {MAX_LINE}-byte limit")
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                raise ProtocolError("the daemon did not answer in time") from None
            except ConnectionError:
                chunk = b""
            if not chunk:
                raise ProtocolError(self._closed())
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        self.heard = True
        return decode(line)

    def _closed(self) -> str:
        if self.heard:
            return "the daemon closed the connection"
        # What a forwarded socket does when its tunnel, or the daemon behind it, is down.
        return (
            f"the socket {self.socket_path} closed before a reply: is the ssh tunnel up,"
            " and the daemon running?"
        )

    def request(
        self, cmd: str, on_progress: Callable[[str], None] | None = None, **args: Any
    ) -> Any:
        """Send one command; its result, or CommandRefused with the daemon's error.
        `on_progress` gets each progress line the daemon sends before the reply."""
        rid = next(self.ids)
        try:
            self.sock.sendall(encode({"id": rid, "cmd": cmd, **args}))
        except ConnectionError:
            pass  # refused before we asked: the refusal itself is still ours to read
        while True:
            message = self.read_message()
            if message.get("id") is None and message.get("ok") is False:
                return result_of(message)  # the connection itself was refused
            if message.get("id") != rid:
                continue
            if "progress" in message:
                if on_progress is not None:
                    on_progress(str(message["progress"]))
                continue
            return result_of(message)


def result_of(message: dict[str, Any]) -> Any:
    if message.get("ok"):
        return message.get("result")
    error = message.get("error") or {}
    raise CommandRefused(str(error.get("code", "error")), str(error.get("message", "failed")))


class AsyncClient:
    """An asyncio client for the TUI: requests and pushed topic messages on one connection."""

    def __init__(self, socket_path: Path, daemon_uid: int | None = None) -> None:
        self.socket_path = socket_path
        self.daemon_uid = daemon_uid
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.progress: dict[int, Callable[[str], None]] = {}
        self.pushes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.reader_task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        fd = None
        try:
            address, fd = connect_path(self.socket_path)
            self.reader, self.writer = await asyncio.open_unix_connection(
                address,
                limit=MAX_LINE + 1,  # the limit counts the newline
            )
            try:
                sock = self.writer.get_extra_info("socket")
                _check_server(self.socket_path, sock, fd, self.daemon_uid)
            except UntrustedServer:
                self.writer.close()
                self.reader = self.writer = None
                raise
        except (
            FileNotFoundError,
            ConnectionRefusedError,
            NotADirectoryError,
            PermissionError,
        ) as exc:
            raise unreachable(self.socket_path, exc) from None
        finally:
            _close(fd)
        self.reader_task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        assert self.reader is not None
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                message = decode(line.removesuffix(b"\n"))
                if "topic" in message:
                    self.pushes.put_nowait(message)
                    continue
                if "progress" in message:
                    tell = self.progress.get(message.get("id", -1))
                    if tell is not None:
                        tell(str(message["progress"]))
                    continue
                if message.get("id") is None and message.get("ok") is False:
                    # The connection itself was refused: no request of ours gets a reply.
                    for waiting in self.pending.values():
                        if not waiting.done():
                            waiting.set_result(message)
                    self.pending.clear()
                    continue
                future = self.pending.pop(message.get("id", -1), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (ProtocolError, ConnectionError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(ProtocolError("the daemon closed the connection"))
            self.pending.clear()
            self.pushes.put_nowait({"topic": CLOSED, "data": None})

    async def request(
        self,
        cmd: str,
        timeout: float | None = 30.0,
        on_progress: Callable[[str], None] | None = None,
        **args: Any,
    ) -> Any:
        if self.writer is None:
            raise ProtocolError("not connected")
        rid = next(self.ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[rid] = future
        if on_progress is not None:
            self.progress[rid] = on_progress
        try:
            self.writer.write(encode({"id": rid, "cmd": cmd, **args}))
            await self.writer.drain()
            message = await asyncio.wait_for(future, timeout)
        finally:
            self.progress.pop(rid, None)
        return result_of(message)

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """Pushed messages until the connection closes."""
        while True:
            message = await self.pushes.get()
            if message["topic"] == CLOSED:
                return
            yield message

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        if self.reader_task is not None:
            self.reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self.reader_task
