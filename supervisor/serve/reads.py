"""The read commands' answers: hello, status, checkpoints, events, history, history_of,
related_runs, dump and subscribe, each `cmd_<name>(conn, args)` (a coroutine where the
answer is made off the event loop), and the errors a request's arguments get.

The control server (`control`) admits the client, gives the request its turn and sends
what these return; the acting commands go to the policy instead.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, TypeGuard, cast, get_args

from trainwarden.supervisor import PROTOCOL_VERSION, __version__
from trainwarden.supervisor.contract import MAX_STEP
from trainwarden.supervisor.protocol import (
    HISTORY_MAX_POINTS,
    MAX_LINE,
    RUN_NAME_MAX,
    TOPICS,
    CheckpointsView,
    DumpResult,
    ErrorCode,
    EventsResult,
    HelloResult,
    HistoryOfResult,
    HistoryResult,
    JournalRecord,
    ReadCommand,
    RelatedRunsResult,
    Snapshot,
    StatusResult,
    SubscribeResult,
    Topic,
    clip_text,
    encode,
)
from trainwarden.supervisor.serve.connection import Connection
from trainwarden.supervisor.serve.supervised import Supervised
from trainwarden.supervisor.store.journal import tail_records
from trainwarden.supervisor.store.runseries import NotARun, OthersBusy


class ReadCommands:
    """The answers to the read commands for `daemon`, whose user is `owner`."""

    def __init__(self, daemon: Supervised, owner: int) -> None:
        self.daemon = daemon
        self.owner = owner

    def cmd_hello(self, conn: Connection, args: dict[str, Any]) -> HelloResult:
        return {
            "protocol": PROTOCOL_VERSION,
            "version": __version__,
            "run": clip_text(self.daemon.cfg.run.name, RUN_NAME_MAX),
            "run_dir": str(self.daemon.cfg.run_dir),
            "log": str(self.daemon.cfg.log_path),
            "pid": os.getpid(),
        }

    def cmd_status(self, conn: Connection, args: dict[str, Any]) -> StatusResult:
        view = self.daemon.status_view()
        if isinstance(view.get("run"), str):
            view["run"] = clip_text(view["run"], RUN_NAME_MAX)
        return view

    def cmd_checkpoints(self, conn: Connection, args: dict[str, Any]) -> CheckpointsView:
        return self.daemon.checkpoints_view()

    async def cmd_events(self, conn: Connection, args: dict[str, Any]) -> EventsResult:
        n = _int_arg(args, "n", 50, 1, 100_000)
        # Read off the loop (up to 100,000 records), then joined on it with what a full
        # disk holds in memory.
        written = await asyncio.to_thread(tail_records, self.daemon.files.journal, n)
        journal = self.daemon.journal
        records = written if journal is None else journal.with_held(written, n)
        # The journal reads its records back as plain objects; each is a JournalRecord
        # (ts, t, kind and the kind's own fields), as the journal wrote it.
        return fit_events(cast(list[JournalRecord], records))

    async def cmd_history(self, conn: Connection, args: dict[str, Any]) -> HistoryResult:
        start = _int_arg(args, "start", None, 0, MAX_STEP)
        end = _int_arg(args, "end", None, 0, MAX_STEP)
        points = _int_arg(args, "points", 200, 1, 100_000)
        # More buckets than fit one line are not sent: the reply says how many it holds.
        return await self.daemon.history_query(start, end, min(points, HISTORY_MAX_POINTS))

    async def cmd_history_of(self, conn: Connection, args: dict[str, Any]) -> HistoryOfResult:
        run = args.get("run")
        if not isinstance(run, str) or not run or len(run) > RUN_PATH_MAX:
            raise CommandError("bad_argument", "'run' must name a run directory (a path)")
        start = _int_arg(args, "start", None, 0, MAX_STEP)
        end = _int_arg(args, "end", None, 0, MAX_STEP)
        points = _int_arg(args, "points", 200, 1, 100_000)
        # The daemon's own user and root could read any run themselves; another allowed
        # user gets only what it could (runseries.resolve_for_peer).
        trusted = conn.uid is not None and conn.uid in (self.owner, 0)
        peer = None if trusted else (conn.uid if conn.uid is not None else -1)
        try:
            return await self.daemon.history_of_query(
                run, start, end, min(points, HISTORY_MAX_POINTS), peer
            )
        except NotARun as exc:
            raise CommandError("not_a_run", str(exc)) from None
        except OthersBusy as exc:
            raise CommandError("busy", str(exc)) from None

    async def cmd_related_runs(self, conn: Connection, args: dict[str, Any]) -> RelatedRunsResult:
        try:
            return {"runs": await self.daemon.related_runs()}
        except OthersBusy as exc:
            raise CommandError("busy", str(exc)) from None

    async def cmd_dump(self, conn: Connection, args: dict[str, Any]) -> DumpResult:
        result = await self.daemon.dump_stacks()
        if result is None:
            raise CommandError("wrong_state", "no trainer is running: there are no stacks to dump")
        return result

    def cmd_subscribe(self, conn: Connection, args: dict[str, Any]) -> SubscribeResult:
        topics = args.get("topics", list(TOPICS))
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise CommandError("bad_argument", "'topics' must be a list of topic names")
        unknown = [t for t in topics if not _is_topic(t)]
        if unknown:
            raise CommandError(
                "bad_argument", f"unknown topic(s) {', '.join(unknown)}; known: {', '.join(TOPICS)}"
            )
        conn.topics.update(topics)
        # In the order asked for; a topic asked for twice is sent once, in its first place.
        snapshot: Snapshot = {}
        for topic in filter(_is_topic, topics):
            if topic == "checkpoints":
                snapshot[topic] = self.daemon.checkpoints_view()
            elif topic == "state":
                snapshot[topic] = self.daemon.state_view()
            else:
                snapshot[topic] = self.daemon.snapshot(topic)
        return {"snapshot": snapshot}


READS: tuple[str, ...] = get_args(ReadCommand)
RUN_PATH_MAX = 4096
"""Bytes of a run path history_of takes (PATH_MAX)."""


EVENTS_MAX_BYTES = MAX_LINE // 2
"""Encoded journal records one `events` reply holds at most (the newest; then truncated)."""


def _is_topic(name: str) -> TypeGuard[Topic]:
    return name in TOPICS


def fit_events(records: list[JournalRecord]) -> EventsResult:
    """The newest records that fit EVENTS_MAX_BYTES, oldest first; `truncated` if any did not."""
    kept: list[JournalRecord] = []
    size = 0
    for record in reversed(records):
        size += len(encode(record))
        if size > EVENTS_MAX_BYTES:
            return {"events": kept[::-1], "truncated": True}
        kept.append(record)
    return {"events": kept[::-1]}


class CommandError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _int_arg(
    args: dict[str, Any], name: str, default: int | None, low: int, high: int | None
) -> Any:
    value = args.get(name, default)
    if value is None:
        return None
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise CommandError("bad_argument", f"'{name}' must be an integer {bound}, got {value!r}")
    return value
