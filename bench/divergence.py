"""2. Bad loss written -> trainer killed: how long a diverged trainer keeps running.

The trainer (bench/programs/nan_trainer.py) logs a step every 0.1 s. When the bench tells
it to, it records time.monotonic() and then prints and flushes a `loss: nan` line (the
time is taken before the write: the reader the write wakes may kill the trainer before it
runs another instruction). The bench, an outside observer, holds a pidfd on the trainer and records the moment the
process is gone. One sample = death - write. Contenders: trainwarden's daemon, the
hand-written Python follower (readline, sleep 1 s when nothing is new, kill on 'nan'),
and `tail -F log | grep -m1 nan && kill -9 PID` in bash.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import psutil

from bench.common import (
    Context,
    DeathWatch,
    Section,
    Target,
    fmt_ms,
    fmt_ratio,
    latency_summary,
    program,
    read_events,
)
from bench.peers import trainwarden_config
from bench.plots import latency_cdf
from tests.support import poll

TITLE = "2. Bad loss written -> trainer killed"
STEP_S = 0.1
ARM_AFTER = 3

PIPELINE = 'tail -n 0 -F "$1" | grep -m1 nan > /dev/null && kill -9 "$2"'


def trainer_argv(events: Path, go: Path) -> list[str]:
    return program(
        "nan_trainer.py", "--events", events, "--go", go, "--dt", STEP_S, "--arm-after", ARM_AFTER
    )


def tell_to_diverge(go: Path, pid: int) -> None:
    tmp = go.with_name(go.name + ".tmp")
    tmp.write_text(str(pid))
    os.replace(tmp, go)


def nan_written_t(events: Path, pid: int) -> float | None:
    return next((t for kind, p, t, _ in read_events(events) if kind == "nan" and p == pid), None)


def armed_pid(events: Path, exclude: set[int]) -> int | None:
    armed = [
        (t, p) for kind, p, t, _ in read_events(events) if kind == "armed" and p not in exclude
    ]
    return max(armed)[1] if armed else None


def one_sample(events: Path, go: Path, pid: int) -> float | None:
    """Make `pid` log NaN; ms from the line's write to the process's death (None: no death)."""
    watch = DeathWatch(pid)
    tell_to_diverge(go, pid)
    dead_t = watch.wait(10.0)
    written_t = poll(lambda: nan_written_t(events, pid), 2.0)
    if dead_t is None or written_t is None:
        return None
    return (dead_t - written_t) * 1000


class DaemonWatcher:
    """trainwarden's daemon supervising the trainer: one sample per divergence, the daemon
    restarting the trainer after each."""

    name = "trainwarden"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        run_dir = ctx.work.dir("divergence", "trainwarden")
        self.events, self.go = run_dir / "events", run_dir / "go"
        trainwarden_config(
            run_dir,
            trainer_argv(self.events, self.go),
            # Every sample is a fresh divergence; a real run would halt in `diverged` after
            # the second one without a checkpoint past it.
            restart={"backoff_initial_s": 0.0, "divergence_retries": 1_000_000},
        )
        self.daemon = ctx.work.daemon(run_dir).start()
        self.used: set[int] = set()

    def sample(self, index: int) -> float | str:
        pid = poll(lambda: armed_pid(self.events, self.used), 30.0)
        if pid is None:
            return f"no trainer running at sample {index}: {self.daemon.stderr()}"
        self.used.add(pid)
        latency = one_sample(self.events, self.go, pid)
        return f"trainer {pid} was not killed within 10 s" if latency is None else latency

    def close(self) -> None:
        self.daemon.stop()


class FollowerWatcher:
    """A fresh trainer and a fresh follower per sample; the follower kills the trainer."""

    def __init__(
        self, ctx: Context, name: str, follower: list[str] | None, script: str | None
    ) -> None:
        self.ctx, self.name, self.follower, self.script = ctx, name, follower, script
        self.directory = ctx.work.dir("divergence", name.split()[0].strip(":"))
        self.events, self.go = self.directory / "events", self.directory / "go"
        self.log = self.directory / "training.log"
        self.rng = random.Random(8)

    def start_follower(self, trainer_pid: int) -> tuple[subprocess.Popen[bytes], bool]:
        work, log = self.ctx.work, self.log
        if self.follower is not None:
            proc = work.popen(
                [*self.follower, str(log), str(trainer_pid), str(self.events)], cwd=self.directory
            )
            ready = poll(
                lambda: any(
                    k == "ready" and p == proc.pid for k, p, *_ in read_events(self.events)
                ),
                30.0,
            )
            return proc, bool(ready)
        assert self.script is not None
        proc = work.popen(
            ["bash", "-c", self.script, "follower", str(log), str(trainer_pid)],
            cwd=self.directory,
            stdout=self.directory / "bash.out",
        )
        ready = poll(lambda: _has_tail(self.ctx, proc, log), 30.0)
        time.sleep(0.1)  # tail opens the log, seeks to its end, then adds its inotify watch
        return proc, bool(ready)

    def sample(self, index: int) -> float | str:
        work = self.ctx.work
        trainer = work.popen(
            trainer_argv(self.events, self.go), cwd=self.directory, stdout=self.log
        )
        watcher, ready = self.start_follower(trainer.pid)
        try:
            armed = poll(lambda: armed_pid(self.events, set()) == trainer.pid, 30.0)
            if not ready or not armed:
                return f"the trainer or follower did not start (sample {index})"
            if self.follower is not None:
                # Its 1 s sleep would otherwise start at the same offset from the trainer's
                # start every time: provoke the NaN at a random point of that cycle.
                time.sleep(self.rng.uniform(0.0, 1.0))
            latency = one_sample(self.events, self.go, trainer.pid)
        finally:
            helpers = work.descendants(watcher)
            work.stop(trainer, grace=1.0)
            work.stop(watcher, grace=1.0)
            work.kill_ours(helpers)
        if latency is None:
            return f"it did not kill the trainer within 10 s (sample {index})"
        return latency

    def close(self) -> None:
        pass


def _has_tail(ctx: Context, proc: subprocess.Popen[bytes], log: Path) -> bool:
    """True once proc's tail has the log open (it seeks to the end, then watches it)."""
    for pid in ctx.work.descendants(proc):
        try:
            if psutil.Process(pid).name() != "tail":
                continue
            if any(Path(f.path) == log for f in psutil.Process(pid).open_files()):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def _tail_version() -> str:
    try:
        done = subprocess.run(["tail", "--version"], capture_output=True, timeout=10)
        return done.stdout.decode().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "tail"


