"""NaN -> kill and the owner's `history` while 48 clients ask for a large sibling run's
history (`history_of`) and `related_runs` over and over.

The trainer is bench/programs/nan_trainer.py, as in the divergence section. The sibling
holds 1,000,000 logged steps (200,000 with --quick). Each of the 48 clients asks again as
soon as it has its answer or its `busy` refusal; the owner asks for its own run's
`history` every 0.25 s on a fresh connection.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.common import Context, DeathWatch, Section, Target, fmt_ms, latency_summary
from bench.control_load import StatusProbe
from bench.divergence import armed_pid, nan_written_t, tell_to_diverge, trainer_argv
from bench.peers import trainwarden_config
from tests.support import histories, poll
from trainwarden.supervisor.errors import CommandRefused
from trainwarden.supervisor.protocol import Client

TITLE = "14. NaN -> kill and the owner's history under a flood of history_of"
ASKERS = 48


class Askers:
    """ASKERS clients asking for `run`'s history (every eighth: related_runs) until closed."""

    def __init__(self, socket: Any, run: str) -> None:
        self.socket, self.run = socket, run
        self.answered = self.refused = self.failed = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._ask, args=(i,)) for i in range(ASKERS)]
        for thread in self.threads:
            thread.start()

    def _ask(self, index: int) -> None:
        while not self.stop.is_set():
            try:
                with Client(self.socket, timeout=60) as client:
                    if index % 8 == 0:
                        client.request("related_runs")
                    else:
                        client.request("history_of", run=self.run, points=200)
                outcome = "answered"
            except CommandRefused:
                outcome = "refused"
            except Exception:
                outcome = "failed"
                self.stop.wait(0.1)
            with self.lock:
                setattr(self, outcome, getattr(self, outcome) + 1)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def run(ctx: Context) -> Section:
    samples = 3 if ctx.quick else 10
    base = ctx.work.dir("history_of_load", "runs")
    run_dir = base / "trainwarden"
    run_dir.mkdir(parents=True, exist_ok=True)
    steps = 200_000 if ctx.quick else 1_000_000
    histories.make_run(base / "big", {s: 5.0 - s * 1e-7 for s in range(1, steps + 1)})
    events, go = run_dir / "events", run_dir / "go"
    trainwarden_config(
        run_dir,
        trainer_argv(events, go),
        restart={"backoff_initial_s": 0.0, "divergence_retries": 1_000_000},
        control={"max_clients": 256},
    )
    daemon = ctx.work.daemon(run_dir).start()
    used: set[int] = set()
    nan_ms: list[float] = []
    problems: list[str] = []
    trainer = poll(lambda: armed_pid(events, used), 30.0)
    time.sleep(2)
    askers = Askers(daemon.socket, "big")
    probe = StatusProbe(lambda cmd, timeout: daemon.request("history", points=200))
    try:
        time.sleep(2)  # the flood under way
        for index in range(samples):
            if trainer is None:
                problems.append(f"no trainer armed at sample {index}")
                break
            used.add(trainer)
            watch = DeathWatch(trainer)
            tell_to_diverge(go, trainer)
            dead_t = watch.wait(10.0)
            written_t = poll(lambda t=trainer: nan_written_t(events, t), 2.0)
            if dead_t is None or written_t is None:
                problems.append(f"trainer {trainer} was not killed within 10 s")
                break
            nan_ms.append((dead_t - written_t) * 1000)
            trainer = poll(lambda: armed_pid(events, used), 30.0)
    finally:
        askers.close()
        probe.close()
    daemon.stop()
    nan = latency_summary(nan_ms)
    own = latency_summary(probe.ms)
    rows = [
        ["NaN line written -> trainer gone", str(nan["n"]), fmt_ms(nan["p50_ms"]),
         fmt_ms(nan["p99_ms"]), fmt_ms(nan["max_ms"])],
        ["owner's history, asked every 0.25 s", str(own["n"]), fmt_ms(own["p50_ms"]),
         fmt_ms(own["p99_ms"]), fmt_ms(own["max_ms"])],
    ]  # fmt: skip
    section = Section(
        key="history-of-load",
        title=TITLE,
        intro=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " ").strip(),
        header=["measure", "samples", "p50 ms", "p99 ms", "max ms"],
        rows=rows,
        raw={"nan": nan, "history": own, "asked": [askers.answered, askers.refused]},
    )
    section.notes.append(
        f"The {ASKERS} clients were answered {askers.answered} times and refused `busy`"
        f" {askers.refused} times ({askers.failed} failed); {probe.failed} of the owner's"
        f" history requests failed; the sibling held {steps:,} steps."
    )
    section.notes.extend(problems)
    section.targets = [
        Target("NaN -> trainer killed p99 < 100 ms under the history_of flood",
               f"{fmt_ms(nan['p99_ms'])} ms", bool(nan_ms) and nan["p99_ms"] < 100),
        Target("owner's history p99 < 2 s under the same flood",
               f"{fmt_ms(own['p99_ms'])} ms",
               bool(probe.ms) and own["p99_ms"] < 2000 and not probe.failed),
    ]  # fmt: skip
    return section
