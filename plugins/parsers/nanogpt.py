"""The `nanogpt` parser: nanoGPT's `train.py` per-iteration lines.

    iter 120: loss 3.4100, time 250.00ms, mfu 31.00%

dt comes from the milliseconds. Extras: mfu as a fraction (0.31). nanoGPT prints
`mfu -100.00%` until it has a few iterations to average over: that means unknown and is
left out. The evaluation lines (`step 250: train loss 3.41, val loss 3.45`) are not steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainwarden.plugins.api import StepRecord
from trainwarden.plugins.parsers._common import EMPTY_EXTRAS

_ITER = re.compile(
    r"\s*iter\s+([0-9]{1,18})\s*:\s*loss\s+([^,\s]+)\s*"
    r"(?:,\s*time\s+([0-9][0-9.]*(?:e[-+]?[0-9]+)?)\s*ms)?"
    r"(?:\s*,\s*mfu\s+(-?[0-9][0-9.]*)\s*%)?",
    re.ASCII,
).match


class NanoGptParser:
    """Parses nanoGPT `iter N: loss X, time D ms, mfu P%` lines."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def parse(self, line: str) -> StepRecord | None:
        try:
            match = _ITER(line)
            if match is None:
                return None
            step_text, loss_text, ms_text, mfu_text = match.groups()
            loss = float(loss_text)
            dt = float(ms_text) / 1000.0 if ms_text is not None else None
            extras: Mapping[str, Any] = EMPTY_EXTRAS
            if mfu_text is not None:
                mfu_percent = float(mfu_text)
                if mfu_percent >= 0:
                    extras = {"mfu": mfu_percent / 100.0}
            return StepRecord(int(step_text), loss, dt, extras)
        except Exception:
            return None
