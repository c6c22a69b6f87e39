"""Alerts: which journal records call for one (core.alerts), and real daemons sending them
through apprise's json:// to a loopback HTTP server, with the URLs' secrets kept out of
every file and log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from tests.support import (
    PYTHON,
    journal,
    make_run,
    pid_alive,
    running_daemon,
    scripted_run,
    wait_for,
)
from trainwarden.supervisor.config import load_config
from trainwarden.supervisor.core.alerts import Alert, AlertRules, Watch, observe
from trainwarden.supervisor.shell.alerts import Alerter, Sender, mask_url, scrub
from trainwarden.supervisor.store.journal import Journal, read_records

pytestmark = pytest.mark.timeout(180)

SECRET = "s3cr3tPassw0rd"
TOKEN = "tok9f8e7d6c5b4a"


class Inbox:
    """A loopback HTTP server that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                inbox.auth.append(self.headers.get("Authorization"))
                inbox.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"json://alerts:{SECRET}@127.0.0.1:{self.port}/hook/{TOKEN}"

    def titles(self) -> list[str]:
        return [m["title"] for m in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    try:
        yield box
    finally:
        box.close()


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failing_url() -> str:
    return f"json://127.0.0.1:{closed_port()}/down/{TOKEN}"


def alerts_table(inbox: Inbox, **keys: Any) -> dict[str, Any]:
    return {"urls": [inbox.url, failing_url()], "timeout_s": 3.0, "retries": 0, **keys}


def assert_no_secret(run_dir: Path, *more: Path) -> None:
    files = [p for p in run_dir.rglob("*") if p.is_file() and not p.is_socket()]
    for path in [*files, *more]:
        if path.name == "trainwarden.toml":
            continue  # the config holds them: that is where the user put them
        data = path.read_bytes()
        for secret in (SECRET, TOKEN):
            assert secret.encode() not in data, f"{secret} in {path}"


def with_kind(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal(run_dir) if r["kind"] == kind]


# ----------------------------------------------------------------------------- the policy


def record(kind: str, t: float, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": t, **fields}


def feed(records: list[dict[str, Any]], rules: AlertRules | None = None) -> list[Any]:
    watch, sent = Watch(), []
    for r in records:
        watch, alerts = observe(watch, r, rules or AlertRules(), last_step=7)
        sent += alerts
    return sent


def test_the_same_alert_is_sent_once_per_min_interval():
    halts = [record("halt", t, state="crash_loop", restarts_without_progress=5) for t in (0, 599)]
    assert [a.event for a in feed(halts)] == ["halted"]
    later = [*halts, record("halt", 601.0, state="crash_loop")]
    assert [a.t for a in feed(later)] == [0, 601.0]
    # Another key is another alert.
    assert len(feed([*halts, record("halt", 1.0, state="diverged", step=3)])) == 2


def test_restarts_alert_past_restarts_per_hour_within_an_hour_only():
    rules = AlertRules(restarts_per_hour=3)
    spread = [record("crash", t * 1300.0, cause="exit status 1") for t in range(6)]
    assert feed(spread, rules) == []  # never more than 3 within an hour
    close = [record("crash", t * 10.0, cause="exit status 1") for t in range(50)]
    alerts = feed(close, rules)
    assert [(a.event, a.t) for a in alerts] == [("restarts", 30.0)]
    assert "4 crashes within an hour; last: exit status 1" in alerts[0].happened


def test_the_crashes_a_fast_crash_loop_folds_count_once_each():
    """A `repeated` record's counts are cumulative within its fold: each report adds only
    the crashes since the one before; a new fold starts from zero."""
    rules = AlertRules(restarts_per_hour=9, min_interval_s=0.0)
    crash = {"cause": "exit status 3", "last_line": "boom"}

    def repeated(t: float, since: float, n: int) -> dict[str, Any]:
        return record("repeated", t, since=since, counts={"crash": n}, last={"crash": crash})

    written = [record("crash", float(t), **crash) for t in range(5)]
    folded = [repeated(5.0, 4.0, 1), repeated(6.0, 4.0, 2), repeated(8.0, 4.0, 4)]
    alerts = feed([*written, *folded], rules)
    assert alerts == []  # 5 + 4 = 9: more than 9 only with the next one
    alerts = feed([*written, *folded, repeated(9.0, 4.0, 5)], rules)
    assert [a.happened for a in alerts] == ["10 crashes within an hour; last: exit status 3"]
    # Another fold (another `since`) counts its own from zero.
    alerts = feed([*written, repeated(5.0, 4.0, 2), repeated(7.0, 6.0, 2)], rules)
    assert [a.happened for a in alerts] == []
    alerts = feed([*written, repeated(5.0, 4.0, 2), repeated(7.0, 6.0, 3)], rules)
    assert [a.happened for a in alerts] == ["10 crashes within an hour; last: exit status 3"]


def test_failing_snapshots_alert_once_for_a_run_of_failures():
    failed = [
        record("snapshot_failed", float(t), fixed="ckpt.pt", error="OSError: x", first=t == 0)
        for t in range(61)
    ]
    alerts = feed(failed)
    assert [a.event for a in alerts] == ["snapshot"]
    assert "ckpt.pt could not be snapshotted: OSError: x" in alerts[0].happened


def test_an_early_finish_and_commits_without_step_lines_alert():
    records = [
        record("trainer_finished", 1.0, early=True, last_step=55, total_steps=100_000),
        record("no_step_lines", 2.0, hint="3 checkpoints committed ..."),
    ]
    alerts = feed(records)
    assert [(a.event, a.title) for a in alerts] == [
        ("finished", "finished early"),
        ("no_step_lines", "no step lines"),
    ]
    assert "exited 0 at step 55 of 100000" in alerts[0].happened


def test_on_chooses_the_events():
    records = [record("trainer_finished", 1.0), record("disk_full", 2.0, file="x", error="ENOSPC")]
    assert [a.event for a in feed(records)] == ["finished", "disk"]
    assert [a.event for a in feed(records, AlertRules(on=frozenset({"disk"})))] == ["disk"]


def test_a_hang_alert_carries_its_dumps_top_frames_or_goes_at_the_kill_without():
    dumped = feed(
        [
            record("stall", 1.0, last_step=40, silent_s=61.0),
            record(
                "hang_dump",
                2.0,
                path="RUN/.trainwarden/hangs/x.txt",
                top_frames=["stuck_in_data_loader (train.py:12)", "main (train.py:40)"],
                error=None,
            ),  # fmt: skip
            record("crash", 5.0, cause="hang"),
        ]
    )
    assert [a.event for a in dumped] == ["hang"]
    assert dumped[0].frames == ("stuck_in_data_loader (train.py:12)", "main (train.py:40)")
    assert dumped[0].step == 40 and "hangs/x.txt" in dumped[0].happened
    undumped = feed([record("stall", 1.0, last_step=40, silent_s=61.0), record("crash", 5.0)])
    assert [(a.event, a.frames, a.t) for a in undumped] == [("hang", (), 1.0)]
    # A dump asked for on demand (no stall) is no alert.
    assert feed([record("hang_dump", 1.0, path="p", top_frames=["f"])]) == []


def test_gpu_records_of_the_other_parts_make_alerts():
    alerts = feed(
        [
            record(
                "gpu_fault",
                1.0,
                gpu=0,
                xid=79,
                **{"class": "bus"},
                action="halted: reboot the machine",
                message="GPU fell off the bus",
            ),  # fmt: skip
            record("halt", 1.1, state="gpu_fault", instruction="reboot the machine"),
            record(
                "gpu_throttle", 2.0, reasons=["hw_slowdown", "thermal"], seconds=75, mfu_drop=0.3
            ),  # fmt: skip
        ]
    )
    fault, halt, throttle = alerts
    assert fault.title == "GPU 0 fault (XID 79)" and "fell off the bus" in fault.happened
    assert fault.did == "halted: reboot the machine"
    assert halt.key == "halted:gpu_fault" and "reboot the machine" in halt.did
    assert "hw_slowdown, thermal" in throttle.happened and "30%" in throttle.happened


def test_an_unclean_start_is_alerted_with_the_steps_lost():
    (alert,) = feed([record("boot_recovery", 1.0, resume_step=100, last_logged_step=130,
                            steps_lost=30)])  # fmt: skip
    assert alert.event == "unclean_start" and "30 steps" in alert.happened and alert.step == 100


def test_a_record_no_alert_expected_is_journaled_all_the_same(tmp_path: Path):
    journal_file = Journal(tmp_path / "journal.jsonl")
    loop = asyncio.new_event_loop()
    alerter = Alerter(
        load_config(make_run(tmp_path, ["true"], alerts={"urls": ["json://127.0.0.1:9/x"]})),
        journal_file, loop, lambda: None,
    )  # fmt: skip
    try:
        journal_file.append({"kind": "crash", "t": "soon"})  # the time an alert is stamped with
    finally:
        alerter.close(grace=1.0)
        loop.close()
    assert [r["kind"] for r in read_records(tmp_path / "journal.jsonl")] == ["crash"]


def test_masks_show_no_token():
    assert mask_url(f"json://u:{SECRET}@host:8080/a/{TOKEN}") == "json://host:8080/***"
    assert mask_url(f"ntfy://{TOKEN}") == "ntfy://***"
    assert mask_url(f"tgram://{TOKEN}/12345") == "tgram://***"
    url = f"json://u:{SECRET}@host/a/{TOKEN}?x=1"
    said = scrub(f"failed {url}; auth {SECRET} on /a/{TOKEN}", [url])
    assert SECRET not in said and TOKEN not in said and "host" in said


# ----------------------------------------------------------------------------- real daemons


def test_crash_loop_alerts_once_a_failing_url_is_journaled_and_no_secret_leaks(
    tmp_path: Path, inbox: Inbox
):
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "-c", "import sys; sys.exit(3)"],
        run={"name": "nightly"},
        restart={"backoff_initial_s": 0.0, "max_restarts_without_progress": 3},
        alerts=alerts_table(inbox),
    )
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("crash_loop", timeout=60)
        wait_for(lambda: with_kind(run_dir, "alert_failed"), 30, what="the failed send")
        wait_for(lambda: with_kind(run_dir, "alert_sent"), 30, what="the sent alert")
        assert daemon.status()["state"] == "crash_loop"  # still answering
        daemon.stop()
    # The sends' records come before daemon_exit: the next start is a clean one.
    assert journal(run_dir)[-1]["kind"] == "daemon_exit"
    (message,) = inbox.received
    assert message["title"] == "trainwarden nightly: halted in crash_loop"
    body = message["message"]
    for line in ("Run: nightly", f"Host: {socket.gethostname()}", "Step: -",
                 "What happened: 3 restarts without a new checkpoint; last: exit status 3",
                 "What the daemon did: halted in crash_loop",
                 f"Look: trainwarden tui {run_dir.resolve()}"):  # fmt: skip
        assert line in body, body
    assert inbox.auth[0] is not None  # the user:password reached the server, as auth
    (failed,) = with_kind(run_dir, "alert_failed")
    assert failed["target"].startswith("json://127.0.0.1:") and failed["target"].endswith("/***")
    assert failed["event"] == "halted" and failed["error"]
    (sent,) = with_kind(run_dir, "alert_sent")
    assert sent["target"] == f"json://127.0.0.1:{inbox.port}/***"
    assert_no_secret(run_dir, daemon.stderr_path)


