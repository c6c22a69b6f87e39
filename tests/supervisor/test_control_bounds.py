"""The control socket's bounds: clients that do not read, pipeline, flood or overstay are
dropped or refused without costing the daemon memory or the owner its `status`, and no
reply the daemon may send is too long for the project's own clients."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import psutil
import pytest

from tests.support import (
    PYTHON,
    DaemonProcess,
    checkpoints,
    journal,
    running_daemon,
    scripted_run,
    wait_for,
)
from tests.support.clients import Crowd
from trainwarden.supervisor.errors import CommandRefused, ProtocolError
from trainwarden.supervisor.protocol import (
    HISTORY_MAX_POINTS,
    MAX_LINE,
    RUN_NAME_MAX,
    SIDECAR_MAX_BYTES,
    AsyncClient,
    Client,
    bounded_sidecar,
    encode,
)
from trainwarden.supervisor.serve import connection, queues, turns
from trainwarden.supervisor.serve.control import ControlServer

pytestmark = pytest.mark.timeout(300)

LONG_RUN = ("--steps", "100000000", "--dt", "0.05", "--save-every", "20")


def scripted_daemon_run(run_dir: Path, **control: Any) -> Path:
    return scripted_run(run_dir, *LONG_RUN, control=control, telemetry={"sample_interval_s": 0.5})


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    run_dir = scripted_daemon_run(tmp_path_factory.mktemp("bounds") / "run", slow_client_s=3.0)
    with running_daemon(run_dir) as d:
        d.wait_state("running", timeout=60)
        yield d


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


def timed_status(daemon: DaemonProcess) -> float:
    t0 = time.monotonic()
    assert daemon.request("status", timeout=30)["state"] == "running"
    return time.monotonic() - t0


# ------------------------------------------------------------------ in process


def test_the_owner_has_slots_that_other_users_cannot_take():
    from trainwarden.supervisor.serve.connection import admission

    owner, other = 1000, 1001
    allowed = {owner, other}
    strangers: list[int | None] = [other] * 4
    assert admission(other, owner, allowed, strangers, 4) is not None
    assert admission(other, owner, allowed, strangers, 4)[0] == "busy"  # type: ignore[index]
    assert admission(owner, owner, allowed, strangers, 4) is None
    owners: list[int | None] = [owner] * 4
    refusal = admission(owner, owner, allowed, owners, 4)
    assert refusal is not None and refusal[0] == "busy" and "max_clients = 4" in refusal[1]
    assert admission(other, owner, allowed, owners, 4) is None
    assert admission(1002, owner, allowed, [], 4)[0] == "forbidden"  # type: ignore[index]


def fake_daemon(name: str = "run", status_view: Any = None, journal: Path | None = None) -> Any:
    async def history_query(start: int | None, end: int | None, points: int) -> dict[str, Any]:
        widest = -2.2250738585072014e-308
        return {
            "step": [2**31 - 1] * points,
            "min": [widest] * points,
            "mean": [widest] * points,
            "max": [widest] * points,
            "nonfinite": [2**31 - 1] * points,
            "first_step": 0,
            "last_step": 2**31 - 1,
            "count": 2**31 - 1,
            "markers": [],
            "collapse_loss": None,
        }

    cfg = SimpleNamespace(
        socket_path=Path("/nonexistent/control.sock"),
        control=SimpleNamespace(allow_uids=[], max_clients=64, slow_client_s=10.0),
        run=SimpleNamespace(name=name),
        run_dir=Path("/nonexistent"),
        log_path=Path("/nonexistent/training.log"),
    )
    return SimpleNamespace(
        cfg=cfg,
        journal=None,
        history_query=history_query,
        status_view=status_view or (lambda: {"run": name, "state": "running"}),
        files=SimpleNamespace(journal=journal or Path("/nonexistent/journal.jsonl")),
    )


async def test_an_events_reply_of_many_records_fits_one_line(tmp_path: Path):
    """`events n=100000` over a journal of megabytes: the newest records that fit half a
    line, oldest first, marked truncated (before: a reply no client could read)."""
    journal = tmp_path / "journal.jsonl"
    records = [{"kind": "log", "seq": i, "text": "x" * 200} for i in range(20_000)]
    journal.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    server = ControlServer(fake_daemon(journal=journal))
    result = await server.reads.cmd_events(None, {"n": 100_000})  # type: ignore[arg-type]
    assert result["truncated"] is True
    events = result["events"]
    assert events[-1]["seq"] == 19_999 and len(events) > 1000
    assert [e["seq"] for e in events] == list(range(20_000 - len(events), 20_000))
    assert len(encode({"id": 1, "ok": True, "result": result})) <= MAX_LINE
    small = await server.reads.cmd_events(None, {"n": 10})  # type: ignore[arg-type]
    assert [e["seq"] for e in small["events"]] == list(range(19_990, 20_000))
    assert "truncated" not in small


class PerPass:
    """How often `count()` is called between two passes of the loop: a tick rescheduled
    with call_soon runs once per pass (so one figure spans the end of a pass and the
    start of the next)."""

    def __init__(self) -> None:
        self.figures = [0]
        self.handle: asyncio.Handle | None = None

    def start(self) -> None:
        self.figures.append(0)
        self.handle = asyncio.get_running_loop().call_soon(self.start)

    def stop(self) -> None:
        assert self.handle is not None
        self.handle.cancel()

    def count(self) -> None:
        self.figures[-1] += 1

    @property
    def total(self) -> int:
        return sum(self.figures)


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:  # a Unix socket path is short
        yield Path(folder) / "s"


async def ask_at_once(path: Path, cmd: bytes, n: int, replies: list[Any]) -> None:
    """One client that sends `n` requests at once, then reads every reply."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"".join(b'{"id": %d, "cmd": "%s"}\n' % (i, cmd) for i in range(n)))
    await writer.drain()
    for _ in range(n):
        replies.append(orjson.loads(await reader.readline()))
    writer.close()