def run(ctx: Context) -> Section:
    samples = 5 if ctx.quick else 30
    watchers: list[DaemonWatcher | FollowerWatcher] = [
        DaemonWatcher(ctx),
        FollowerWatcher(ctx, "python follower (sleep 1 s)", program("follower.py"), None),
        FollowerWatcher(ctx, "bash: tail -F | grep -m1 nan && kill", None, PIPELINE),
    ]
    gaps: dict[str, list[float]] = {w.name: [] for w in watchers}
    problems: dict[str, str] = {w.name: "" for w in watchers}
    try:
        # One sample from each in turn, so all of them see the same machine load.
        for index in range(samples):
            for w in watchers:
                if problems[w.name]:
                    continue
                result = w.sample(index)
                if isinstance(result, str):
                    problems[w.name] = result
                else:
                    gaps[w.name].append(result)
    finally:
        for w in watchers:
            w.close()
    results = {name: latency_summary(values) for name, values in gaps.items()}
    tw = results["trainwarden"]
    section = Section(
        key="divergence",
        title=TITLE,
        intro=(
            f"A trainer logging one step every {STEP_S:g} s prints `step: N, loss: nan, ...` "
            "when told to. Latency = the trainer writing that line (it records "
            "`time.monotonic()` just before the write) -> the trainer process gone, seen "
            "from outside through a pidfd (the trainer cannot time its own SIGKILL). "
            "trainwarden: the "
            "daemon with its default parser and `max_loss`; the others follow the same log "
            "file and send SIGKILL themselves. The contenders take turns, one sample each, "
            "round after round; the NaN line is written at a step boundary after the "
            f"trainer has logged {ARM_AFTER} normal steps."
        ),
        header=[
            "watcher",
            "samples",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "p99 / trainwarden's",
        ],  # fmt: skip
        plots=["divergence_latency.png"],
    )
    for name, r in results.items():
        if not r["n"]:
            section.rows.append([name, "0", "-", "-", "-", "-", problems[name] or "-"])
            continue
        ratio = r["p99_ms"] / tw["p99_ms"] if tw["n"] else float("nan")
        section.rows.append(
            [
                name,
                str(r["n"]),
                fmt_ms(r["p50_ms"]),
                fmt_ms(r["p90_ms"]),
                fmt_ms(r["p99_ms"]),
                fmt_ms(r["max_ms"]),
                fmt_ratio(ratio),
            ]  # fmt: skip
        )
    for name, problem in problems.items():
        if problem:
            section.notes.append(f"{name}: {problem}.")
    section.notes += [
        "The Python follower sleeps a full second whenever it has read everything, so its "
        "latency is wherever the NaN falls in that second: uniform between 0 and 1 s.",
        "`tail -F log | grep -m1 nan && kill` is quick: tail is woken by inotify, and "
        "GNU tail (here `" + _tail_version() + "`) exits as soon as grep closes the pipe, "
        "so bash runs `kill` at once. (A tail that only noticed on its next write would "
        "hold the kill back by one step time of the trainer.) Nothing in it handles a "
        "restart, a loss above a threshold, or a second NaN.",
        "trainwarden's path: inotify wakes the event loop, which reads the new line "
        "straight away; the parser reads the loss, the policy decides, the journal "
        "records the `divergence` and `signal` events, then SIGKILL goes to the trainer's "
        "process group.",
    ]
    latency_cdf(ctx.out / "divergence_latency.png", gaps, "NaN line written -> trainer dead")
    section.raw = {"samples_ms": gaps, "summary": results, "problems": problems}
    section.targets.append(
        Target(
            "NaN line written -> trainer killed p99 < 50 ms (trainwarden)",
            f"{fmt_ms(tw['p99_ms'])} ms",
            bool(tw["n"]) and tw["p99_ms"] < 50,
        )
    )
    return section