def test_a_start_after_the_daemon_was_killed_is_alerted(tmp_path: Path, inbox: Inbox):
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "100000", "--save-every", "10", "--dt", "0.02",
        alerts=alerts_table(inbox),
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        wait_for(lambda: (daemon.status().get("step") or 0) >= 15, 60, what="step 15")
        daemon.kill()  # as a power cut would: no daemon_exit
        assert inbox.received == []
        daemon.start()
        wait_for(lambda: inbox.received, 30, what="the unclean-start alert")
        daemon.stop()
    (message,) = inbox.received
    assert message["title"] == "trainwarden run: daemon restarted after an unclean exit"
    assert "after an unclean exit (power cut or kill)" in message["message"]
    (recovery,) = with_kind(run_dir, "boot_recovery")
    assert f"Step: {recovery['resume_step']}" in message["message"]


def test_divergence_halt_and_finished_run_alert_once_each_and_the_command_gets_json(
    tmp_path: Path, inbox: Inbox
):
    diverging = scripted_run(
        tmp_path / "diverging", "--steps", "1000", "--save-every", "10", "--nan-at", "25",
        restart={"divergence_retries": 1}, alerts=alerts_table(inbox),
    )  # fmt: skip
    with running_daemon(diverging) as daemon:
        daemon.wait_state("diverged", timeout=60)
        wait_for(lambda: inbox.received, 30, what="the divergence alert")
        daemon.stop()
    assert [m["title"].split(": ", 1)[1] for m in inbox.received] == ["halted in diverged"]
    assert "Step: 25" in inbox.received[0]["message"]
    assert_no_secret(diverging, daemon.stderr_path)

    inbox.received.clear()
    got = tmp_path / "command-got.json"
    finishing = scripted_run(
        tmp_path / "finishing", "--steps", "30", "--save-every", "10",
        alerts=alerts_table(inbox, command=[
            PYTHON, "-c", f"import sys; open({str(got)!r}, 'wb').write(sys.stdin.buffer.read())"
        ]),
    )  # fmt: skip
    with running_daemon(finishing) as daemon:
        daemon.wait_state("finished", timeout=60)
        wait_for(lambda: len(with_kind(finishing, "alert_sent")) == 2, 30, what="both sends")
        daemon.stop()
    assert [m["title"] for m in inbox.received] == ["trainwarden run: finished"]
    assert "Step: 30" in inbox.received[0]["message"]
    payload = json.loads(got.read_bytes())
    assert payload["event"] == "finished" and payload["step"] == 30
    assert payload["look"] == f"trainwarden tui {finishing.resolve()}"
    targets = sorted(r["target"] for r in with_kind(finishing, "alert_sent"))
    assert targets == ["command", f"json://127.0.0.1:{inbox.port}/***"]
    assert_no_secret(finishing, daemon.stderr_path)


