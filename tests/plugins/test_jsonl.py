import math

import orjson
import pytest

from trainwarden.plugins.parsers.jsonl import JsonlParser


@pytest.fixture
def parser():
    return JsonlParser({})


def test_record_with_extras(parser):
    record = parser.parse('{"step": 120, "loss": 3.41, "dt": 0.25, "lr": 0.0006, "arm": "web"}')
    assert (record.step, record.loss, record.dt) == (120, 3.41, 0.25)
    assert record.extras == {"lr": 0.0006, "arm": "web"}


def test_dt_optional(parser):
    assert parser.parse('{"step": 1, "loss": 2.0}').dt is None


@pytest.mark.parametrize(
    "loss_text",
    ["NaN", "Infinity", "-Infinity", "nan", "-nan", "inf", "-inf", "null", '"nan"', '"-inf"'],
)
def test_every_spelling_of_non_finite(parser, loss_text):
    record = parser.parse(f'{{"step": 4, "loss": {loss_text}, "dt": 0.1}}')
    assert record is not None and record.step == 4 and record.dt == 0.1
    assert not math.isfinite(record.loss)


def test_orjson_writer_nan_round_trip(parser):
    line = orjson.dumps({"step": 8, "loss": math.nan}).decode()
    assert math.isnan(parser.parse(line).loss)


@pytest.mark.parametrize(
    "line",
    [
        '{"loss": 3.0}',
        '{"step": "12", "loss": 3.0}',
        '{"step": true, "loss": 3.0}',
        '{"step": 1, "loss": "abc"}',
        '{"step": 1, "loss": 3.0',
        '["step", "loss"]',
        '{"eval_loss": 1.0}',
        "step: 1, loss: 3.0",
        "",
    ],
)
def test_other_lines(parser, line):
    assert parser.parse(line) is None
