"""12. Loss spike -> trainer killed: how many steps and milliseconds a spike runs on.

The trainer (bench/programs/nan_trainer.py --bad-loss 15) logs a step every 0.05 s with a
loss near 5; told to, it logs 15 on every step from then on, recording time.monotonic() just before
each such line. The daemon, with the default [divergence] settings (spike_factor 2.0,
spike_patience 5), acts on the spike_patience-th line above the threshold. One sample:
the high lines the trainer wrote before it died (steps), and the time from writing the
spike_patience-th one to its death, seen from outside through a pidfd (ms).
"""

from __future__ import annotations

from pathlib import Path

from bench.common import (
    Context,
    DeathWatch,
    Section,
    Target,
    fmt_ms,
    latency_summary,
    program,
    read_events,
)
from bench.divergence import armed_pid, tell_to_diverge
from bench.peers import trainwarden_config
from tests.support import poll

TITLE = "12. Loss spike -> trainer killed"
STEP_S = 0.05
ARM_AFTER = 60
SPIKED_LOSS = 15
"""Three times the trend: above spike_factor 2.0 x the loss EMA."""
PATIENCE = 5
"""[divergence] spike_patience's default: the run uses the defaults."""
WARMUP = 50
"""[divergence] spike_warmup's default: the spike comes after it (ARM_AFTER)."""


def high_lines(events: Path, pid: int) -> list[float]:
    """When `pid` wrote each line with the spiked loss, oldest first."""
    return [t for kind, p, t, _ in read_events(events) if kind == "bad" and p == pid]


def run(ctx: Context) -> Section:
    samples = 3 if ctx.quick else 15
    run_dir = ctx.work.dir("spikes", "trainwarden")
    events, go = run_dir / "events", run_dir / "go"
    trainwarden_config(
        run_dir,
        program("nan_trainer.py", "--events", events, "--go", go, "--dt", STEP_S,
                "--arm-after", ARM_AFTER, "--bad-loss", SPIKED_LOSS),
        restart={"backoff_initial_s": 0.0},
        # Every sample is a fresh spike: a real run would halt after max_rollbacks.
        divergence={"max_rollbacks": 1_000_000},
    )  # fmt: skip
    daemon = ctx.work.daemon(run_dir).start()
    steps: list[int] = []
    gaps: list[float] = []
    problem = ""
    used: set[int] = set()
    try:
        for index in range(samples):
            pid = poll(lambda: armed_pid(events, used), 30.0)
            if pid is None:
                problem = f"no trainer running at sample {index}: {daemon.stderr()}"
                break
            used.add(pid)
            watch = DeathWatch(pid)
            tell_to_diverge(go, pid)
            dead_t = watch.wait(10.0)
            written = high_lines(events, pid)
            if dead_t is None or len(written) < PATIENCE:
                problem = f"trainer {pid} was not killed for its spike within 10 s"
                break
            steps.append(len(written))
            gaps.append((dead_t - written[PATIENCE - 1]) * 1000)
    finally:
        daemon.stop()
    ms = latency_summary(gaps)
    section = Section(
        key="spikes",
        title=TITLE,
        intro=(
            f"A trainer logging one step every {STEP_S:g} s (loss about 5) starts logging "
            "15 on every step when told to, after "
            f"{ARM_AFTER} normal steps (past spike_warmup, {WARMUP}). The daemon runs with the default [divergence] "
            f"settings: a spike is {PATIENCE} steps in a row above 2 x the loss EMA. "
            "Steps = the high lines written before the trainer died (the least possible is "
            f"{PATIENCE}); ms = the {PATIENCE}th high line written -> the trainer gone "
            "(through a pidfd)."
        ),
        header=["samples", "steps (min-max)", "p50 ms", "p90 ms", "p99 ms", "max ms"],
    )
    if gaps:
        section.rows.append(
            [
                str(len(gaps)),
                f"{min(steps)}-{max(steps)}",
                fmt_ms(ms["p50_ms"]),
                fmt_ms(ms["p90_ms"]),
                fmt_ms(ms["p99_ms"]),
                fmt_ms(ms["max_ms"]),
            ]  # fmt: skip
        )
    if problem:
        section.notes.append(problem + ".")
    section.notes.append(
        "After each spike the daemon rolls back (this trainer writes no checkpoints: to "
        "scratch), so every sample is a fresh start that spikes again when told."
    )
    section.raw = {"steps": steps, "samples_ms": gaps, "summary": ms, "problem": problem}
    section.targets.append(
        Target(
            f"spike detected within spike_patience ({PATIENCE}) steps",
            f"{max(steps)} steps" if steps else "-",
            bool(steps) and max(steps) <= PATIENCE,
        )
    )
    return section
