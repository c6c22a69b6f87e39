import math

import pytest

from trainwarden.plugins.api import StepRecord
from trainwarden.plugins.parsers.hf_trainer import HfTrainerParser

LOSS_LINE = "{'loss': 3.41, 'grad_norm': 1.2, 'learning_rate': 0.0006, 'epoch': 0.12}"


def test_steps_counted_by_logging_steps():
    parser = HfTrainerParser({"logging_steps": 10})
    first = parser.parse(LOSS_LINE)
    assert (first.step, first.loss, first.dt) == (10, 3.41, None)
    assert first.extras == {"grad_norm": 1.2, "learning_rate": 0.0006, "epoch": 0.12}
    assert parser.parse(LOSS_LINE).step == 20


def test_default_logging_steps_is_one():
    parser = HfTrainerParser({})
    assert [parser.parse(LOSS_LINE).step for _ in range(3)] == [1, 2, 3]


def test_eval_and_summary_lines_do_not_count():
    parser = HfTrainerParser({"logging_steps": 5})
    evaluation = parser.parse("{'eval_loss': 3.2, 'eval_runtime': 1.5, 'epoch': 1.0}")
    assert not isinstance(evaluation, StepRecord)
    assert parser.parse("{'train_runtime': 120.5, 'train_loss': 3.3, 'epoch': 1.0}") is None
    assert parser.parse(LOSS_LINE).step == 5


def test_explicit_step_wins():
    parser = HfTrainerParser({"logging_steps": 10})
    assert parser.parse("{'loss': 2.0, 'step': 77}").step == 77


def test_resume_at_continues_the_count():
    parser = HfTrainerParser({"logging_steps": 10})
    parser.parse(LOSS_LINE)
    parser.resume_at(500)
    assert parser.parse(LOSS_LINE).step == 510


@pytest.mark.parametrize(
    "word,expected", [("nan", math.nan), ("-nan", math.nan), ("inf", math.inf)]
)
def test_bare_non_finite_words(word, expected):
    record = HfTrainerParser({}).parse(f"{{'loss': {word}, 'grad_norm': -inf, 'epoch': 0.5}}")
    assert record is not None
    assert math.isnan(record.loss) if math.isnan(expected) else record.loss == expected
    assert record.extras["grad_norm"] == -math.inf


def test_string_formatted_loss():
    assert HfTrainerParser({}).parse("{'loss': '2.345', 'epoch': '0.01'}").loss == 2.345


def test_after_progress_bar():
    line = " 10%|#         | 10/100 [00:01<00:09,  9.5it/s]\r" + LOSS_LINE
    assert HfTrainerParser({}).parse(line).loss == 3.41


@pytest.mark.parametrize(
    "line",
    [
        "{'loss': __import__('os').system('touch /tmp/pwned')}",
        "{'loss': (lambda: 1)()}",
        "{'loss': 1 + 2}",
        "{**{'loss': 1.0}}",
        "{'loss': 3.41, 'grad_norm'",  # partial line
        "{'loss': }",
        "{'loss': 'abc'}",
        "Some weights of the model checkpoint were not used when initializing: ['loss']",
        "",
        "{" * 5000 + "'loss': 1.0" + "}" * 5000,
    ],
)
def test_unsafe_or_broken_lines(line):
    parser = HfTrainerParser({})
    assert parser.parse(line) is None
    assert parser.parse(LOSS_LINE).step == 1  # rejected lines were not counted