def test_fifty_restarts_in_a_minute_send_one_restarts_alert(tmp_path: Path, inbox: Inbox):
    run_dir = make_run(
        tmp_path / "run",
        [PYTHON, "-c", "import sys; sys.exit(1)"],
        restart={"backoff_initial_s": 0.0, "backoff_max_s": 0.0,
                 "max_restarts_without_progress": 50},
        alerts=alerts_table(inbox, restarts_per_hour=5),
    )  # fmt: skip
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("crash_loop", timeout=150)
        wait_for(lambda: len(inbox.received) >= 2, 30, what="the restarts and halt alerts")
        daemon.stop()
    # The 51st makes 50 restarts without progress; past the first 5 they are counted (repeated).
    folded = [r["cycles"] for r in with_kind(run_dir, "repeated") if not r["ongoing"]]
    assert len(with_kind(run_dir, "crash")) + sum(folded) == 51
    assert sorted(t.split(": ", 1)[1] for t in inbox.titles()) == [
        "halted in crash_loop",
        "restarting repeatedly",
    ]
    restarts = next(m for m in inbox.received if "restarting" in m["title"])
    assert "6 crashes within an hour" in restarts["message"]


def test_a_url_that_never_answers_costs_the_loop_nothing_and_gives_up_in_time(tmp_path: Path):
    silent = socket.create_server(("127.0.0.1", 0))  # accepts connections, never replies
    port = silent.getsockname()[1]
    run_dir = scripted_run(
        tmp_path / "run", "--steps", "60", "--save-every", "10", "--dt", "0.02",
        alerts={"urls": [f"json://127.0.0.1:{port}/{TOKEN}"], "timeout_s": 2.0, "retries": 1,
                "on": ["rollback", "finished", "hang", "unclean_start", "halted"]},
        restart={"stall_timeout_s": 30.0},
    )  # fmt: skip
    try:
        with running_daemon(run_dir) as daemon:
            daemon.wait_state("finished", timeout=60)
            # The send is still stuck in its worker: the daemon answers at once meanwhile.
            assert daemon.request("status", timeout=1.5)["state"] == "finished"
            (failed,) = wait_for(lambda: with_kind(run_dir, "alert_failed"), 30, what="give-up")
            daemon.stop()
    finally:
        silent.close()
    assert failed["attempts"] == 2 and failed["target"] == f"json://127.0.0.1:{port}/***"
    assert_no_secret(run_dir, daemon.stderr_path)


