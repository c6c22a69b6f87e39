"""Validation on the held-out split: printed before each scheduled checkpoint, the same
batches every time, and invisible to training (a run that evaluates trains bit-identically
to one that does not, and the held-out bytes never reach a training batch)."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

with warnings.catch_warnings():
    # torch complains at import that NumPy is absent; nothing here needs NumPy.
    warnings.simplefilter("ignore")
    import torch

from tests.trainer.trainer_process import (
    COMMON_ARGS,
    STEPS,
    LiveTrainer,
    checkpoint,
    run_trainer,
    step_losses,
)
from trainwarden.trainer.cli import parse_options
from trainwarden.trainer.corpus import Arm
from trainwarden.trainer.evaluate import Evaluator
from trainwarden.trainer.loop import TrainingLoop
from trainwarden.trainer.plan import make_plan
from trainwarden.trainer.signals import SignalFlags
from trainwarden.trainer.startup import Session, start_session

EVAL_LINE = re.compile(
    r"^eval: step (\d+), val_loss (\d+\.\d{6}), val_docs: (\d+\.\d{6}),"
    r" val_code: (\d+\.\d{6}), val_tests: (\d+\.\d{6})$"
)


def eval_lines(stdout: str | list[str]) -> dict[int, str]:
    lines = stdout.splitlines() if isinstance(stdout, str) else stdout
    return {int(line.split(",")[0].split()[-1]): line for line in lines if line.startswith("eval:")}


def test_eval_before_each_scheduled_checkpoint(straight):
    # COMMON_ARGS saves every 10 steps and leaves --eval-every at its default: the same.
    lines = straight.stdout.splitlines()
    evals = eval_lines(lines)
    assert sorted(evals) == list(range(10, STEPS + 1, 10))
    for step, line in evals.items():
        match = EVAL_LINE.match(line)
        assert match, line
        total, *per_arm = (float(value) for value in match.groups()[1:])
        assert total == pytest.approx(sum(per_arm) / 3, abs=2e-6)
        at = lines.index(line)
        assert lines[at - 1].startswith(f"step: {step}, ")
        # The save of that step is reported once its background write commits: after the
        # evaluation, before the next step's save.
        report = next(
            n
            for n, text in enumerate(lines)
            if text.startswith(f"checkpoint: step_{step:06d}.bin saved")
        )
        assert at < report
        later = [text for text in lines[at:report] if text.startswith("checkpoint: ")]
        assert later == []
    # Training lowers the held-out loss too (from about ln 256 = 5.5 for random bytes).
    first, last = (float(EVAL_LINE.match(evals[s]).group(2)) for s in (10, STEPS))
    assert last < first < 5.6


def test_training_is_bit_identical_with_and_without_eval(straight, tmp_path):
    runs = {
        every: LiveTrainer(tmp_path / f"every-{every}", [*COMMON_ARGS, "--eval-every", every], None)
        for every in ("0", "25")
    }
    try:
        assert [run.finish() for run in runs.values()] == [0, 0]
    finally:
        for run in runs.values():
            run.stop()

    assert eval_lines(runs["0"].lines) == {}
    # Multiples of K, and the final step so a finished run always ends on a figure.
    assert sorted(eval_lines(runs["25"].lines)) == [25, 50, STEPS]
    for every, run in runs.items():
        assert step_losses(run.lines) == straight.losses, f"--eval-every {every}"
        for step in (30, STEPS):
            ours = checkpoint(tmp_path / f"every-{every}", step)
            theirs = checkpoint(straight.run_dir, step)
            assert ours.read_bytes() == theirs.read_bytes(), (every, step)
            # The sidecar's RNG and bandit state too: an evaluation draws from neither.
            ours_side, theirs_side = (
                json.loads(path.with_suffix(".json").read_text()) for path in (ours, theirs)
            )
            for key in ("rng", "bandit", "tokens_seen", "optimizer"):
                assert ours_side[key] == theirs_side[key], (every, step, key)


def test_resume_evaluates_the_same_batches_and_repeats_no_eval(straight, tmp_path):
    copy = straight.copy_checkpoint(30, tmp_path)
    result = run_trainer(tmp_path, *COMMON_ARGS, "--resume", str(copy))
    assert result.returncode == 0, result.stderr

    resumed = eval_lines(result.stdout)
    # Step 30's evaluation was printed before its checkpoint: the resumed run starts after.
    assert sorted(resumed) == [40, 50, 60]
    assert resumed == {step: eval_lines(straight.stdout)[step] for step in resumed}


@pytest.mark.parametrize(("value", "fragment"), [("-1", "must be at least 0"), ("x", "invalid")])
def test_bad_eval_every_exits_2_with_one_line(tmp_path, value, fragment):
    result = run_trainer(tmp_path, "--steps", "5", "--eval-every", value)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "argument --eval-every: " in lines[0] and fragment in lines[0]


# -- in-process: the split and the evaluator's side effects ---------------------------


@pytest.fixture
def torch_settings() -> Iterator[None]:
    """start_session sets process-wide torch switches; put them back for other tests."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def session_with_held_out(run_dir: Path, held_out_byte: int | None) -> Session:
    """A tiny session; with `held_out_byte`, every held-out byte of every arm replaced."""
    plan = make_plan(parse_options(["--run-dir", str(run_dir), "--steps", "20", "--device", "cpu"]))
    if held_out_byte is not None:
        arms = {
            name: Arm(name, arm.train + bytes([held_out_byte]) * len(arm.held_out))
            for name, arm in plan.arms.items()
        }
        assert all(arms[n].split_at == plan.arms[n].split_at for n in arms)
        plan = dataclasses.replace(plan, arms=arms)
    return start_session(plan)


