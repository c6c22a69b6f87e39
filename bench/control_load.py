"""NaN -> kill and the owner's `status` while 200 misbehaving clients flood the control
socket, and the daemon's memory during and after the flood.

The trainer is bench/programs/nan_trainer.py (one step per 0.1 s; NaN when told to), so
the NaN line's write time is the trainer's own and the death is seen through a pidfd, as
in the divergence section. The crowd is tests/support/clients.py's: clients that never
read, pipeline 3,000 status requests, read slowly, connect and vanish, or send 900 KB
lines. The owner's `status` is asked every 0.25 s throughout, on a fresh connection.
"""

from __future__ import annotations

import threading
import time

from bench.common import Context, DeathWatch, Section, Target, fmt_ms, latency_summary
from bench.divergence import armed_pid, nan_written_t, tell_to_diverge, trainer_argv
from bench.peers import trainwarden_config
from tests.support import poll
from tests.support.clients import CROWD, Crowd, rss_mb

TITLE = "11. Control-plane load: NaN -> kill and status under 200 misbehaving clients"


class StatusProbe:
    """The owner's `status`, every 0.25 s on its own connection, until stopped."""

    def __init__(self, ask: object) -> None:
        self.ask = ask
        self.ms: list[float] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            t0 = time.monotonic()
            try:
                self.ask("status", timeout=30)  # type: ignore[operator]
            except Exception:
                self.failed += 1
                continue
            self.ms.append((time.monotonic() - t0) * 1000)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(40)


def run(ctx: Context) -> Section:
    samples = 3 if ctx.quick else 10
    run_dir = ctx.work.dir("control_load", "trainwarden")
    events, go = run_dir / "events", run_dir / "go"
    trainwarden_config(
        run_dir,
        trainer_argv(events, go),
        restart={"backoff_initial_s": 0.0, "divergence_retries": 1_000_000},
        control={"max_clients": 256, "slow_client_s": 5.0},
    )
    daemon = ctx.work.daemon(run_dir).start()
    pid = daemon.proc.pid  # type: ignore[union-attr]
    used: set[int] = set()
    nan_ms: list[float] = []
    problems: list[str] = []
    first = poll(lambda: armed_pid(events, used), 30.0)
    time.sleep(2)
    baseline = rss_mb(pid)
    peak = baseline
    crowd = Crowd(daemon.socket, CROWD).start()
    probe = StatusProbe(daemon.request)
    try:
        trainer = first
        for index in range(samples):
            if trainer is None:
                problems.append(f"no trainer armed at sample {index}")
                break
            used.add(trainer)
            watch = DeathWatch(trainer)
            tell_to_diverge(go, trainer)
            dead_t = watch.wait(10.0)
            written_t = poll(lambda t=trainer: nan_written_t(events, t), 2.0)
            peak = max(peak, rss_mb(pid))
            if dead_t is None or written_t is None:
                problems.append(f"trainer {trainer} was not killed within 10 s")
                break
            nan_ms.append((dead_t - written_t) * 1000)
            trainer = poll(lambda: armed_pid(events, used), 30.0)
    finally:
        crowd.close()
        probe.close()
    time.sleep(5)
    after = rss_mb(pid)
    daemon.stop()
    nan = latency_summary(nan_ms)
    status = latency_summary(probe.ms)
    rows = [
        ["NaN line written -> trainer gone", str(nan["n"]), fmt_ms(nan["p50_ms"]),
         fmt_ms(nan["p99_ms"]), fmt_ms(nan["max_ms"])],
        ["owner's status, asked every 0.25 s", str(status["n"]), fmt_ms(status["p50_ms"]),
         fmt_ms(status["p99_ms"]), fmt_ms(status["max_ms"])],
    ]  # fmt: skip
    section = Section(
        key="control-load",
        title=TITLE,
        intro=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " ").strip(),
        header=["measure", "samples", "p50 ms", "p99 ms", "max ms"],
        rows=rows,
        raw={"nan": nan, "status": status, "rss_mb": [baseline, peak, after]},
    )
    section.notes.append(
        f"Daemon RSS: {baseline:.1f} MB before the crowd, {peak:.1f} MB at its peak, "
        f"{after:.1f} MB 5 s after it left; {crowd.connected} connections made, "
        f"{probe.failed} status requests failed."
    )
    section.notes.extend(problems)
    section.targets = [
        Target("NaN -> trainer killed p99 < 100 ms under 200 misbehaving clients",
               f"{fmt_ms(nan['p99_ms'])} ms", bool(nan_ms) and nan["p99_ms"] < 100),
        Target("owner's status p99 < 1 s under the same load",
               f"{fmt_ms(status['p99_ms'])} ms",
               bool(probe.ms) and status["p99_ms"] < 1000 and not probe.failed),
        Target("daemon RSS < 200 MB under the load", f"{peak:.0f} MB", peak < 200),
        Target("daemon RSS back within 20 % of its baseline after the clients leave",
               f"{after:.1f} vs {baseline:.1f} MB", after <= baseline * 1.2),
    ]  # fmt: skip
    return section
