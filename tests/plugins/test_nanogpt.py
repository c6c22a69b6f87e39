import math

import pytest

from trainwarden.plugins.parsers.nanogpt import NanoGptParser


@pytest.fixture
def parser():
    return NanoGptParser({})


def test_iter_line(parser):
    record = parser.parse("iter 120: loss 3.4100, time 250.00ms, mfu 31.00%")
    assert (record.step, record.loss, record.dt) == (120, 3.41, 0.25)
    assert record.extras == {"mfu": pytest.approx(0.31)}


def test_mfu_unknown_at_start(parser):
    record = parser.parse("iter 0: loss 10.9853, time 12345.67ms, mfu -100.00%")
    assert record.step == 0 and "mfu" not in record.extras


def test_diverged_iteration(parser):
    record = parser.parse("iter 5: loss nan, time 20.10ms, mfu 3.00%")
    assert record.step == 5 and math.isnan(record.loss)


@pytest.mark.parametrize(
    "line",
    [
        "saving checkpoint to out",
        "tokens per iteration will be: 491,520",
        "number of parameters: 123.59M",
        "iter 12: loss",
        "",
        "compiling the model... (takes a ~minute)",
    ],
)
def test_other_lines(parser, line):
    assert parser.parse(line) is None
