"""Misbehaving control-socket clients, each on its own thread: what a flood looks like.

    never_reading   subscribes to every topic and never reads a byte
    pipelining      sends `requests` status requests at once and never reads
    slow_reading    subscribes to every topic and reads 256 bytes every 0.2 s
    vanishing       connects, asks for status and hangs up at once, over and over
    big_lines       pipelines request lines of about 900 KB each, never reads

Crowd(socket, kinds).start() starts them; close() ends every thread (closing the
sockets) and waits for them. Refusals (busy) and drops are part of the game: a client
that is refused or dropped ends quietly, except `vanishing`, which keeps coming back.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

KINDS = ("never_reading", "pipelining", "slow_reading", "vanishing", "big_lines")
SUBSCRIBE_ALL = b'{"id": 1, "cmd": "subscribe"}\n'


CROWD = (
    ["never_reading"] * 60
    + ["pipelining"] * 60
    + ["slow_reading"] * 40
    + ["vanishing"] * 30
    + ["big_lines"] * 10
)
"""The 200 misbehaving clients of the load test and its bench section."""


def rss_mb(pid: int) -> float:
    """A process's resident memory in MiB."""
    import psutil

    return float(psutil.Process(pid).memory_info().rss) / 2**20


class Crowd:
    def __init__(self, socket_path: Path, kinds: Sequence[str], requests: int = 3000) -> None:
        self.socket_path = socket_path
        self.kinds = list(kinds)
        self.requests = requests
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.connected = 0
        self.refused = 0

    def start(self) -> Crowd:
        for i, kind in enumerate(self.kinds):
            run: Callable[[], None] = getattr(self, f"_{kind}")
            thread = threading.Thread(target=self._guarded, args=(run,), name=f"{kind}-{i}")
            thread.daemon = True
            thread.start()
            self.threads.append(thread)
        return self

    def close(self) -> None:
        self.stopping.set()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self.sockets.clear()
        for thread in self.threads:
            thread.join(10.0)

    # ------------------------------------------------------------------ the kinds

    def _guarded(self, run: Callable[[], None]) -> None:
        with contextlib.suppress(OSError, ValueError):
            run()

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self.lock:
            if self.stopping.is_set():
                sock.close()
                raise OSError("stopping")
            self.sockets.append(sock)
        sock.connect(str(self.socket_path))
        with self.lock:
            self.connected += 1
        return sock

    def _never_reading(self) -> None:
        sock = self._connect()
        sock.sendall(SUBSCRIBE_ALL)
        self.stopping.wait()

    def _pipelining(self) -> None:
        sock = self._connect()
        batch = b"".join(b'{"id": %d, "cmd": "status"}\n' % i for i in range(1, self.requests + 1))
        sock.sendall(batch)  # blocks once the daemon stops reading us: that is the point
        self.stopping.wait()

    def _slow_reading(self) -> None:
        sock = self._connect()
        sock.sendall(SUBSCRIBE_ALL)
        while not self.stopping.wait(0.2):
            if not sock.recv(256):
                return

    def _vanishing(self) -> None:
        while not self.stopping.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.socket_path))
                sock.sendall(b'{"id": 1, "cmd": "status"}\n')
            except OSError:
                with self.lock:
                    self.refused += 1
            finally:
                sock.close()
            time.sleep(0.05)

    def _big_lines(self) -> None:
        sock = self._connect()
        line = b'{"id": 1, "cmd": "status", "pad": "' + b"x" * 900_000 + b'"}\n'
        for _ in range(100):
            if self.stopping.is_set():
                return
            sock.sendall(line)
        self.stopping.wait()
