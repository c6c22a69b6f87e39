"""The bytes on the control socket: one JSON object per line, and the socket's address.

The lowest layer of the protocol, shared by the server (serve/control.py) and the
clients (client.py). What the objects mean is trainwarden.supervisor.protocol's; this
module imports only the standard library, orjson and the errors.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from trainwarden.supervisor.errors import ProtocolError

MAX_LINE = 1 << 20
"""The longest line either side sends or accepts, in bytes (1 MiB)."""
MAX_SOCKET_PATH = 100
"""Longer socket paths are reached through their folder (Unix allows 107 bytes)."""


def encode(message: Mapping[str, Any]) -> bytes:
    """One message as its line, newline included."""
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


def os_open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def connect_path(path: Path) -> tuple[str, int | None]:
    """The address to connect/bind to for `path`, and a directory fd to keep open meanwhile.

    Unix socket paths are limited to 107 bytes; a longer one is reached through
    /proc/self/fd/N/NAME with N an open descriptor of the socket's folder.
    """
    text = str(path)
    if len(text.encode()) <= MAX_SOCKET_PATH:
        return text, None
    fd = os_open_dir(path.parent)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (SO_PEERCRED:
    for a client, the uid that listens)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
