"""Helpers the built-in parsers share: value conversion and a fast StepRecord builder."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from trainwarden.plugins.api import StepRecord

EMPTY_EXTRAS: Mapping[str, Any] = types.MappingProxyType({})
"""Shared by every record without extras: one immutable mapping instead of a dict per line."""


def to_value(text: str) -> int | float | str:
    """`12` -> 12, `6e-4` -> 0.0006, `nan`/`-inf` -> non-finite float, anything else as text."""
    text = text.strip()
    digits = text[1:] if text[:1] in ("-", "+") else text
    try:
        # Test for an integer instead of trying int() first: a raised ValueError for
        # every float value would cost more than parsing the whole line.
        if digits.isdigit() and digits.isascii():
            return int(text)
        return float(text)
    except ValueError:
        return text


def to_float(value: Any) -> float | None:
    """A float from a number or numeric text (`nan`, `-inf` included), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def options_int(options: Mapping[str, Any], key: str, default: int) -> int:
    value = options.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return default


def _slot_setters() -> tuple[Any, ...] | None:
    names = tuple(f.name for f in dataclasses.fields(StepRecord))
    if names != ("step", "loss", "dt", "extras"):
        return None
    try:
        return tuple(StepRecord.__dict__[name].__set__ for name in names)
    except (KeyError, AttributeError):
        return None


SLOT_SETTERS = _slot_setters()
"""The descriptors' __set__ for step, loss, dt, extras; None if StepRecord changed shape."""


def fast_record(step: int, loss: float, dt: float | None, extras: Mapping[str, Any]) -> StepRecord:
    """StepRecord(step, loss, dt, extras), built through its slot descriptors.

    A frozen dataclass's __init__ goes through object.__setattr__ once per field, which is
    a third of the step-line parser's time per line; writing the slots directly gives the
    same object. Falls back to the constructor if StepRecord ever changes shape.
    """
    if SLOT_SETTERS is None:
        return StepRecord(step, loss, dt, extras)
    record = object.__new__(StepRecord)
    set_step, set_loss, set_dt, set_extras = SLOT_SETTERS
    set_step(record, step)
    set_loss(record, loss)
    set_dt(record, dt)
    set_extras(record, extras)
    return record
