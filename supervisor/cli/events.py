"""`trainwarden events`: the journal's newest records, filtered by kind and time, from the
daemon (and followed with --follow) or, with no daemon, from the journal file itself."""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainwarden.supervisor.cli.output import print_event
from trainwarden.supervisor.cli.reach import client_for, run_config, run_dir_of
from trainwarden.supervisor.errors import DaemonNotRunning, NobodyAnswers, UsageError
from trainwarden.supervisor.journal_text import LEFT_OUT

if TYPE_CHECKING:
    from trainwarden.supervisor.protocol import EventsResult


EVENTS_ASK_MAX = 100_000
"""The most records one `events` request may ask the daemon for (its own bound)."""
EVENTS_ASK_GROWTH = 4
"""How much more an `events` request asks for when too few of the newest records match."""
SINCE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def cmd_events(args: argparse.Namespace) -> int:
    kinds = {kind for item in args.kind or [] for kind in item.split(",") if kind}
    since = since_time(args.since, time.time()) if args.since else None

    def wanted(record: dict[str, Any]) -> bool:
        kind = record.get("kind")
        if kinds and kind not in kinds:
            return False
        if not kinds and not args.json and kind in LEFT_OUT:  # the TUI's too
            return False
        return since is None or _record_time(record) >= since

    try:
        client = client_for(args, timeout=None if args.follow else 30.0)
        with client:
            records = _newest_wanted(client, args.n, wanted, since)
            for record in records:
                print_event(record, args.json)
            if not args.follow:
                return 0
            client.request("subscribe", topics=["events"])
            try:
                while True:
                    message = client.read_message()
                    if message.get("topic") == "events" and wanted(message["data"]):
                        print_event(message["data"], args.json)
            except KeyboardInterrupt:
                return 0
    except NobodyAnswers as exc:
        cfg = None if args.socket else run_config(run_dir_of(args))
        if cfg is None:
            raise
        if args.follow:
            raise DaemonNotRunning(f"--follow needs the daemon, and {exc}") from None
    # No daemon: the journal is a file, read as the daemon would have answered.
    from trainwarden.supervisor.store.journal import read_records
    from trainwarden.supervisor.store.rundir import RunFiles

    path = RunFiles(cfg.run_dir).journal
    print(f"trainwarden: no daemon answers: read from {path}", file=sys.stderr)
    for record in deque((r for r in read_records(path) if wanted(r)), maxlen=args.n):
        print_event(record, args.json)  # type: ignore[arg-type]
    return 0


def _newest_wanted(
    client: Any, n: int, wanted: Callable[[dict[str, Any]], bool], since: float | None
) -> list[Any]:
    """The daemon's newest `n` records that are wanted, oldest first: asked for n, then for
    EVENTS_ASK_GROWTH times more while too few match and older ones could."""
    ask = n
    while True:
        reply: EventsResult = client.request("events", n=ask)
        records: list[Any] = reply["events"]
        matching = [r for r in records if wanted(r)]
        done = (
            len(matching) >= n
            or len(records) < ask  # the whole journal
            or ask >= EVENTS_ASK_MAX
            or reply.get("truncated", False)
            or (since is not None and bool(records) and _record_time(records[0]) < since)
        )
        if done:
            if reply.get("truncated") and len(matching) < n:
                print(
                    f"trainwarden: only the newest {len(records)} records fit one reply"
                    f" ({len(matching)} of them shown); the whole journal is"
                    " .trainwarden/journal.jsonl, read by `trainwarden events` without a daemon",
                    file=sys.stderr,
                )
            return matching[-n:] if n else []
        ask = min(ask * EVENTS_ASK_GROWTH, EVENTS_ASK_MAX)


def _record_time(record: dict[str, Any]) -> float:
    t = record.get("t")
    return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else float("-inf")


def since_time(text: str, now: float) -> float:
    """--since as Unix time: a duration back from now (`90s`, `10m`, `2h`, `1d`, `1w`) or an
    ISO 8601 time (UTC unless it names a zone, as `events` prints times)."""
    from datetime import UTC, datetime

    number, unit = text[:-1].strip(), text[-1:].lower()
    if unit in SINCE_UNITS:
        try:
            amount = float(number)
        except ValueError:
            amount = -1.0
        if 0 <= amount < float("inf"):
            return now - amount * SINCE_UNITS[unit]
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"--since {text!r}: expected a duration such as 10m, 2h or 1d, or an ISO time"
            " such as 2024-05-01T12:00 (UTC unless a zone is given)"
        ) from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
