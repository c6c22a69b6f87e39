"""The step-line parser's evaluation lines: `eval: step N, val_loss X[, key: value ...]`,
as the reference trainer prints them before the step's checkpoint."""

import math

import pytest

from trainwarden.plugins.api import EvalRecord, StepRecord
from trainwarden.plugins.parsers.step_line import StepLineParser


@pytest.fixture
def parser():
    return StepLineParser({"logging_steps": 1})


def test_an_eval_line_is_an_evaluation_with_its_per_arm_losses(parser):
    record = parser.parse("eval: step 600, val_loss 3.125, val_docs: 3.0, val_code: 3.25\n")
    assert isinstance(record, EvalRecord)
    assert (record.step, record.loss) == (600, 3.125)
    assert dict(record.extras) == {"val_docs": 3.0, "val_code": 3.25}


@pytest.mark.parametrize(
    "line",
    [
        "eval: step 40, val_loss 2.5",
        "eval: step: 40, val_loss: 2.5",
        "  eval:step 40 ,val_loss 2.5\r\n",
        "12%|##  | 5/40\reval: step 40, val_loss 2.5",
    ],
)
def test_spacing_colons_and_progress_bars_are_tolerated(parser, line):
    record = parser.parse(line)
    assert isinstance(record, EvalRecord)
    assert (record.step, record.loss, dict(record.extras)) == (40, 2.5, {})


def test_a_nan_validation_loss_is_an_evaluation_never_a_training_step(parser):
    record = parser.parse("eval: step 50, val_loss nan, val_docs: nan")
    assert isinstance(record, EvalRecord) and not isinstance(record, StepRecord)
    assert record.step == 50 and math.isnan(record.loss)
    assert math.isnan(record.extras["val_docs"])


@pytest.mark.parametrize(
    "line",
    [
        "eval: step 50",  # no loss
        "eval: step x, val_loss 2.0",
        "eval: step 50, val_loss abc",
        "eval: step 50, loss 2.0",  # not the validation loss
        "evaluation: step 50, val_loss 2.0",
        "eval step: 5, loss: 3.2",  # stays neither a step nor an evaluation
    ],
)
def test_lines_that_are_not_evaluations_are_none(parser, line):
    assert parser.parse(line) is None


def test_step_lines_are_unchanged(parser):
    record = parser.parse("step: 120, loss: 3.41, dt: 0.25")
    assert isinstance(record, StepRecord) and (record.step, record.loss) == (120, 3.41)
