"""The control protocol: message framing and the clients (shared by the CLI and the TUI).

Unix stream socket, newline-delimited JSON, one object per line, at most 1 MiB a line.

    request   {"id": 7, "cmd": "save", ...args}
    reply     {"id": 7, "ok": true, "result": {...}}
              {"id": 7, "ok": false, "error": {"code": "...", "message": "..."}}
    push      {"topic": "telemetry", "data": {...}}      (after a subscribe)

Commands and their results:

    hello                  {"protocol": 1, "version": "0.1.0", "run": name, "run_dir": path,
                            "log": path of the run log}
    status                 STATUS (below)
    subscribe topics=[..]  {"snapshot": {topic: data, ...}}, then pushes on those topics
    history start= end= points=
                           {"step": [...], "min": [...], "mean": [...], "max": [...],
                            "first_step", "last_step", "count", "markers": [{"step", "kind"}]}
    checkpoints            {"checkpoints": [CKPT...], "quarantined": [{"name", "reason"}]}
    events n=50            {"events": [journal records, newest last]}
    save wait=false        {"requested": true} or, with wait, {"step": N, "path": ...}
    stop                   {"state": "stopped", "checkpoint": CKPT|null}
    start                  {"state": "starting"}
    pin step= / unpin step={"step": N, "pinned": bool}
    pivot caps={arm: x} floors={arm: y}
                           {"step": N, "archive": path}
    shutdown               {"state": "stopped"}; the daemon then exits

Topics: telemetry (TELEMETRY per step, newest wins), gpu (GPU sample every 2 s or null),
host, checkpoints ({"checkpoints", "quarantined"}), events (one journal record per push),
bandit (the trainer's .state.json), samples (the trainer's .samples.json),
state ({"state", "detail", "trainer_pid", "restarts"}).

STATUS = {"state", "detail", "run", "run_dir", "daemon_pid", "trainer_pid",
          "trainer_started_at", "step", "total_steps", "restarts",
          "restarts_without_progress", "seg", "checkpoints": [CKPT], "quarantined",
          "resume_audit": {"status": "verified"|"drift"|null, ...},
          ...TELEMETRY fields, "gpu": GPU|null, "host": {...}}
CKPT = {"step", "path", "bytes", "verified", "pinned", "mtime", "next_to_delete"}
TELEMETRY = {"step", "loss", "loss_ema", "loss_avg", "dt", "tokens_per_s", "mfu",
             "mfu_avg", "mfu_unknown_reason", "steps_per_min", "eta_s", "collapse_loss",
             "last_checkpoint_step", "last_checkpoint_age_s", "next_checkpoint_step"}

Error codes: bad_request, unknown_command, bad_argument, wrong_state, busy, timeout,
not_implemented, forbidden, too_large, internal.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from trainwarden.supervisor.errors import CommandRefused, DaemonNotRunning, ProtocolError

MAX_LINE = 1 << 20
TOPICS = ("telemetry", "gpu", "host", "checkpoints", "events", "bandit", "samples", "state")


def encode(message: dict[str, Any]) -> bytes:
    return orjson.dumps(message, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One received line as an object; ProtocolError for anything else."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"line of {len(line)} bytes exceeds the {MAX_LINE}-byte limit")
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"invalid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    return message


def not_running_message(socket_path: Path) -> str:
    run_dir = socket_path.parent.parent
    return (
        f"no trainwarden daemon answers on {socket_path}; start one with "
        f"`trainwarden daemon --detach {run_dir}` (or `systemctl start trainwarden@...`)"
    )


def unreachable(socket_path: Path, exc: OSError) -> DaemonNotRunning:
    """The one-line error for a socket nobody answers on, or one we may not use."""
    if isinstance(exc, PermissionError):
        return DaemonNotRunning(
            f"permission denied on {socket_path}: run as the daemon's user or add your uid "
            "to [control] allow_uids"
        )
    return DaemonNotRunning(not_running_message(socket_path))


def os_open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def connect_path(path: Path) -> tuple[str, int | None]:
    """The address to connect/bind to for `path`, and a directory fd to keep open meanwhile.

    Unix socket paths are limited to 107 bytes; a longer one is reached through
    /proc/self/fd/N/NAME with N an open descriptor of the socket's folder.
    """
    text = str(path)
    if len(text.encode()) <= 100:
        return text, None
    fd = os_open_dir(path.parent)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


class Client:
    """A blocking client for the CLI: one request, one reply."""

    def __init__(self, socket_path: Path, timeout: float | None = 30.0) -> None:
        self.socket_path = socket_path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        fd = None
        try:
            address, fd = connect_path(socket_path)  # a long path opens its folder: may fail too
            self._connect(address, timeout)
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
        while b"\n" not in self.buffer:
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise ProtocolError("the daemon did not answer in time") from None
            if not chunk:
                raise ProtocolError("the daemon closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return decode(line)

    def request(self, cmd: str, **args: Any) -> Any:
        """Send one command; its result, or CommandRefused with the daemon's error."""
        rid = next(self.ids)
        self.sock.sendall(encode({"id": rid, "cmd": cmd, **args}))
        while True:
            message = self.read_message()
            if message.get("id") == rid:
                return result_of(message)


def result_of(message: dict[str, Any]) -> Any:
    if message.get("ok"):
        return message.get("result")
    error = message.get("error") or {}
    raise CommandRefused(str(error.get("code", "error")), str(error.get("message", "failed")))


class AsyncClient:
    """An asyncio client for the TUI: requests and pushed topic messages on one connection."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.pushes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.reader_task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        fd = None
        try:
            address, fd = connect_path(self.socket_path)
            self.reader, self.writer = await asyncio.open_unix_connection(address, limit=MAX_LINE)
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
                message = decode(line)
                if "topic" in message:
                    self.pushes.put_nowait(message)
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
            self.pushes.put_nowait({"topic": "_closed", "data": None})

    async def request(self, cmd: str, timeout: float | None = 30.0, **args: Any) -> Any:
        if self.writer is None:
            raise ProtocolError("not connected")
        rid = next(self.ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[rid] = future
        self.writer.write(encode({"id": rid, "cmd": cmd, **args}))
        await self.writer.drain()
        message = await asyncio.wait_for(future, timeout)
        return result_of(message)

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """Pushed messages until the connection closes."""
        while True:
            message = await self.pushes.get()
            if message["topic"] == "_closed":
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
