"""The `llmc` parser: llm.c's per-step lines.

    step   12/5000 | train loss 3.412345 | norm 1.2000 | lr 6.00e-04 | 250.12 ms
        | 31.2% bf16 MFU | 131072 tok/s                        (one line; train_gpt2.cu)
    step    1/74 | loss 11.010923 (+nanz)| norm 15.3295 (+nanz)| lr 8.57e-06
        | 3521.37 ms | -100.0% bf16 MFU | 148895 tok/s          (newer llm.c, with z-scores)
    step 0: train loss 5.356189 (took 1452.121000 ms)          (the CPU reference, train_gpt2.c)
    val loss 3.452301                                          (both)

dt comes from the milliseconds field. Extras: total (planned steps), norm, lr, mfu as a
fraction (0.312; left out when llm.c prints a negative MFU, its "unknown GPU" marker) and
tok_s. C's printf writes a diverged loss as `nan`, `-nan` or `inf`, which float() accepts.

A `val loss X` line is an EvalRecord at the last step this parser saw (0 before any):
llm.c evaluates at the top of its loop, after the update whose line it printed last, and
before the first update of a run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainwarden.plugins.api import EvalRecord, StepRecord
from trainwarden.plugins.parsers._common import EMPTY_EXTRAS

_HEAD = re.compile(
    r"\s*step\s+([0-9]{1,18})\s*(?:/\s*([0-9]{1,18}))?\s*[:|]\s*(?:train\s+)?loss\s+([^\s|(,]+)",
    re.ASCII,
).match
_MS = re.compile(r"([0-9][0-9.]*(?:e[-+]?[0-9]+)?)\s*ms\b", re.ASCII)
_NORM = re.compile(r"\bnorm\s+([^\s|(,]+)", re.ASCII)
_LR = re.compile(r"\blr\s+([^\s|(,]+)", re.ASCII)
_MFU = re.compile(r"(-?[0-9][0-9.]*)\s*%\s*(?:\w+\s+)?MFU", re.ASCII)
_TOK_S = re.compile(r"([0-9][0-9.]*)\s*tok/s", re.ASCII)
_VAL = re.compile(r"\s*val\s+loss\s+(\S+)\s*$", re.ASCII).match


def _float(pattern: re.Pattern[str], text: str) -> float | None:
    match = pattern.search(text)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


class LlmcParser:
    """Parses llm.c `step N/T | train loss X | ... | D ms | ...` and `val loss X` lines."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self.last_step = 0

    def parse(self, line: str) -> StepRecord | EvalRecord | None:
        try:
            record = self._parse(line)
            if record is not None:
                self.last_step = record.step
                return record
            # Most lines are neither: a substring test turns them away cheaper than a regex.
            validation = _VAL(line) if "val loss" in line else None
            if validation is None:
                return None
            return EvalRecord(self.last_step, float(validation.group(1)), EMPTY_EXTRAS)
        except Exception:
            return None

    @staticmethod
    def _parse(line: str) -> StepRecord | None:
        head = _HEAD(line)
        if head is None:
            return None
        step_text, total_text, loss_text = head.groups()
        loss = float(loss_text)
        rest = line[head.end() :]
        ms = _float(_MS, rest)
        extras: dict[str, Any] = {}
        if total_text is not None:
            extras["total"] = int(total_text)
        for key, pattern in (("norm", _NORM), ("lr", _LR), ("tok_s", _TOK_S)):
            value = _float(pattern, rest)
            if value is not None:
                extras[key] = value
        mfu_percent = _float(_MFU, rest)
        if mfu_percent is not None and mfu_percent >= 0:
            extras["mfu"] = mfu_percent / 100.0
        return StepRecord(int(step_text), loss, None if ms is None else ms / 1000.0, extras)
