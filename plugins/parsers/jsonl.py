"""The `jsonl` parser: one JSON object per step, `{"step": 120, "loss": 3.41, "dt": 0.25}`.

Other keys become extras. A non-finite loss arrives in whatever form the trainer's JSON
library wrote it and is always read as a non-finite float, never dropped: Python's json
writes `NaN`/`Infinity` (not strict JSON, so orjson rejects them and the stdlib reads the
line instead), orjson writes `null`, some trainers write the string `"nan"` or even a bare
`nan`. Because orjson turns NaN into null, `"loss": null` means a non-finite loss.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

from trainwarden.plugins.api import StepRecord
from trainwarden.plugins.parsers._common import to_float

# Bare non-finite words after `:`, `[` or `,` in otherwise JSON text, rewritten to the
# spellings the stdlib json module accepts. Only tried on lines orjson rejected.
_BARE_NONFINITE = re.compile(
    r"([:\[,]\s*)(-?)(nan|NaN|NAN|inf|Inf|INF|infinity)(?=\s*[,}\]])", re.ASCII
)


def _rewrite_bare(match: re.Match[str]) -> str:
    prefix, sign, word = match.groups()
    if word.lower() == "nan":
        return f"{prefix}NaN"
    return f"{prefix}{sign}Infinity"


def _load(line: str) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(line)
    except ValueError:
        return json.loads(_BARE_NONFINITE.sub(_rewrite_bare, line))


class JsonlParser:
    """Parses JSON Lines step records with `step`, `loss` and optional `dt`."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def parse(self, line: str) -> StepRecord | None:
        if '"loss"' not in line:
            return None
        try:
            value = _load(line)
            if not isinstance(value, dict) or "loss" not in value:
                return None
            step = value.pop("step", None)
            if isinstance(step, float) and step.is_integer():
                step = int(step)
            if not isinstance(step, int) or isinstance(step, bool):
                return None
            raw_loss = value.pop("loss")
            loss = math.nan if raw_loss is None else to_float(raw_loss)
            if loss is None:
                return None
            dt = to_float(value.pop("dt", None))
            return StepRecord(step, loss, dt, value)
        except Exception:
            return None
