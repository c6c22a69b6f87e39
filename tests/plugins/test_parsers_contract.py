"""Properties every built-in parser keeps, reached through the entry points."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainwarden.plugins.api import EvalRecord, StepRecord
from trainwarden.supervisor import registry as plugins

NAMES = ["step-line", "llmc", "nanogpt", "hf-trainer", "jsonl"]

TEMPLATES = {
    "step-line": "step: 120, loss: {loss}, dt: 0.25",
    "llmc": "step   12/5000 | train loss {loss} | norm 1.2 | lr 6.00e-04 | 250.12 ms",
    "nanogpt": "iter 120: loss {loss}, time 250.00ms, mfu 31.00%",
    "hf-trainer": "{{'loss': {loss}, 'grad_norm': 1.2, 'learning_rate': 0.0006, 'epoch': 0.12}}",
    "jsonl": '{{"step": 120, "loss": {loss}, "dt": 0.25}}',
}

# Fragments of real step lines, so random text often gets deep into the parsers.
FRAGMENTS = st.sampled_from(
    [
        "step",
        ": ",
        "loss",
        "dt",
        ", ",
        "iter",
        " | ",
        "train loss",
        "val loss",
        "eval_loss",
        "'eval_loss'",
        "ms",
        "%",
        "MFU",
        "{",
        "}",
        "'loss'",
        '"loss"',
        '"step"',
        "nan",
        "-inf",
        "1e999",
        "12",
        "3.41",
        "\r",
        "\n",
        "\x00",
        "é",
        "[",
        "]",
        "(",
        ")",
        "tok/s",
        "/",
        "-",
        "**",
        "'",
        '"',
    ]
)
LINES = st.one_of(st.text(), st.lists(st.one_of(FRAGMENTS, st.text(max_size=3))).map("".join))


@pytest.mark.parametrize("name", NAMES)
def test_entry_point_loads_and_parses(name):
    parser = plugins.log_parser(name, {"logging_steps": 1})
    record = parser.parse(TEMPLATES[name].format(loss="3.4100"))
    assert isinstance(record, StepRecord)
    assert record.loss == 3.41


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=300, deadline=None)
@given(line=LINES)
def test_parse_never_raises(name, line):
    record = plugins.log_parser(name, {}).parse(line)
    assert record is None or (
        isinstance(record, StepRecord | EvalRecord) and isinstance(record.step, int)
    )


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_loss_is_a_record_not_a_skip(name):
    line = TEMPLATES[name].format(loss="NaN" if name == "jsonl" else "nan")
    record = plugins.log_parser(name, {}).parse(line)
    assert record is not None and math.isnan(record.loss)
