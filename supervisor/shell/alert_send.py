"""One alert sent to one apprise URL, in a process of its own (`python -m` this module, run
by shell.alerts through shell.helpers): whatever the endpoint does (answers a byte at a
time, streams an endless response) costs this process, at most MEMORY_BYTES of memory and
`timeout_s` from when the send begins (its own timer), never the daemon's; the daemon kills
it if it is still there STARTUP_S later.

Reads {"url", "title", "body", "timeout_s"} as JSON on stdin; prints one line, RESULT and
{"ok": bool, "said": [what apprise logged]}, last.
"""

from __future__ import annotations

import logging
import resource
import signal
import sys

import orjson

RESULT = "trainwarden-alert-result "
STARTUP_S = 30.0
"""Beyond timeout_s, the time the sending process may take to start and report back."""
MEMORY_BYTES = 1 << 30
"""Address space the sending process may use: an endless response ends in MemoryError."""


class _Said(logging.Handler):
    """What apprise logs during the send (its only account of why a send failed)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def send(request: dict[str, object]) -> dict[str, object]:
    import apprise

    said = _Said()
    apprise_log = logging.getLogger("apprise")
    apprise_log.propagate = False
    apprise_log.addHandler(said)
    plugin = apprise.Apprise.instantiate(str(request["url"]))
    if plugin is None:
        why = "; ".join(said.lines) or "check its scheme and fields"
        return {"ok": False, "said": [f"not a URL apprise can use ({why})"]}
    timeout = float(request["timeout_s"])  # type: ignore[arg-type]
    plugin.socket_connect_timeout = plugin.socket_read_timeout = timeout
    # timeout_s bounds the whole send, not each read: an endpoint that answers a byte at a
    # time is cut off here (the daemon kills this process later still, as a last resort).
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        ok = bool(plugin.notify(body=str(request["body"]), title=str(request["title"])))
    except SendTimeout:
        return {"ok": False, "said": [f"no answer within timeout_s = {timeout:g} s"]}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return {"ok": ok, "said": said.lines}


class SendTimeout(Exception):
    """timeout_s passed during the send."""


def _out_of_time(*_: object) -> None:
    raise SendTimeout


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    request = orjson.loads(sys.stdin.buffer.read())
    try:
        result = send(request)
    except MemoryError:
        result = {"ok": False, "said": ["the endpoint's response outgrew the memory allowed"]}
    except Exception as exc:  # a plugin's bug: said as the send's failure
        result = {"ok": False, "said": [f"{type(exc).__name__}: {exc}"]}
    sys.stdout.write(RESULT + orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
