"""The `nanogpt` parser: nanoGPT's `train.py` per-iteration lines.

    iter 120: loss 3.4100, time 250.00ms, mfu 31.00%
    step 250: train loss 3.4100, val loss 3.4500

dt comes from the milliseconds. Extras: mfu as a fraction (0.31). nanoGPT prints
`mfu -100.00%` until it has a few iterations to average over: that means unknown and is
left out. A `step N: train loss X, val loss Y` line is the evaluation nanoGPT makes every
`eval_interval` iterations, before iteration N trains: an EvalRecord at step N with loss Y
and extra train_loss X (its estimate over training batches), never a step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainwarden.plugins.api import EvalRecord, StepRecord
from trainwarden.plugins.parsers._common import EMPTY_EXTRAS

_ITER = re.compile(
    r"\s*iter\s+([0-9]{1,18})\s*:\s*loss\s+([^,\s]+)\s*"
    r"(?:,\s*time\s+([0-9][0-9.]*(?:e[-+]?[0-9]+)?)\s*ms)?"
    r"(?:\s*,\s*mfu\s+(-?[0-9][0-9.]*)\s*%)?",
    re.ASCII,
).match
_EVAL = re.compile(
    r"\s*step\s+([0-9]{1,18})\s*:\s*train\s+loss\s+([^,\s]+)\s*,\s*val\s+loss\s+(\S+)\s*$",
    re.ASCII,
).match


class NanoGptParser:
    """Parses nanoGPT `iter N: loss X, time D ms, mfu P%` lines and its evaluations."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def parse(self, line: str) -> StepRecord | EvalRecord | None:
        try:
            match = _ITER(line)
            if match is None:
                # Most lines are neither: a substring test turns them away cheaper than a regex.
                return _evaluation(line) if "val loss" in line else None
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


def _evaluation(line: str) -> EvalRecord | None:
    match = _EVAL(line)
    if match is None:
        return None
    step_text, train_text, val_text = match.groups()
    return EvalRecord(int(step_text), float(val_text), {"train_loss": float(train_text)})
