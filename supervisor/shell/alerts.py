"""Alerts sent while nobody watches: the journal observed, alerts chosen by core.alerts,
sent to each apprise URL and to `[alerts] command` from a thread per target that never
holds the loop up (nor the other targets). Each try runs as a helper process
(shell.helpers): a URL's send in a process of its own (shell.alert_send), the command as
itself; each ends, with its whole process group, at `timeout_s`, and only the tail of what
it prints is kept.

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
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core import alerts as core
from trainwarden.supervisor.shell.alert_send import RESULT, STARTUP_S
from trainwarden.supervisor.shell.helpers import KEEP_BYTES, Ran, run_helper
from trainwarden.supervisor.store.journal import Journal

if TYPE_CHECKING:  # the classes are for the checker: the daemon never builds them
    from trainwarden.supervisor.core.records import AlertFacts

QUEUE_MAX = 100
"""Alerts waiting to be sent to one target, at most; past it the newest are dropped (and
counted)."""
SEND_KEEP_BYTES = 16384
"""Of a URL send's output, the tail kept: its result line and what apprise said."""
CLOSE_GRACE_S = 5.0
"""How long a stopping daemon waits for alerts still being sent."""
RETRY_PAUSE_S = 2.0
HELPER_END_S = 0.5
"""After the grace, how long a closing daemon waits for each target's helper to be ended."""
HOST_SHOWN = frozenset({"json", "jsons", "xml", "xmls", "form", "forms", "mailto", "mailtos"})
"""Schemes whose host is a server's name (shown masked), not a token or a topic."""
OWN_KINDS = frozenset({"alert_sent", "alert_failed"})

