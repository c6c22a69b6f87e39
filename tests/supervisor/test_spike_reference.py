"""Loss spikes end to end with the reference trainer: a bad-data region really spikes the
loss; the daemon detects it within spike_patience steps, rolls back before it, skips the
data, and the run goes on as one whose data never held the region. (Kills around a
rollback: tests/supervisor/test_spike_rollback.py with the scripted trainer; the reference
trainer's bytes through SIGKILLs under skips: tests/trainer/test_skip_data.py.)"""

from __future__ import annotations

import os
from pathlib import Path
from statistics import fmean

import orjson
import pytest

from tests.support import journal, running_daemon
from tests.support.runs import reference_run

STEPS, SAVE_EVERY = 650, 50
BAD_AT, BAD_STEPS = 400, 50
PATIENCE = 5
LR_SCALE = 0.9
BOUND = 0.15
"""Mean loss over steps 450-650, the handled run against one whose data never held the
region. Measured 0.05 (0.051 over 450-600), while the unhandled run is 3 or more above in
the region and about 0.7 above just after it (tests/trainer/test_skip_data.py); per-step
spread 0.19, so 150-200-step means on different clean data differ by about 0.02-0.04 by
chance, and training from a checkpoint trained 100 steps on other data adds a little."""


def losses(run_dir: Path) -> dict[int, float]:
    """Each step's loss as the newest trainer start logged it."""
    newest: dict[int, tuple[int, float]] = {}
    for line in (run_dir / ".loss.json").read_bytes().splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if row["step"] not in newest or row["seg"] >= newest[row["step"]][0]:
            newest[row["step"]] = (row["seg"], float(row["loss"]))
    return {step: loss for step, (_, loss) in newest.items()}


def last_logged(run_dir: Path) -> tuple[int, int] | None:
    """(seg, step) of the newest complete line of .loss.json."""
    try:
        with open(run_dir / ".loss.json", "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
            tail = file.read()
    except FileNotFoundError:
        return None
    for line in reversed(tail.split(b"\n")[1:-1] or tail.split(b"\n")[:-1]):
        try:
            row = orjson.loads(line)
            return row["seg"], row["step"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    return None


def spike_run(run_dir: Path, bad_data: bool = True) -> Path:
    extra = ("--bad-data-at-step", str(BAD_AT), "--bad-data-steps", str(BAD_STEPS))
    return reference_run(
        run_dir,
        STEPS,
        SAVE_EVERY,
        *(extra if bad_data else ()),
        trainer={"supports": ["skip_data", "lr_scale"]},
        checkpoints={"keep_last": 20},
        divergence={"lr_scale": LR_SCALE},
    )


def kinds(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in journal(run_dir) if r.get("kind") == kind]


def run_to_the_end(run_dir: Path) -> None:
    with running_daemon(run_dir) as daemon:
        daemon.wait_state("finished", timeout=900)
        daemon.stop()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spikes")
    clean, handled = spike_run(root / "clean", bad_data=False), spike_run(root / "handled")
    run_to_the_end(clean)
    run_to_the_end(handled)
    return {"clean": clean, "handled": handled}


def final_checkpoint(run_dir: Path) -> bytes:
    return (run_dir / "checkpoints" / f"step_{STEPS:06d}.bin").read_bytes()


def test_the_spike_is_rolled_back_skipped_and_cured(runs: dict[str, Path]):
    handled, clean = runs["handled"], runs["clean"]
    [spike] = kinds(handled, "spike")
    [rollback] = kinds(handled, "rollback")
    assert BAD_AT <= spike["first_step"] <= BAD_AT + 1
    assert spike["step"] - spike["first_step"] + 1 == PATIENCE  # detected within patience
    assert rollback["step"] == BAD_AT - 100  # the newest verified 100 steps before
    window = rollback["window"]
    assert window[0] == rollback["step"] + 1 and window[1] >= spike["step"] + 200
    assert rollback["skip_data"] == [window]
    assert rollback["lr_scale"] == pytest.approx(LR_SCALE)
    assert rollback["supported"] == {"skip_data": True, "lr_scale": True}
    assert [r["outcome"] for r in kinds(handled, "spike_outcome")] == ["cured"]
    sidecar = orjson.loads((handled / "checkpoints" / f"step_{STEPS:06d}.json").read_bytes())
    assert sidecar["skip_data"] == [window] and sidecar["lr_scale"] == pytest.approx(LR_SCALE)

    ours, theirs = losses(handled), losses(clean)
    after = range(BAD_AT + BAD_STEPS, STEPS + 1)
    gap = fmean(ours[s] for s in after) - fmean(theirs[s] for s in after)
    print(f"mean loss over steps {after.start}-{STEPS}: handled - clean = {gap:+.4f}")
    assert abs(gap) < BOUND
    # The abandoned steps are kept in .loss.json, superseded by the later start.
    segs = {
        orjson.loads(line)["seg"] for line in (handled / ".loss.json").read_bytes().splitlines()
    }
    assert len(segs) >= 2
