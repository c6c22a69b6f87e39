"""The chaos soak: the real daemon and the reference trainer through a seeded storm of
trainer and daemon SIGKILLs, corrupt checkpoints (planted while the daemon is down, or a
committed one rewritten in place while it runs), far-future checkpoints planted, a NaN, a
hang, a full disk and two operators at once, then ten invariants checked from outside
(see judge.Judge).

The trainer runs behind tests/chaos/forking_wrapper.py: every start leaves a double-forked
helper (every third one ignoring SIGTERM) that only the daemon's containment ends, and the
trainer itself is exec'd unchanged, so its weights stay bit-identical to the straight run.
The no-SIGUSR1 variant keeps the wrapper as the main process (`signal_target = "main"`),
ignoring SIGUSR1: a save there is answered by a later periodic checkpoint, or refused
("unsupported") by a daemon that reads the target's signal mask first; a smaller storm,
no pivot, 1,000 steps.

The default suite runs one soak (1,000 steps, every fault kind and all ten invariants,
beside busy loops: the `loaded` marker); the 2,000-step variants and the long one (20,000
steps) are the slow tier (`--run-slow`). TRAINWARDEN_CHAOS_SEED picks another schedule and
TRAINWARDEN_CHAOS_STEPS resizes the long variant (fault counts scale with it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.chaos.harness import Soak, SoakPlan, StraightRun, continuation_from_pivot
from tests.chaos.judge import Judge, describe, write_summary

SEED = int(os.environ.get("TRAINWARDEN_CHAOS_SEED", "20240611"))

SOAK = SoakPlan(
    steps=1500,
    save_every=50,
    seed=SEED,
    trainer_kills=2,
    kills_in_write=2,
    daemon_kills=2,
    enospc=1,
    save_pairs=1,
    stop_starts=1,
    save_kills=1,
    wrapper=("--stubborn-every", "3"),
    stall_timeout_s=3.0,
    stop_timeout_s=2.0,
    trainer="scripted",
    script_breaks=2,
)
"""Every fault kind (the daemon twice: a single and a double kill) against the scripted
trainer with a bandit, one NaN, one hang and slowed saves, and its script broken and
repaired twice at random moments: the daemon's ten invariants. The bounds are short (a 3 s
stall timeout, 2 s to stop) because every wait on a stubborn helper or a hang costs them
in full: about 50 s beside the busy loops, where 5 s and 4 s took 67 s."""

FAST = SoakPlan(
    steps=2000,
    save_every=50,
    seed=SEED,
    trainer_kills=2,
    kills_in_write=2,
    daemon_kills=2,
    enospc=1,
    save_pairs=1,
    stop_starts=1,
    save_kills=1,
    wrapper=("--stubborn-every", "3"),
)

NO_SIGUSR1 = replace(
    FAST,
    steps=1000,
    trainer_kills=1,
    kills_in_write=1,
    daemon_kills=1,
    enospc=0,
    pivot=False,
    wrapper=("--stay", "--stubborn-every", "3"),
    signal_target="main",
)

LONG = SoakPlan(
    steps=20000,
    save_every=100,
    seed=SEED,
    trainer_kills=12,
    kills_in_write=8,
    daemon_kills=6,
    enospc=3,
    save_pairs=4,
    stop_starts=3,
    save_kills=3,
    corruptions=4,
    future_plants=2,
    wrapper=("--stubborn-every", "3"),
)


def scaled(plan: SoakPlan, steps: int) -> SoakPlan:
    """The long plan resized to `steps`, with fault counts in proportion (at least one)."""
    k = steps / plan.steps

    def n(count: int) -> int:
        return max(1, round(count * k))

    return replace(
        plan,
        steps=steps,
        trainer_kills=n(plan.trainer_kills),
        kills_in_write=n(plan.kills_in_write),
        daemon_kills=n(plan.daemon_kills),
        enospc=n(plan.enospc),
        save_pairs=n(plan.save_pairs),
        stop_starts=n(plan.stop_starts),
        save_kills=n(plan.save_kills),
        corruptions=n(plan.corruptions),
        future_plants=n(plan.future_plants),
    )


def soak(
    plan: SoakPlan,
    variant: str,
    tmp_path: Path,
    straight_runs: Callable[[SoakPlan], StraightRun],
) -> None:
    straight = straight_runs(plan)
    run = Soak(plan, tmp_path, use_namespace=True)
    started = time.monotonic()
    try:
        try:
            run.run()
        finally:
            run.stop_watcher()
            if run.daemon.alive:
                print("daemon stderr:\n" + run.stderr_tail())
        continuation = None
        if run.pivot_result is not None:
            continuation = continuation_from_pivot(run, tmp_path)
            continuation.wait(plan.steps / 10 + 300)
        straight.wait(plan.steps / 5 + 600)
        judge = Judge(run, straight, continuation)
        verdicts = judge.judge()
        summary = judge.summary(variant)
        summary["test_wall_s"] = round(time.monotonic() - started, 1)
        path = write_summary(summary, tmp_path)
        print(describe(summary))
        print(f"summary: {path}")
    finally:
        run.cleanup()
    failed = [v for v in verdicts if not v.ok]
    assert not failed, "invariant(s) violated:\n" + "\n".join(
        f"{v.name}: {v.detail}" for v in failed
    )


@pytest.mark.loaded
@pytest.mark.timeout(900)
def test_chaos_soak(tmp_path: Path, straight_runs):
    soak(SOAK, "default", tmp_path, straight_runs)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_chaos_soak_fast(tmp_path: Path, straight_runs):
    soak(FAST, "fast", tmp_path, straight_runs)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_chaos_soak_fast_no_sigusr1(tmp_path: Path, straight_runs):
    soak(NO_SIGUSR1, "fast-no-sigusr1", tmp_path, straight_runs)


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_chaos_soak_long(tmp_path: Path, straight_runs):
    steps = int(os.environ.get("TRAINWARDEN_CHAOS_STEPS", LONG.steps))
    plan = LONG if steps == LONG.steps else scaled(LONG, steps)
    soak(plan, "long" if steps == LONG.steps else f"medium-{steps}", tmp_path, straight_runs)