class Pauses(threading.Event):
    """Records the pauses between tries instead of sleeping them."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(timeout)
        return False


def test_retries_are_bounded_with_a_growing_pause_between_tries_and_none_after(tmp_path: Path):
    run_dir = make_run(tmp_path / "run", ["true"], alerts={"urls": [failing_url()], "retries": 2})
    pauses = Pauses()
    sender = Sender(load_config(run_dir, check_plugins=False), pauses)
    (outcome,) = sender.deliver(Alert("test", "test", "t", "h", "d", None, 0.0))
    assert outcome.attempts == 3 and outcome.error
    assert pauses.pauses == [2.0, 4.0]


def alert_test(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "trainwarden.supervisor", "alert-test", str(run_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_alert_test_prints_each_urls_result(tmp_path: Path, inbox: Inbox):
    down = failing_url()
    run_dir = make_run(
        tmp_path / "run", ["true"], alerts={"urls": [inbox.url, down], "retries": 0,
                                            "command": ["false"]},
    )  # fmt: skip
    done = alert_test(run_dir)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"json://127.0.0.1:{inbox.port}/***: ok"
    assert lines[1].startswith(f"{mask_url(down)}: failed: ")
    assert lines[2] == "command: failed: false exited 1: "
    assert [m["title"] for m in inbox.received] == ["trainwarden run: test alert"]
    for secret in (SECRET, TOKEN):
        assert secret not in done.stdout + done.stderr

    make_run(run_dir, ["true"], alerts={"urls": [f"tgram://{TOKEN}"], "retries": 0})
    done = alert_test(run_dir)
    assert done.returncode == 1 and done.stdout.startswith("tgram://***: failed: not a URL apprise")
    assert TOKEN not in done.stdout + done.stderr, done.stdout + done.stderr

    make_run(run_dir, ["true"], alerts={"urls": [inbox.url]})
    done = alert_test(run_dir)
    assert (done.returncode, done.stdout) == (0, f"json://127.0.0.1:{inbox.port}/***: ok\n")

    make_run(run_dir, ["true"])
    done = alert_test(run_dir)
    assert done.returncode == 2 and "[alerts] has neither urls nor command" in done.stderr


# ----------------------------------------------------------------------------- hostile targets


class Hostile:
    """A loopback HTTP endpoint that misbehaves after reading the request: `trickle` sends
    a byte every 2 s for ever; `flood` streams an endless response as fast as it can."""

    def __init__(self, how: str) -> None:
        self.stop = threading.Event()
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                chunk = b"x" * (1 << 16) if how == "flood" else b" "
                with contextlib.suppress(OSError):
                    while not hostile.stop.is_set():
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        if how == "trickle":
                            hostile.stop.wait(2.0)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/{TOKEN}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def sender_for(tmp_path: Path, **alerts: Any) -> Sender:
    run_dir = make_run(tmp_path / "run", ["true"], alerts={"retries": 0, **alerts})
    return Sender(load_config(run_dir, check_plugins=False))


TEST_ALERT = Alert("test", "test", "t", "h", "d", None, 0.0)


def delivered_with_growth(sender: Sender) -> tuple[list[Any], int]:
    """The outcomes of sending TEST_ALERT, and by how much this process's RSS rose above
    where it was, at most, while it was sent (sampled every 5 ms)."""
    me = psutil.Process()
    before = me.memory_info().rss
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, me.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        outcomes = sender.deliver(TEST_ALERT)
    finally:
        done.set()
        sampler.join()
    return outcomes, peak - before


TRICKLE_TIMEOUT_S = 8.0
"""Long enough that the good targets' own sends (each a process started beside a loaded
machine's busy loops) arrive well before it: at 4 s one took longer than 3.5 s once."""


