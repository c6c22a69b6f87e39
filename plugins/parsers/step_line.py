"""The `step-line` parser: `step: 120, loss: 3.41, dt: 0.25[, key: value ...]`.

The line must start with `step:` (leading whitespace and a progress bar ended by `\\r`
are tolerated); a prefix such as `eval step:` is deliberately not a training step.
Values after loss are `key: value` pairs; `dt` (seconds) among them becomes the record's
dt, the rest become extras, converted to int or float where they parse as numbers.

`eval: step 600, val_loss 3.12[, val_docs: 3.0 ...]` (colons after `step` and
`val_loss` optional) is a held-out evaluation: an EvalRecord, its pairs the extras.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainwarden.plugins.api import EvalRecord, StepRecord
from trainwarden.plugins.parsers._common import EMPTY_EXTRAS, SLOT_SETTERS, fast_record, to_value

# The exact shape trainers print on every step: one anchored regex, no extras to split.
# This path runs hundreds of thousands of times a second when a log is replayed.
_COMMON = re.compile(r"step: ([0-9]{1,18}), loss: ([^,]+), dt: ([^,]+)$", re.ASCII).match

_new_record = object.__new__
if SLOT_SETTERS is not None:
    _set_step, _set_loss, _set_dt, _set_extras = SLOT_SETTERS

_GENERAL = re.compile(
    r"\s*step:\s*([0-9]{1,18})\s*,\s*loss:\s*([^,\s]+)\s*(.*)", re.ASCII | re.DOTALL
).match
_EVAL = re.compile(
    r"\s*eval:\s*step:?\s*([0-9]{1,18})\s*,\s*val_loss:?\s*([^,\s]+)\s*(.*)",
    re.ASCII | re.DOTALL,
).match


def _pairs(rest: str) -> dict[str, Any]:
    """`, dt: 0.25, lr: 6e-4, arm: web` -> {'dt': 0.25, 'lr': 0.0006, 'arm': 'web'}."""
    pairs: dict[str, Any] = {}
    for piece in rest.split(","):
        key, colon, value = piece.partition(":")
        key = key.strip()
        if colon and key:
            pairs[key] = to_value(value)
    return pairs


class StepLineParser:
    """Parses `step: N, loss: X, dt: S` lines with optional extra `key: value` pairs."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        if SLOT_SETTERS is None:
            self.parse = self._parse_with_constructor  # type: ignore[method-assign]

    def parse(self, line: str) -> StepRecord | EvalRecord | None:
        # The hot path is written out in full: at half a microsecond a step, one more
        # function call per line is a measurable share of it.
        try:
            match = _COMMON(line)
            if match is not None:
                step, loss_text, dt_text = match.groups()
                try:
                    loss = float(loss_text)
                    dt = float(dt_text)
                except ValueError:
                    return self._parse_general(line)  # e.g. `dt: 0.25 s`
                record = _new_record(StepRecord)
                _set_step(record, int(step))
                _set_loss(record, loss)
                _set_dt(record, dt)
                _set_extras(record, EMPTY_EXTRAS)
                return record
            return self._parse_general(line)
        except Exception:
            return None

    def _parse_with_constructor(self, line: str) -> StepRecord | EvalRecord | None:
        try:
            match = _COMMON(line)
            if match is not None:
                step, loss_text, dt_text = match.groups()
                try:
                    return fast_record(int(step), float(loss_text), float(dt_text), EMPTY_EXTRAS)
                except ValueError:
                    pass
            return self._parse_general(line)
        except Exception:
            return None

    @staticmethod
    def _parse_general(line: str) -> StepRecord | EvalRecord | None:
        if "\r" in line:
            line = line.rstrip("\r\n").rpartition("\r")[2]
        match = _GENERAL(line)
        if match is None:
            # Past every step line's path: an evaluation costs nothing per training step.
            return _parse_eval(line) if "eval:" in line else None
        step_text, loss_text, rest = match.groups()
        try:
            loss = float(loss_text)
        except ValueError:
            return None
        extras = _pairs(rest) if rest.startswith(",") else {}
        dt_value = extras.pop("dt", None)
        dt = float(dt_value) if isinstance(dt_value, int | float) else None
        return StepRecord(int(step_text), loss, dt, extras or EMPTY_EXTRAS)


def _parse_eval(line: str) -> EvalRecord | None:
    match = _EVAL(line)
    if match is None:
        return None
    step_text, loss_text, rest = match.groups()
    try:
        loss = float(loss_text)
    except ValueError:
        return None
    extras = _pairs(rest) if rest.startswith(",") else {}
    return EvalRecord(int(step_text), loss, extras or EMPTY_EXTRAS)