def costly_status(monkeypatch: pytest.MonkeyPatch, calls: PerPass) -> Any:
    """A status view that takes half a slice of the control server's clock."""
    now = [0.0]
    monkeypatch.setattr(turns, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def status_view() -> dict[str, Any]:
        now[0] += turns.SLICE_S / 2
        calls.count()
        return {"state": "running"}

    return status_view


async def test_the_answers_given_in_one_pass_of_the_loop_fit_its_slice(
    monkeypatch: pytest.MonkeyPatch, socket_path: Path
):
    calls = PerPass()
    server = ControlServer(fake_daemon(status_view=costly_status(monkeypatch, calls)))
    listening = await connection.serve_unix(server._serve, str(socket_path))
    replies: list[Any] = []
    calls.start()
    try:
        clients = [ask_at_once(socket_path, b"status", 5, replies) for _ in range(20)]
        await asyncio.wait_for(asyncio.gather(*clients), 60)
    finally:
        calls.stop()
        listening.close()
    assert len(replies) == 100 and all(reply["ok"] for reply in replies)
    # Two answers fit a slice; a figure spans parts of two passes (and a little slack).
    print(f"status answers per pass of the loop: at most {max(calls.figures)}")
    assert max(calls.figures) <= 6


async def test_a_clients_first_request_does_not_wait_behind_other_clients_pipelines(
    monkeypatch: pytest.MonkeyPatch, socket_path: Path
):
    calls = PerPass()
    server = ControlServer(fake_daemon(status_view=costly_status(monkeypatch, calls)))
    server.daemon.cfg.control.max_clients = 256
    hello = server.reads.cmd_hello
    answered_after: list[int] = []

    def counted_hello(conn: Any, args: dict[str, Any]) -> Any:
        answered_after.append(calls.total)
        return hello(conn, args)

    server.reads.cmd_hello = counted_hello  # type: ignore[method-assign]
    listening = await connection.serve_unix(server._serve, str(socket_path))
    replies: list[Any] = []
    calls.start()
    try:
        pipelines = [
            asyncio.ensure_future(ask_at_once(socket_path, b"status", 10, replies))
            for _ in range(100)
        ]
        while calls.total < 200:  # every pipeline is queued for its next turn
            await asyncio.sleep(0)
        asked_after = calls.total
        newcomer: list[Any] = []
        await asyncio.wait_for(ask_at_once(socket_path, b"hello", 1, newcomer), 60)
        await asyncio.wait_for(asyncio.gather(*pipelines), 60)
    finally:
        calls.stop()
        listening.close()
    assert newcomer[0]["ok"] and len(replies) == 100 * 10
    waited = answered_after[0] - asked_after
    print(f"status answers given between the newcomer's hello and its answer: {waited}")
    # Behind the 100 pipelines' next requests, it would wait for at least 100 answers.
    assert waited < 50


async def test_a_burst_of_connections_is_taken_in_a_batch_per_pass_and_none_refused(
    socket_path: Path,
):
    accepted = PerPass()
    server = ControlServer(fake_daemon())

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.count()
        await server._serve(reader, writer)

    listening = await connection.serve_unix(counted, str(socket_path))
    clients, refused = [], 0
    for _ in range(100):  # all queued before the loop runs once more
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            client.connect(str(socket_path))
        except BlockingIOError:
            refused += 1
        clients.append(client)
    accepted.start()
    try:
        for _ in range(10_000):
            if accepted.total >= 100 - refused:
                break
            await asyncio.sleep(0)
    finally:
        accepted.stop()
        for client in clients:
            client.close()
        listening.close()
    print(f"connections taken in per pass of the loop: at most {max(accepted.figures)}")
    assert refused == 0
    assert accepted.total == 100
    assert max(accepted.figures) <= 2 * connection.ACCEPT_BATCH


def test_a_push_is_encoded_once_for_all_its_subscribers(monkeypatch: pytest.MonkeyPatch):
    server = ControlServer(fake_daemon())
    encoded: list[Any] = []
    real_encode = queues.encode
    monkeypatch.setattr(queues, "encode", lambda m: encoded.append(m) or real_encode(m))
    subscribers = []
    for _ in range(10):
        conn = connection.Connection(SimpleNamespace(transport=None), os.getuid())  # type: ignore[arg-type]
        conn.topics = {"telemetry", "events"}
        subscribers.append(conn)
    server.connections = set(subscribers)
    server.publish("telemetry", {"step": 7})
    server.publish("events", {"kind": "spawn"})
    lines = [[conn.outbox.pop(), conn.outbox.pop()] for conn in subscribers]
    assert len(encoded) == 2
    assert all(pair == lines[0] for pair in lines)
    assert sorted(orjson.loads(line)["topic"] for line in lines[0]) == ["events", "telemetry"]


async def test_a_history_reply_of_the_widest_buckets_fits_one_line():
    server = ControlServer(fake_daemon())
    result = await server.reads.cmd_history(None, {"points": 100_000})  # type: ignore[arg-type]
    assert len(result["step"]) == HISTORY_MAX_POINTS
    line = encode({"id": 123456789, "ok": True, "result": result})
    print(f"widest history reply: {len(line)} bytes for {HISTORY_MAX_POINTS} buckets")
    assert len(line) <= MAX_LINE // 2 + 1000


def test_a_five_megabyte_run_name_is_clipped_in_replies():
    server = ControlServer(fake_daemon("x" * 5_000_000))
    for result in (
        server.reads.cmd_hello(None, {}),  # type: ignore[arg-type]
        server.reads.cmd_status(None, {}),  # type: ignore[arg-type]
    ):
        assert len(result["run"]) == RUN_NAME_MAX and result["run"].endswith("…")
        assert len(encode(result)) < 10_000


def test_a_large_sidecar_is_cut_to_its_newest_part_and_marked():
    samples = [{"step": i, "arm": f"arm{i % 3}", "text": "t" * 3000} for i in range(1000)]
    raw = orjson.dumps({"samples": samples})
    assert len(raw) > 2 * 2**20
    cut = bounded_sidecar(orjson.loads(raw), len(raw))
    assert len(encode(cut)) <= SIDECAR_MAX_BYTES
    assert cut["truncated"] is True and cut["bytes"] == len(raw)
    assert cut["samples"] and cut["samples"][-1]["step"] == 999
    assert len(cut["samples"][-1]["text"]) <= 2000
    small = {"samples": samples[:3]}
    assert bounded_sidecar(small, 100) is small


def serve_one_line(path: Path, line: bytes) -> threading.Thread:
    """A server that answers one connection's first request with `line` (any id)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\n" not in data:
                data += conn.recv(4096)
            conn.sendall(line)
            conn.recv(1)  # until the client hangs up
        listener.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def largest_legal_reply() -> tuple[bytes, int]:
    """A reply line of exactly MAX_LINE bytes (newline not counted), its result's length."""
    head = b'{"id":1,"ok":true,"result":"'
    tail = b'"}'
    width = MAX_LINE - len(head) - len(tail)
    line = head + b"x" * width + tail
    assert len(line) == MAX_LINE
    return line + b"\n", width


def test_both_clients_read_the_largest_line_the_daemon_may_send(tmp_path: Path):
    line, width = largest_legal_reply()
    serve_one_line(tmp_path / "a.sock", line)
    with Client(tmp_path / "a.sock", timeout=10) as client:
        assert len(client.request("hello")) == width

    serve_one_line(tmp_path / "b.sock", line)

    async def ask() -> Any:
        client = AsyncClient(tmp_path / "b.sock")
        await client.connect()
        try:
            return await client.request("hello", timeout=10)
        finally:
            await client.close()

    assert len(asyncio.run(ask())) == width


# ------------------------------------------------------------------ a live daemon


def test_a_client_that_does_not_read_is_dropped_and_journaled(daemon: DaemonProcess):
    crowd = Crowd(daemon.socket, ["pipelining"]).start()
    try:
        dropped = wait_for(
            lambda: [r for r in journal(daemon.run_dir) if r["kind"] == "client_dropped"],
            30,
            0.2,
            what="a client_dropped record",
        )
    finally:
        crowd.close()
    record = dropped[0]
    assert record["uid"] == os.getuid() and record["reason"] == "slow"
    assert record["queued_bytes"] > 0
    assert timed_status(daemon) < 10


def test_memory_returns_near_its_baseline_after_a_flood(daemon: DaemonProcess):
    pid = daemon.proc.pid  # type: ignore[union-attr]
    # The baseline of a daemon that has settled: checkpoints verified, sidecars read.
    wait_for(lambda: len(checkpoints(daemon.run_dir)) >= 2, 60, 0.2, what="two checkpoints")
    time.sleep(3)
    baseline = rss_mb(pid)
    kinds = ["pipelining"] * 20 + ["never_reading"] * 10 + ["big_lines"] * 6 + ["slow_reading"] * 4
    crowd = Crowd(daemon.socket, kinds).start()
    peak, slowest = baseline, 0.0
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            peak = max(peak, rss_mb(pid))
            slowest = max(slowest, timed_status(daemon))
            time.sleep(0.2)
    finally:
        crowd.close()
    time.sleep(5)  # dropped and closed connections are gone; what they held is freed
    after = rss_mb(pid)
    print(
        f"daemon RSS: baseline {baseline:.1f} MB, peak {peak:.1f} MB under {len(kinds)} "
        f"misbehaving clients, {after:.1f} MB after they left; slowest status {slowest:.2f} s"
    )
    assert daemon.alive
    assert peak < baseline + 150
    assert after < baseline * 1.2 + 10
    assert slowest < 10


def test_a_large_samples_file_never_breaks_a_subscribe(daemon: DaemonProcess):
    samples = [{"step": i, "arm": "a", "text": "s" * 2000} for i in range(800)]
    path = daemon.run_dir / ".samples.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps({"samples": samples}))
    os.replace(tmp, path)

    def truncated_snapshot() -> Any:
        with daemon.client(timeout=30) as client:
            snapshot = client.request("subscribe", topics=["samples", "bandit"])["snapshot"]
        return snapshot["samples"] if (snapshot["samples"] or {}).get("truncated") else None

    cut = wait_for(truncated_snapshot, 30, 0.2, what="the truncated samples")
    assert cut["samples"][-1]["step"] == 799
    assert cut["bytes"] == path.stat().st_size


def test_at_max_clients_the_owner_takes_the_place_of_its_idlest_connection(tmp_path: Path):
    """The daemon's user holds max_clients idle connections (silent scripts, a forgotten
    shell): its next `status` is answered at once in place of the idlest, which is dropped
    and journaled; one with a request being answered is never taken."""
    run_dir = scripted_daemon_run(tmp_path / "run", max_clients=3)
    with running_daemon(run_dir) as d:
        held = []
        for _ in range(3):
            client = d.client(timeout=30)
            client.request("hello")
            held.append(client)
        half = held[1]
        half.sock.sendall(b'{"id": 9, "cmd": "sta')  # half a request: still idle
        try:
            started = time.monotonic()
            cli = subprocess.run(
                [PYTHON, "-m", "trainwarden.supervisor", "status", str(run_dir)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            took = time.monotonic() - started
            assert cli.returncode == 0 and "running" in cli.stdout, cli
            print(f"status at the limit took {took:.2f} s")
            with pytest.raises((ProtocolError, OSError)):
                held[0].request("status")  # the idlest: taken
            assert held[2].request("status")["state"] == "running"
            dropped = [r for r in journal(run_dir) if r["kind"] == "client_dropped"]
            assert [r["reason"] for r in dropped] == ["evicted"]
        finally:
            for client in held:
                client.close()


async def test_a_connection_that_sends_no_whole_request_in_time_is_ended(monkeypatch):
    monkeypatch.setattr(connection, "FIRST_REQUEST_S", 0.3)
    server_side, client_side = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=server_side)
    conn = connection.Connection(writer, uid=0)
    client_side.sendall(b'{"id": 1, "cmd": "sta')  # never finished
    started = time.monotonic()
    await asyncio.wait_for(connection.read_lines(reader, conn), 5.0)
    assert conn.closed and 0.3 <= time.monotonic() - started < 3.0
    assert await conn.lines.get() is None
    client_side.close()


async def test_a_later_request_must_come_whole_soon_after_its_first_byte(monkeypatch):
    """Silence between requests is free (a TUI idles for days); half a request is not."""
    monkeypatch.setattr(connection, "FIRST_REQUEST_S", 0.3)
    monkeypatch.setattr(connection, "LINE_S", 0.3)
    server_side, client_side = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=server_side)
    conn = connection.Connection(writer, uid=0)
    reading = asyncio.ensure_future(connection.read_lines(reader, conn))
    client_side.sendall(b'{"id": 1, "cmd": "status"}\n')
    assert await asyncio.wait_for(conn.lines.get(), 5.0) == b'{"id": 1, "cmd": "status"}\n'
    await asyncio.sleep(1.0)  # silent for three times the bound: still connected
    assert not conn.closed and not reading.done()
    client_side.sendall(b'{"id": 2, "cmd": "status"}\n')
    assert await asyncio.wait_for(conn.lines.get(), 5.0) == b'{"id": 2, "cmd": "status"}\n'
    client_side.sendall(b'{"id": 3, "cmd": "sta')  # never finished
    started = time.monotonic()
    await asyncio.wait_for(reading, 5.0)
    assert conn.closed and 0.3 <= time.monotonic() - started < 3.0
    assert await conn.lines.get() is None
    client_side.close()


async def test_a_read_request_of_a_client_that_hung_up_is_not_answered():
    server = ControlServer(fake_daemon())
    conn = connection.Connection(SimpleNamespace(transport=None), os.getuid())  # type: ignore[arg-type]
    conn.gone.set()
    assert not await server._take_turn(conn, "status", first=True)
    assert not await server._take_turn(conn, "history", first=False)
    # An acting command is still carried out (or abandoned) as the policy says.
    assert await server._take_turn(conn, "stop", first=True)


async def test_turns_past_a_slice_go_first_requests_first_then_in_order(
    monkeypatch: pytest.MonkeyPatch,
):
    now = [0.0]
    monkeypatch.setattr(turns, "time", SimpleNamespace(monotonic=lambda: now[0]))
    slices, order = turns.Turns(), []
    left = asyncio.Event()

    async def ask(name: str, moot: Any = lambda: False, first: bool = False) -> None:
        await slices.turn(moot, first)
        order.append(name)
        now[0] += turns.SLICE_S  # each answer takes a whole slice

    # All in the same pass: the first spends its slice, the others wait.
    asking = [
        asyncio.ensure_future(ask("spender")),
        asyncio.ensure_future(ask("pipelined-1")),
        asyncio.ensure_future(ask("gone", left.is_set)),
        asyncio.ensure_future(ask("pipelined-2")),
        asyncio.ensure_future(ask("first", first=True)),
    ]
    left.set()
    await asyncio.wait_for(asyncio.gather(*asking), 10)
    assert order == ["spender", "first", "pipelined-1", "gone", "pipelined-2"]


async def test_a_read_request_is_not_answered_once_its_client_closed_before_we_noticed():
    server = ControlServer(fake_daemon())
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    _reader, writer = await asyncio.open_unix_connection(sock=ours)
    conn = connection.Connection(writer, os.getuid())
    try:
        assert await server._take_turn(conn, "status", first=True)
        theirs.close()  # the reader task has not seen the end: only the socket says so
        assert not conn.gone.is_set()
        assert not await server._take_turn(conn, "status", first=False)
    finally:
        writer.close()


def test_a_flood_of_history_of_reads_is_bounded_and_the_owners_history_goes_first(
    tmp_path: Path,
):
    """Twelve clients at once ask for a large sibling's history: one is read at a time in
    a thread of its own, four may wait, the rest are refused `busy` in one line; the
    daemon's own `history` is answered meanwhile from its own thread."""
    from tests.support import histories

    run_dir = scripted_daemon_run(tmp_path / "run")
    histories.make_run(tmp_path / "big", {s: 5.0 - s * 1e-6 for s in range(1, 400_001)})
    with running_daemon(run_dir) as d:
        d.wait_state("running", timeout=60)
        results: list[Any] = []
        start = threading.Barrier(12)

        def ask() -> None:
            with d.client(timeout=120) as client:
                start.wait()
                try:
                    results.append(client.request("history_of", run="big", points=50))
                except CommandRefused as exc:
                    results.append(exc)

        askers = [threading.Thread(target=ask) for _ in range(12)]
        for t in askers:
            t.start()
        own = d.request("history", points=50)
        for t in askers:
            t.join(120)
    assert own["step"], own
    refused = [r for r in results if isinstance(r, CommandRefused)]
    answered = [r for r in results if not isinstance(r, CommandRefused)]
    assert len(results) == 12 and answered and refused, results
    assert all(r.code == "busy" and "\n" not in str(r) for r in refused)
    assert all(a["step"] == answered[0]["step"] for a in answered)  # the cache's copy too
