"""What a hostile alert target costs the daemon: its memory while an endpoint streams an
endless response and while the alert command writes 1.2 GB, and how long a send to an
endpoint that answers a byte every 2 s takes.

Each is the daemon's own sending code (shell.alerts.Sender) run in this process, its RSS
sampled every 5 ms during the send: a URL's send runs in a process of its own, the
command's output is cut to its last 4 KiB, and every try ends at `timeout_s` with its
process group.
"""

from __future__ import annotations

import contextlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from bench.common import Context, Section, Target
from tests.support import make_run
from trainwarden.supervisor.config import load_config
from trainwarden.supervisor.core.alerts import Alert
from trainwarden.supervisor.shell.alerts import Outcome, Sender

TITLE = "15. Hostile alert targets: the daemon's memory and time"
ALERT = Alert("test", "test", "t", "h", "d", None, 0.0)


class Endpoint:
    """A loopback endpoint that, after the request, streams for ever (`flood`) or sends a
    byte every 2 s (`trickle`)."""

    def __init__(self, how: str) -> None:
        stop = self.stop = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.end_headers()
                chunk = b"x" * (1 << 16) if how == "flood" else b" "
                with contextlib.suppress(OSError):
                    while not stop.is_set():
                        self.wfile.write(chunk)
                        if how == "trickle":
                            stop.wait(2.0)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def send(run_dir: Path, **alerts: Any) -> tuple[Outcome, float, float]:
    """(the outcome, the peak RSS growth in MB, the seconds) of one send."""
    make_run(run_dir, ["true"], alerts={"retries": 0, **alerts})
    sender = Sender(load_config(run_dir, check_plugins=False))
    me = psutil.Process()
    before = peak = me.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, me.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    try:
        (outcome,) = sender.deliver(ALERT)
    finally:
        done.set()
        sampler.join()
    return outcome, (peak - before) / 2**20, time.monotonic() - started


def run(ctx: Context) -> Section:
    base = ctx.work.dir("alert_bounds")
    rows, raw, targets = [], {}, []
    flood = Endpoint("flood")
    try:
        outcome, grown, took = send(base / "flood", urls=[flood.url], timeout_s=10.0)
    finally:
        flood.close()
    rows.append(["endless response", f"{grown:.1f}", f"{took:.1f}", outcome.error or "sent"])
    raw["flood"] = [grown, took]
    targets.append(Target("daemon RSS growth < 20 MB, endless response", f"{grown:.1f} MB",
                          grown < 20))  # fmt: skip
    gigabytes = 0.2 if ctx.quick else 1.2
    loud = ["sh", "-c", f"head -c {int(gigabytes * 1e9)} /dev/zero; echo done >&2; exit 3"]
    outcome, grown, took = send(base / "loud", command=loud, timeout_s=60.0)
    rows.append([f"command writing {gigabytes:g} GB", f"{grown:.1f}", f"{took:.1f}",
                 outcome.error or "sent"])  # fmt: skip
    raw["loud"] = [grown, took]
    targets.append(Target("daemon RSS growth < 20 MB, loud command", f"{grown:.1f} MB",
                          grown < 20))  # fmt: skip
    trickle = Endpoint("trickle")
    try:
        outcome, grown, took = send(base / "trickle", urls=[trickle.url], timeout_s=5.0)
    finally:
        trickle.close()
    rows.append(["a byte every 2 s, timeout_s = 5", f"{grown:.1f}", f"{took:.1f}",
                 outcome.error or "sent"])  # fmt: skip
    raw["trickle"] = [grown, took]
    targets.append(Target("a trickling send ends within timeout_s + 2 s (its start)",
                          f"{took:.1f} s", took < 7.0))  # fmt: skip
    section = Section(
        key="alert-bounds",
        title=TITLE,
        intro=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " ").strip(),
        header=["target", "RSS growth MB", "seconds", "outcome"],
        rows=rows,
        raw=raw,
    )
    section.targets = targets
    return section
