"""Alerts sent while nobody watches: the journal observed, alerts chosen by core.alerts,
sent through apprise (one URL at a time, so each gets its own result) and `[alerts]
command`, in a worker thread that never holds the loop up.

URLs carry tokens and passwords: only their masked form (`mask_url`) is journaled or
printed, and whatever apprise or a command says back is scrubbed of them first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import re
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core import alerts as core
from trainwarden.supervisor.store.journal import Journal

QUEUE_MAX = 100
"""Alerts waiting to be sent, at most; past it the newest are dropped (and counted)."""
CLOSE_GRACE_S = 5.0
"""How long a stopping daemon waits for alerts still being sent."""
RETRY_PAUSE_S = 2.0
HOST_SHOWN = frozenset({"json", "jsons", "xml", "xmls", "form", "forms", "mailto", "mailtos"})
"""Schemes whose host is a server's name (shown masked), not a token or a topic."""
OWN_KINDS = frozenset({"alert_sent", "alert_failed"})

log = logging.getLogger("trainwarden.alerts")
_apprise_log = logging.getLogger("apprise")
_apprise_log.propagate = False  # what apprise says may hold a URL's token: never on stderr
_apprise_log.addHandler(logging.NullHandler())  # nor through logging's last-resort handler


def mask_url(url: str) -> str:
    """scheme://host/*** for a web hook, scheme://*** for the rest: never a token."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***"
    host = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    if scheme.lower() in HOST_SHOWN and host:
        return f"{scheme}://{host}/***"
    return f"{scheme}://***"


def scrub(text: str, urls: list[str]) -> str:
    """`text` with every URL, and every piece of one that its mask does not show, as ***."""
    for url in sorted(urls, key=len, reverse=True):
        text = text.replace(url, mask_url(url))
        shown = mask_url(url)
        rest = url.partition("://")[2]
        for piece in sorted(re.split(r"[/:@?&=#]+", rest), key=len, reverse=True):
            if len(piece) >= 4 and piece not in shown:
                text = text.replace(piece, "***")
    return text


@dataclass(frozen=True)
class Outcome:
    target: str
    """The masked URL, or "command"."""
    error: str | None
    """None when sent; else why not, scrubbed."""
    attempts: int = 1


class _Said(logging.Handler):
    """What apprise logs during one send (its only account of why a send failed)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def alert_payload(cfg: Config, alert: core.Alert, host: str) -> dict[str, Any]:
    """The alert as the command gets it on stdin, and the parts of its message."""
    title = f"trainwarden {cfg.run.name}: {alert.title}"
    lines = [
        f"Run: {cfg.run.name}",
        f"Host: {host}",
        f"Step: {alert.step if alert.step is not None else '-'}",
        f"What happened: {alert.happened}",
        f"What the daemon did: {alert.did}",
    ]
    if alert.frames:
        lines += ["Top frames:", *(f"  {frame}" for frame in alert.frames)]
    look = f"trainwarden tui {cfg.run_dir}"
    lines.append(f"Look: {look}")
    return {
        "event": alert.event,
        "title": title,
        "body": "\n".join(lines),
        "run": cfg.run.name,
        "host": host,
        "step": alert.step,
        "happened": alert.happened,
        "did": alert.did,
        "top_frames": list(alert.frames),
        "look": look,
        "t": alert.t,
    }


