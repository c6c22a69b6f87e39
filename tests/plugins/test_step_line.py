import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainwarden.plugins.api import StepRecord
from trainwarden.plugins.parsers.step_line import StepLineParser


@pytest.fixture
def parser():
    return StepLineParser({"logging_steps": 1})


def test_common_line(parser):
    record = parser.parse("step: 120, loss: 3.41, dt: 0.25")
    assert (record.step, record.loss, record.dt, dict(record.extras)) == (120, 3.41, 0.25, {})


def test_line_with_newline_and_crlf(parser):
    assert parser.parse("step: 7, loss: 2.5, dt: 0.125\n").loss == 2.5
    assert parser.parse("step: 7, loss: 2.5, dt: 0.125\r\n").dt == 0.125


def test_extras_are_typed(parser):
    record = parser.parse("step: 3, loss: 3.0, dt: 0.3, lr: 6e-4, tokens: 32768, arm: web")
    assert record.dt == 0.3
    assert record.extras == {"lr": 0.0006, "tokens": 32768, "arm": "web"}
    assert isinstance(record.extras["tokens"], int)


def test_dt_optional_and_anywhere(parser):
    assert parser.parse("step: 3, loss: 3.0").dt is None
    record = parser.parse("step: 3, loss: 3.0, lr: 0.1, dt: 0.5")
    assert record.dt == 0.5 and record.extras == {"lr": 0.1}


def test_loose_spacing(parser):
    record = parser.parse("  step:5 ,loss:3.5,dt:0.2")
    assert (record.step, record.loss, record.dt) == (5, 3.5, 0.2)


@pytest.mark.parametrize("word", ["nan", "NaN", "-nan", "inf", "-inf", "Infinity"])
def test_non_finite_losses_are_reported(parser, word):
    record = parser.parse(f"step: 9, loss: {word}, dt: 0.25")
    assert record is not None and record.step == 9
    assert not math.isfinite(record.loss)
    if "inf" in word.lower():
        assert record.loss == (-math.inf if word.startswith("-") else math.inf)


def test_progress_bar_before_carriage_return(parser):
    record = parser.parse("  3%|#   | 30/1000 [00:03<01:40]\rstep: 30, loss: 4.0, dt: 0.1")
    assert record.step == 30


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\n",
        "Loading dataset shards: 100%|##########| 4/4",
        "eval step: 5, loss: 3.2",  # an evaluation, not a training step
        "step: 5, loss: abc, dt: 0.1",
        "step: , loss: 3.0",
        "step: 5",
        "loss: 3.0, step: 5",
        "UserWarning: TypedStorage is deprecated",
        "Traceback (most recent call last):",
        '  File "train.py", line 10, in <module>',
        "step: 12, los",  # a partial line
        "step: 99999999999999999999999999999999, loss: 1.0",
    ],
)
def test_other_lines_are_not_steps(parser, line):
    assert parser.parse(line) is None


def test_options_mapping_is_accepted():
    assert StepLineParser({}).parse("step: 1, loss: 1.0, dt: 1.0").step == 1


def test_fast_path_builds_the_same_frozen_record(parser):
    import dataclasses

    record = parser.parse("step: 120, loss: 3.41, dt: 0.25")
    assert record == StepRecord(120, 3.41, 0.25, {})
    assert hash(record.step) == hash(120) and repr(record).startswith("StepRecord(step=120")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.loss = 1.0


@given(
    step=st.integers(0, 10**12),
    loss=st.floats(allow_nan=False),
    dt=st.floats(min_value=0, max_value=1e6),
)
def test_fast_and_general_paths_agree(step, loss, dt):
    parser = StepLineParser({})
    line = f"step: {step}, loss: {loss!r}, dt: {dt!r}"
    fast = parser.parse(line)
    general = parser._parse_general(line)
    assert fast == general == StepRecord(step, loss, dt, {})