def test_a_trickling_endpoint_is_given_up_at_timeout_s_and_delays_no_other_target(
    tmp_path: Path, inbox: Inbox
):
    """timeout_s bounds the whole send, not each read; the good URL and the command are
    sent from their own threads and arrive while the trickling one still hangs."""
    slow = Hostile("trickle")
    marker = tmp_path / "command-ran"
    run_dir = make_run(
        tmp_path / "run", ["true"],
        alerts={"urls": [slow.url, inbox.url], "timeout_s": TRICKLE_TIMEOUT_S, "retries": 0,
                "command": ["sh", "-c", f"cat > {marker}"]},
    )  # fmt: skip
    journal_file = Journal(tmp_path / "journal.jsonl")
    loop = asyncio.new_event_loop()
    alerter = Alerter(load_config(run_dir, check_plugins=False), journal_file, loop, lambda: 7)
    try:
        started = time.monotonic()
        journal_file.append({"kind": "halt", "state": "crash_loop", "reason": "exit 3"})
        deadline = TRICKLE_TIMEOUT_S - 0.5
        wait_for(lambda: inbox.received and marker.exists(), deadline, what="the good targets")
        assert time.monotonic() - started < deadline  # before the slow one's deadline
    finally:
        alerter.close(grace=TRICKLE_TIMEOUT_S + 2.0)
        slow.close()
        loop.close()
    assert "crash_loop" in orjson.loads(marker.read_bytes())["title"]
    outcomes = {r["target"]: r for r in read_records(tmp_path / "journal.jsonl") if "target" in r}
    assert outcomes[mask_url(inbox.url)]["kind"] == "alert_sent"
    assert outcomes["command"]["kind"] == "alert_sent"
    failed = outcomes[mask_url(slow.url)]
    assert failed["kind"] == "alert_failed"
    assert failed["error"] == f"no answer within timeout_s = {TRICKLE_TIMEOUT_S:g} s"