log = logging.getLogger("trainwarden.alerts")


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
    """Sends an alert to one target (a URL, or the command) within a total deadline per
    try, in a process group of its own killed at that deadline; never raises."""

    def __init__(self, cfg: Config, stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.urls = list(cfg.alerts.urls)
        self.stop = stop or threading.Event()
        self.host = socket.gethostname()

    def targets(self) -> list[tuple[str, Callable[[dict[str, Any]], str | None]]]:
        """(masked name, send) for each configured URL and the command."""
        targets: list[tuple[str, Callable[[dict[str, Any]], str | None]]] = [
            (mask_url(url), functools.partial(self._send_url, url)) for url in self.urls
        ]
        if self.cfg.alerts.command:
            targets.append(("command", self._run_command))
        return targets

    def deliver(self, alert: core.Alert) -> list[Outcome]:
        """To every target, one after the other (`alert-test`; the daemon sends to each
        target from its own thread)."""
        payload = alert_payload(self.cfg, alert, self.host)
        return [self.tried(name, send, payload) for name, send in self.targets()]

    def tried(
        self, target: str, send: Callable[[dict[str, Any]], str | None], payload: dict[str, Any]
    ) -> Outcome:
        attempts = 0
        error: str | None = None
        tries = self.cfg.alerts.retries + 1
        for attempts in range(1, tries + 1):
            try:
                error = send(payload)
            except Exception as exc:  # a bug of ours must not end the sending thread
                error = f"{type(exc).__name__}: {exc}"
            if error is None or attempts == tries or self.stop.wait(RETRY_PAUSE_S * attempts):
                break
        return Outcome(target, None if error is None else scrub(error, self.urls), attempts)

    def _helper(
        self,
        argv: list[str],
        data: bytes,
        keep: int,
        with_stdout: bool,
        late: str,
        allowance: float = 0.0,
    ) -> Ran | str:
        """The helper's run, or why it did not finish within timeout_s (+ `allowance`):
        `late` then, followed by the time allowed."""
        timeout = self.cfg.alerts.timeout_s
        try:
            ran = run_helper(
                argv, deadline_s=timeout + allowance, stdin=data, cwd=self.cfg.run_dir,
                keep=keep, with_stdout=with_stdout, stop=self.stop,
            )  # fmt: skip
        except OSError as exc:
            return f"cannot run {argv[0]}: {exc.strerror or exc}"
        if ran.returncode is None:
            more = f" and {allowance:g} s to start" if allowance else ""
            return f"{late} within timeout_s = {timeout:g} s{more} (ended)"
        return ran

    def _send_url(self, url: str, payload: dict[str, Any]) -> str | None:
        request = {
            "url": url,
            "title": payload["title"],
            "body": payload["body"],
            "timeout_s": self.cfg.alerts.timeout_s,
        }
        argv = [sys.executable, "-m", "trainwarden.supervisor.shell.alert_send"]
        # The send's own timer starts once it is ready to send (its interpreter and apprise
        # loaded: seconds on a busy machine); the process is ended STARTUP_S after that.
        ran = self._helper(
            argv, orjson.dumps(request), SEND_KEEP_BYTES, True, "no answer", allowance=STARTUP_S
        )
        if isinstance(ran, str):
            return ran
        lines = ran.tail.decode(errors="replace").splitlines()
        said = next((line for line in reversed(lines) if line.startswith(RESULT)), None)
        if said is None:
            last = next((line for line in reversed(lines) if line.strip()), "")
            return f"the send ended without a result (exit {ran.returncode}): {last[:200]}"
        result = orjson.loads(said.removeprefix(RESULT))
        if result["ok"]:
            return None
        return "; ".join(result["said"]) or "apprise reported a failure"

    def _run_command(self, payload: dict[str, Any]) -> str | None:
        argv = self.cfg.alerts.command
        ran = self._helper(
            argv, orjson.dumps(payload), KEEP_BYTES, False, f"{argv[0]} did not exit"
        )
        if isinstance(ran, str):
            return ran
        if ran.returncode != 0:
            said = ran.tail.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return f"{argv[0]} exited {ran.returncode}: {said[0][:200]}"
        return None


class Lane:
    """One target's queue and the thread that sends to it: a target that is slow or down
    delays only its own alerts."""

    def __init__(
        self, target: str, send: Callable[[dict[str, Any]], str | None], work: Callable[..., None]
    ) -> None:
        self.target = target
        self.send = send
        self.todo: queue.Queue[core.Alert | None] = queue.Queue(QUEUE_MAX)
        self.dropped = 0
        self.thread = threading.Thread(target=work, args=(self,), name="alerts", daemon=True)


class Alerter:
    """The daemon's alerts: `observe` is a journal listener (any thread); each target is
    sent to from its own thread (Lane), its outcomes journaled on the loop; `close` waits a
    little for sends in flight."""

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
        self.done: deque[tuple[core.Alert, Outcome, int]] = deque()
        self.closed = False
        self.lanes = [Lane(name, send, self._work) for name, send in self.sender.targets()]
        for lane in self.lanes:
            lane.thread.start()
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
                for lane in self.lanes:
                    try:
                        lane.todo.put_nowait(alert)
                    except queue.Full:
                        lane.dropped += 1

    def _work(self, lane: Lane) -> None:
        while (alert := lane.todo.get()) is not None:
            with self.lock:
                dropped, lane.dropped = lane.dropped, 0
            payload = alert_payload(self.sender.cfg, alert, self.sender.host)
            outcome = self.sender.tried(lane.target, lane.send, payload)
            self.done.append((alert, outcome, dropped))
            with contextlib.suppress(RuntimeError):  # the loop is closed: close() journals
                self.loop.call_soon_threadsafe(self._journal_done)

    def _journal_done(self) -> None:
        while self.done and not self.closed:
            alert, outcome, dropped = self.done.popleft()
            fields: AlertFacts = {
                "event": alert.event,
                "target": outcome.target,
                "attempts": outcome.attempts,
            }
            if dropped:
                fields["dropped_before"] = dropped
            if outcome.error is None:
                self.journal.append({"kind": "alert_sent", **fields})
            else:
                self.journal.append({"kind": "alert_failed", **fields, "error": outcome.error})

    def drain(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop taking alerts and wait up to `grace` s for those queued (any thread)."""
        with contextlib.suppress(ValueError):
            self.journal.listeners.remove(self.observe)
        for lane in self.lanes:
            with contextlib.suppress(queue.Full):
                lane.todo.put_nowait(None)
        deadline = time.monotonic() + grace
        for lane in self.lanes:
            lane.thread.join(max(0.0, deadline - time.monotonic()))
        self.stop.set()  # a retry still waiting gives up, a helper still running is ended
        for lane in self.lanes:
            lane.thread.join(HELPER_END_S)

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """drain(grace), then journal what came of the sends; nothing is journaled after."""
        self.drain(grace)
        self._journal_done()
        self.closed = True