def train(session: Session, steps: int) -> list[float]:
    loop = TrainingLoop(session, SignalFlags())
    return [loop.train_step(step)[0] for step in range(1, steps + 1)]


def weights(session: Session) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in session.model.parameters()])


def test_held_out_bytes_never_reach_training(tmp_path, torch_settings):
    real, zeros, spaces = (
        session_with_held_out(tmp_path / name, byte)
        for name, byte in (("real", None), ("zeros", 0), ("spaces", 32))
    )
    for session in (real, zeros, spaces):
        for name, arm in session.arms.items():
            assert session.tokens[name].numel() == arm.split_at < len(arm.data)

    losses = [train(session, 15) for session in (real, zeros, spaces)]

    assert losses[0] == losses[1] == losses[2]
    assert torch.equal(weights(real), weights(zeros)) and torch.equal(
        weights(real), weights(spaces)
    )
    # Evaluation does read the held-out bytes: there the three differ.
    figures = [
        Evaluator(s.arms, s.plan.options.seed, s.preset, s.device, s.autocast).evaluate(s.model, 15)
        for s in (real, zeros, spaces)
    ]
    assert len({figure.loss for figure in figures}) == 3


def test_evaluation_touches_no_training_state(tmp_path, torch_settings):
    session = session_with_held_out(tmp_path, None)
    train(session, 3)
    evaluator = Evaluator(
        session.arms, session.plan.options.seed, session.preset, session.device, session.autocast
    )
    rng = torch.get_rng_state()
    moments = [
        (state.step, state.exp_avg.clone(), state.exp_avg_sq.clone())
        for state in session.optimizer.state.values()
    ]
    grads = [p.grad.clone() for p in session.model.parameters()]
    before = weights(session).clone()

    first = evaluator.evaluate(session.model, 3)
    again = Evaluator(
        session.arms, session.plan.options.seed, session.preset, session.device, session.autocast
    ).evaluate(session.model, 3)

    assert first == again  # the same batches from a fresh evaluator: a pure function
    assert set(first.per_arm) == {"docs", "code", "tests"}
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(weights(session), before)
    for grad, param in zip(grads, session.model.parameters(), strict=True):
        assert torch.equal(grad, param.grad)
    for (step, m, v), state in zip(moments, session.optimizer.state.values(), strict=True):
        assert step == state.step
        assert torch.equal(m, state.exp_avg) and torch.equal(v, state.exp_avg_sq)
    assert session.model.training
