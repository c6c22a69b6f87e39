"""sd_notify(3) without libsystemd: readiness, status text and watchdog pings to systemd.

systemd passes the notification socket in NOTIFY_SOCKET (a path, or an abstract name
written with a leading "@") and, when WatchdogSec= is set, the timeout in WATCHDOG_USEC.
Each message is one datagram of newline-separated KEY=value assignments. Outside systemd
every method is a no-op; a failed send is logged once and never raised, because a
notification that cannot be delivered must not stop the supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

NOTIFY_ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
"""Variables meant for the daemon alone: leave them out of the trainer's environment."""


class Notifier:
    """Sends service state to systemd's notification socket (if there is one).

    `address` is the socket address as socket.sendto takes it (an abstract name starts
    with a NUL byte), None when notifications are off; `watchdog_usec` is the watchdog
    timeout in microseconds, None when systemd expects no pings from this process.
    """

    def __init__(self, address: str | bytes | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_usec = watchdog_usec
        self._logged: set[str] = set()

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, pid: int | None = None
    ) -> Notifier:
        """Read NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (default: os.environ)."""
        env = os.environ if environ is None else environ
        address = _parse_address(env.get("NOTIFY_SOCKET", ""))
        watchdog_usec = _parse_watchdog(env, os.getpid() if pid is None else pid)
        return cls(address, watchdog_usec if address is not None else None)

    @property
    def enabled(self) -> bool:
        """Whether systemd listens (NOTIFY_SOCKET was set)."""
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half the watchdog timeout, as sd_watchdog_enabled(3) advises."""
        if self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2 / 1_000_000

    def ready(self, status: str | None = None) -> bool:
        """Start-up is complete (Type=notify units count as started from here)."""
        return self.send(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """One line shown by `systemctl status`."""
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        """Keep-alive ping; without one for WatchdogSec, systemd kills and restarts us."""
        if self.watchdog_usec is None:
            return False
        return self.send(WATCHDOG=1)

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown has begun."""
        return self.send(STOPPING=1, STATUS=status)

    def extend_timeout(self, seconds: float) -> bool:
        """Ask systemd to wait `seconds` longer for the current start or stop to complete."""
        return self.send(EXTEND_TIMEOUT_USEC=int(seconds * 1_000_000))

    def send(self, **fields: object) -> bool:
        """Send one datagram `KEY=value\\n...` (None values left out); True if it went out."""
        if self.address is None:
            return False
        lines = []
        for key, value in fields.items():
            if value is None:
                continue
            if isinstance(value, bool):
                value = int(value)
            # A newline would start a new assignment: status text stays on one line.
            text = str(value).replace("\r", " ").replace("\n", " ")
            lines.append(f"{key}={text}")
        if not lines:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # Never block the event loop on a full queue: a late ping is worth nothing.
                sock.setblocking(False)
                sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            key = type(exc).__name__ if exc.errno is None else str(exc.errno)
            if key not in self._logged:
                self._logged.add(key)
                log.warning("cannot notify systemd at %r: %s", self.address, exc)
            return False
        return True


async def watchdog_pings(notifier: Notifier | None) -> None:
    """WATCHDOG=1 from the event loop itself, so a wedged loop gets the unit restarted
    (nothing to do where systemd expects no pings)."""
    interval = getattr(notifier, "watchdog_interval_s", None)
    if notifier is None or not interval:
        return
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval)


def _parse_address(value: str) -> str | bytes | None:
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    log.warning("NOTIFY_SOCKET=%r is not a Unix socket path: systemd notifications off", value)
    return None


def _parse_watchdog(env: Mapping[str, str], pid: int) -> int | None:
    owner = env.get("WATCHDOG_PID")
    if owner:
        try:
            if int(owner) != pid:
                return None  # the variable was inherited: the watchdog is someone else's
        except ValueError:
            return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec if usec > 0 else None
