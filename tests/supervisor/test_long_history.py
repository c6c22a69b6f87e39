"""A long run's loss history: the daemon starts over its binary cache, and answering
`history` never holds up the decision on a logged step."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson
import pytest

from tests.support import PYTHON, DaemonProcess, make_run, pid_alive, poll, running_daemon, wait_for
from tests.support.longrun import fast_trainer_argv, small_refresh_wrap
from trainwarden.supervisor.errors import ProtocolError
from trainwarden.supervisor.protocol import Client


def write_history(path: Path, steps: int, first: int = 1, seg: int = 1) -> None:
    """`steps` lines in the documented format, formatted in blocks (a fast writer)."""
    with open(path, "ab") as f:
        for lo in range(first, first + steps, 65536):
            hi = min(lo + 65536, first + steps)
            f.write(
                b"".join(
                    b'{"step":%d,"loss":%.6f,"dt":0.1,"t":%.1f,"seg":%d}\n'
                    % (s, 2.0 + 10.0 / s**0.5, 1.7e9 + s * 0.1, seg)
                    for s in range(lo, hi)
                )
            )


# Logs a step every 20 ms from argv[3]; when the file argv[2] holds its pid, it notes the
# time in argv[1] and logs a NaN, then waits to be killed.
TRAINER = """
import os, sys, time
events, go, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
pid = os.getpid()
with open(events, "a") as f:
    f.write(f"start {pid}\\n")
while True:
    try:
        told = open(go).read().strip() == str(pid)
    except OSError:
        told = False
    if told:
        with open(events, "a") as f:
            f.write(f"nan {pid} {time.monotonic()!r}\\n")
        print(f"step: {step}, loss: nan, dt: 0.02", flush=True)
        time.sleep(60)
    print(f"step: {step}, loss: 2.0, dt: 0.02", flush=True)
    step += 1
    time.sleep(0.02)
"""


def events(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text().splitlines()]
    except OSError:
        return []


def test_the_daemon_starts_over_the_cache_it_wrote(tmp_path):
    run_dir = make_run(tmp_path / "run", ["sleep", "3600"])
    history = run_dir / ".loss.json"
    write_history(history, 150_000)
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start()
        manifest = run_dir / ".trainwarden" / "loss-cache" / "manifest.json"
        cached = orjson.loads(manifest.read_bytes())
        assert cached["rows"] == 150_000 and cached["prefix_bytes"] == history.stat().st_size
        daemon.stop()
        write_history(history, 100, first=150_001, seg=2)
        daemon.start()
        result = daemon.request("history", points=10)
        assert (result["count"], result["last_step"]) == (150_100, 150_100)
        assert history.read_bytes().count(b"\n") == 150_100  # the truth is untouched
    finally:
        daemon.cleanup()


def test_heavy_history_queries_do_not_delay_a_nan_decision(tmp_path):
    steps = 2_000_000
    run_dir = tmp_path / "run"
    events_path, go = run_dir / "events", run_dir / "go"
    make_run(
        run_dir,
        [PYTHON, "-c", TRAINER, str(events_path), str(go), str(steps + 1)],
        restart={"backoff_initial_s": 0.0, "backoff_max_s": 1.0, "divergence_retries": 5},
    )
    write_history(run_dir / ".loss.json", steps)
    with running_daemon(run_dir) as daemon:
        pid = int(
            wait_for(
                lambda: next((e[1] for e in events(events_path) if e[0] == "start"), None), 60.0
            )
        )
        wait_for(lambda: daemon.request("status").get("step"), 30.0, what="a logged step")
        done = threading.Event()
        answered = []

        def hammer() -> None:
            with Client(daemon.socket, timeout=120.0) as client:
                while not done.is_set():
                    try:
                        client.request("history", points=5_000)
                    except (ProtocolError, OSError):
                        return  # the daemon is going away
                    answered.append(time.monotonic())

        hammers = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
        for thread in hammers:
            thread.start()
        try:
            wait_for(lambda: len(answered) >= 3, 120.0, what="history answers")
            tmp = go.with_name("go.tmp")
            tmp.write_text(str(pid))
            os.replace(tmp, go)
            dead = poll(lambda: not pid_alive(pid) and time.monotonic(), 30.0, 0.002)
        finally:
            done.set()
            for thread in hammers:
                thread.join(120.0)
        assert dead, "the trainer logging a NaN was not killed"
        written = float(
            next(e[2] for e in events(events_path) if e[0] == "nan" and e[1] == str(pid))
        )
        latency_ms = (dead - written) * 1000
        print(
            f"NaN -> trainer dead: {latency_ms:.0f} ms while {len(answered)} history queries were answered"
        )
        # Generous (the target is a few ms): when each query over two million steps held
        # the loop, the NaN waited 0.2 s and more.
        assert latency_ms < 100


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {key} for {pid}")


@pytest.mark.slow
def test_the_first_start_of_a_long_uncached_run_holds_one_chunk_in_memory(tmp_path):
    # A soak (three million rows parsed, about 20 s of a core): the slow tier, which
    # .ci/run runs after the README's command.
    steps = 3_000_000
    run_dir = make_run(tmp_path / "run", ["sleep", "3600"])
    write_history(run_dir / ".loss.json", steps)
    daemon = DaemonProcess(run_dir)
    try:
        daemon.start(wait=False)
        daemon.wait_ready(300.0)
        first_peak = rss_mb(daemon.pid, "VmHWM")
        assert daemon.request("history", points=10)["count"] == steps
        daemon.stop()
        daemon.start()  # over the cache the first start wrote
        baseline = rss_mb(daemon.pid)
    finally:
        daemon.cleanup()
    print(
        f"{steps:,} steps: first start's peak {first_peak:.0f} MB, RSS over the cache {baseline:.0f} MB"
    )
    # Holding every row at once is 40 bytes a step (120 MB here) before the parse's own
    # temporaries; a chunk at a time is a small fraction of that.
    assert first_peak - baseline < 20 * steps / 2**20


@pytest.mark.slow
def test_a_long_lived_daemon_keeps_its_memory_flat_while_steps_are_logged(tmp_path):
    # A soak (a million lines parsed, about a minute of a core): the slow tier, which
    # .ci/run runs after the README's command.
    steps, refresh = 1_000_000, 100_000
    run_dir = make_run(tmp_path / "run", fast_trainer_argv(steps))
    daemon = DaemonProcess(run_dir, wrap=small_refresh_wrap(refresh))
    try:
        daemon.start()

        def logged(n: int) -> bool:
            return (daemon.request("status", timeout=120.0).get("step") or 0) >= n

        figures = []
        for n in (steps // 4, steps // 2, steps):
            wait_for(lambda n=n: logged(n), 600.0, interval=0.2, what=f"{n} steps logged")
            figures.append((n, rss_mb(daemon.pid)))
        result = daemon.request("history", points=10)
        assert (result["count"], result["last_step"]) == (steps, steps)
    finally:
        daemon.cleanup()
    print("RSS while logging: " + ", ".join(f"{n:,} steps {mb:.0f} MB" for n, mb in figures))
    grown = figures[-1][1] - figures[0][1]
    # Rows kept in memory are 40 bytes a step: 30 MB from the first figure to the last.
    assert grown < 20 * (steps - steps // 4) / 2**20
