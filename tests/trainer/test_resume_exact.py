"""A run stopped or killed and resumed in a new process ends bit-identical to one that wasn't.

And the converse, so the identity above is not an accident: resuming without the Adam
moments or without the data position gives different losses.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from tests.trainer.trainer_process import (
    COMMON_ARGS,
    PACED,
    STEPS,
    LiveTrainer,
    checkpoint,
    live_trainer,
    read_bin,
    run_trainer,
    step_losses,
)

RESET_DATA = {"TRAINER_TEST_RESET_DATA": "1"}
# Seven steps of margin at this pace: the kill lands well before the step-40 save.
SLOWLY_PACED = {"TRAINER_TEST_STEP_SLEEP_S": "0.05"}


def resume(
    run_dir: Path, from_path: Path, env: dict[str, str] | None = None, sync_save: bool = False
) -> dict[int, str]:
    extra = ("--sync-save",) if sync_save else ()
    result = run_trainer(run_dir, *COMMON_ARGS, *extra, "--resume", str(from_path), env=env)
    assert result.returncode == 0, result.stderr
    return step_losses(result.stdout)


def assert_same_final_state(run_dir: Path, straight_dir: Path) -> None:
    ours = read_bin(checkpoint(run_dir, STEPS))
    theirs = read_bin(checkpoint(straight_dir, STEPS))
    for name, mine, reference in zip(
        ("header", "n_params", "weights", "m", "v"), ours, theirs, strict=True
    ):
        assert mine == reference, f"{name} differs from the uninterrupted run"


def test_sigterm_then_resume_is_bit_exact(straight, tmp_path):
    with live_trainer(tmp_path, *COMMON_ARGS, env=PACED) as trainer:
        trainer.read_until("step: 25,")
        trainer.signal(signal.SIGTERM)
        assert trainer.finish() == 0
    saved = [line for line in trainer.lines if "saved (stop requested" in line]
    assert len(saved) == 1, trainer.lines[-5:]
    stopped_at = int(re.search(r"step_(\d+)\.bin", saved[0]).group(1))
    assert 25 <= stopped_at < STEPS
    assert max(step_losses(trainer.lines)) == stopped_at

    resumed = resume(tmp_path, checkpoint(tmp_path, stopped_at))

    assert sorted(resumed) == list(range(stopped_at + 1, STEPS + 1))
    assert resumed == {step: straight.losses[step] for step in resumed}
    assert_same_final_state(tmp_path, straight.run_dir)


def test_sigkill_then_resume_from_last_commit_replays_exactly(straight, tmp_path):
    # With the synchronous save (--sync-save): the background save's resume through
    # SIGKILLs is proven in test_async_save.py and, under the daemon, test_daemon.py.
    with live_trainer(tmp_path, *COMMON_ARGS, "--sync-save", env=SLOWLY_PACED) as trainer:
        trainer.read_until("step: 33,")
        trainer.signal(signal.SIGKILL)
        trainer.finish()
    killed = step_losses(trainer.lines)
    committed = max(int(p.stem[5:]) for p in (tmp_path / "checkpoints").glob("step_*.bin"))

    resumed = resume(tmp_path, checkpoint(tmp_path, committed), sync_save=True)

    replayed = [step for step in killed if step > committed]
    assert replayed, "the kill should have come after some unsaved steps"
    assert {step: resumed[step] for step in replayed} == {step: killed[step] for step in replayed}
    assert resumed == {step: straight.losses[step] for step in range(committed + 1, STEPS + 1)}
    assert_same_final_state(tmp_path, straight.run_dir)


def max_loss_gap(resumed: dict[int, str], reference: dict[int, str]) -> float:
    return max(abs(float(resumed[step]) - float(reference[step])) for step in resumed)


def test_resume_without_moments_or_data_position_differs(straight, tmp_path):
    no_moments = tmp_path / "no-moments"
    copy = straight.copy_checkpoint(30, no_moments)
    _, n_params, weights, _, _ = read_bin(copy)
    copy.write_bytes(copy.read_bytes()[:8] + weights + bytes(8 * n_params))
    data_reset = tmp_path / "data-reset"
    reset_copy = straight.copy_checkpoint(30, data_reset)

    # Both at once: they are independent and each is mostly start-up time.
    runs = [
        LiveTrainer(no_moments, [*COMMON_ARGS, "--resume", str(copy)], None),
        LiveTrainer(data_reset, [*COMMON_ARGS, "--resume", str(reset_copy)], RESET_DATA),
    ]
    try:
        assert [run.finish() for run in runs] == [0, 0]
    finally:
        for run in runs:
            run.stop()
    without_moments, reset = (step_losses(run.lines) for run in runs)

    # Step 31's loss comes before the first update, so zeroed moments still match there.
    assert without_moments[31] == straight.losses[31]
    assert max_loss_gap(without_moments, straight.losses) > 1e-3
    final = read_bin(checkpoint(no_moments, STEPS))[2]
    assert final != read_bin(checkpoint(straight.run_dir, STEPS))[2]

    assert reset[31] != straight.losses[31]
    assert max_loss_gap(reset, straight.losses) > 1e-3