def test_an_endless_response_costs_the_daemon_no_memory(tmp_path: Path):
    flood = Hostile("flood")
    try:
        sender = sender_for(tmp_path, urls=[flood.url], timeout_s=5.0)
        (outcome,), grown = delivered_with_growth(sender)
    finally:
        flood.close()
    assert outcome.error is not None, outcome
    assert grown < 20 << 20, f"the daemon grew by {grown >> 20} MiB"


def test_a_loud_command_is_kept_to_its_tail_and_a_timed_out_one_ends_with_its_children(
    tmp_path: Path,
):
    loud = ["sh", "-c", "head -c 300000000 /dev/zero; echo the-last-word >&2; exit 3"]
    sender = sender_for(tmp_path, command=loud, timeout_s=60.0)
    (outcome,), grown = delivered_with_growth(sender)
    assert grown < 20 << 20, f"the daemon grew by {grown >> 20} MiB"
    assert outcome.error == "sh exited 3: the-last-word"

    pids = tmp_path / "pids"
    lingering = ["sh", "-c", f"sleep 900 & echo $! > {pids}; sleep 900"]
    sender = sender_for(tmp_path, command=lingering, timeout_s=1.0)
    started = time.monotonic()
    (outcome,) = sender.deliver(TEST_ALERT)
    assert time.monotonic() - started < 5.0
    assert outcome.error == "sh did not exit within timeout_s = 1 s (ended)"
    child = int(pids.read_text())
    wait_for(lambda: not pid_alive(child), 10, what="the command's child ended")