class Sender:
    """Sends one alert to every configured URL and the command; never raises."""

    def __init__(self, cfg: Config, stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.urls = list(cfg.alerts.urls)
        self.stop = stop or threading.Event()
        self.host = socket.gethostname()

    def deliver(self, alert: core.Alert) -> list[Outcome]:
        payload = alert_payload(self.cfg, alert, self.host)
        outcomes = [
            self._tried(mask_url(url), functools.partial(self._send_url, url, payload))
            for url in self.urls
        ]
        if self.cfg.alerts.command:
            outcomes.append(self._tried("command", functools.partial(self._run_command, payload)))
        return outcomes

    def _tried(self, target: str, send: Callable[[], str | None]) -> Outcome:
        attempts = 0
        error: str | None = None
        tries = self.cfg.alerts.retries + 1
        for attempts in range(1, tries + 1):
            try:
                error = send()
            except Exception as exc:  # a plugin's bug must not end the sending thread
                error = f"{type(exc).__name__}: {exc}"
            if error is None or attempts == tries or self.stop.wait(RETRY_PAUSE_S * attempts):
                break
        return Outcome(target, None if error is None else scrub(error, self.urls), attempts)

    def _send_url(self, url: str, payload: dict[str, Any]) -> str | None:
        import apprise

        said = _Said()
        _apprise_log.addHandler(said)
        try:
            plugin = apprise.Apprise.instantiate(url)
            if plugin is None:
                why = "; ".join(said.lines) or "check its scheme and fields"
                return f"not a URL apprise can use ({why})"
            timeout = self.cfg.alerts.timeout_s
            plugin.socket_connect_timeout = plugin.socket_read_timeout = timeout
            ok = plugin.notify(body=payload["body"], title=payload["title"])
        finally:
            _apprise_log.removeHandler(said)
        if ok:
            return None
        return "; ".join(said.lines) or "apprise reported a failure"

    def _run_command(self, payload: dict[str, Any]) -> str | None:
        argv = self.cfg.alerts.command
        try:
            done = subprocess.run(
                argv,
                input=orjson.dumps(payload),
                capture_output=True,
                timeout=self.cfg.alerts.timeout_s,
                cwd=self.cfg.run_dir,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"{argv[0]} did not exit within timeout_s = {self.cfg.alerts.timeout_s:g} s"
        except OSError as exc:
            return f"cannot run {argv[0]}: {exc.strerror or exc}"
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return f"{argv[0]} exited {done.returncode}: {said[0][:200]}"
        return None


class Alerter:
    """The daemon's alerts: `observe` is a journal listener (any thread); sending and its
    journaling happen off the loop; `close` waits a little for sends in flight."""

    def __init__(
        self,
        cfg: Config,
        journal: Journal,
        loop: asyncio.AbstractEventLoop,
        last_step: Callable[[], int | None],
    ) -> None:
        self.journal = journal
        self.loop = loop
        self.last_step = last_step
        self.rules = core.AlertRules(
            on=frozenset(cfg.alerts.on),
            min_interval_s=cfg.alerts.min_interval_s,
            restarts_per_hour=cfg.alerts.restarts_per_hour,
        )
        self.watch = core.Watch()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sender = Sender(cfg, self.stop)
        self.todo: queue.Queue[core.Alert | None] = queue.Queue(QUEUE_MAX)
        self.done: deque[tuple[core.Alert, Outcome, int]] = deque()
        self.dropped = 0
        self.closed = False
        self.thread = threading.Thread(target=self._work, name="alerts", daemon=True)
        self.thread.start()
        journal.listeners.append(self.observe)

    def observe(self, record: dict[str, Any]) -> None:
        if record.get("kind") in OWN_KINDS:
            return
        with self.lock:
            try:
                self.watch, alerts = core.observe(self.watch, record, self.rules, self.last_step())
            except Exception:  # a record of a shape no alert expected: never the append's fault
                log.exception("no alert could be made of a %s record", record.get("kind"))
                return
            for alert in alerts:
                try:
                    self.todo.put_nowait(alert)
                except queue.Full:
                    self.dropped += 1

    def _work(self) -> None:
        while (alert := self.todo.get()) is not None:
            dropped, self.dropped = self.dropped, 0
            for outcome in self.sender.deliver(alert):
                self.done.append((alert, outcome, dropped))
            with contextlib.suppress(RuntimeError):  # the loop is closed: close() journals
                self.loop.call_soon_threadsafe(self._journal_done)

    def _journal_done(self) -> None:
        while self.done and not self.closed:
            alert, outcome, dropped = self.done.popleft()
            fields: dict[str, Any] = {
                "event": alert.event,
                "target": outcome.target,
                "attempts": outcome.attempts,
            }
            if dropped:
                fields["dropped_before"] = dropped
            if outcome.error is None:
                self.journal.append("alert_sent", fields)
            else:
                self.journal.append("alert_failed", {**fields, "error": outcome.error})

    def drain(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop taking alerts and wait up to `grace` s for those queued (any thread)."""
        with contextlib.suppress(ValueError):
            self.journal.listeners.remove(self.observe)
        with contextlib.suppress(queue.Full):
            self.todo.put_nowait(None)
        self.thread.join(grace)
        self.stop.set()  # a retry still waiting gives up

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """drain(grace), then journal what came of the sends; nothing is journaled after."""
        self.drain(grace)
        self._journal_done()
        self.closed = True
