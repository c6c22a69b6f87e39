"""The `llmc` parser: llm.c's per-step lines.

    step   12/5000 | train loss 3.412345 | norm 1.2000 | lr 6.00e-04 | 250.12 ms
        | 31.2% bf16 MFU | 131072 tok/s                        (one line; train_gpt2.cu)
    step    1/74 | loss 11.010923 (+nanz)| norm 15.3295 (+nanz)| lr 8.57e-06
        | 3521.37 ms | -100.0% bf16 MFU | 148895 tok/s          (newer llm.c, with z-scores)
    step 0: train loss 5.356189 (took 1452.121000 ms)          (the CPU reference, train_gpt2.c)

dt comes from the milliseconds field. Extras: total (planned steps), norm, lr, mfu as a
fraction (0.312; left out when llm.c prints a negative MFU, its "unknown GPU" marker) and
tok_s. C's printf writes a diverged loss as `nan`, `-nan` or `inf`, which float() accepts.
`val loss` lines are not steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainwarden.plugins.api import StepRecord

_HEAD = re.compile(
    r"\s*step\s+([0-9]{1,18})\s*(?:/\s*([0-9]{1,18}))?\s*[:|]\s*(?:train\s+)?loss\s+([^\s|(,]+)",
    re.ASCII,
).match
_MS = re.compile(r"([0-9][0-9.]*(?:e[-+]?[0-9]+)?)\s*ms\b", re.ASCII)
_NORM = re.compile(r"\bnorm\s+([^\s|(,]+)", re.ASCII)
_LR = re.compile(r"\blr\s+([^\s|(,]+)", re.ASCII)
_MFU = re.compile(r"(-?[0-9][0-9.]*)\s*%\s*(?:\w+\s+)?MFU", re.ASCII)
_TOK_S = re.compile(r"([0-9][0-9.]*)\s*tok/s", re.ASCII)


def _float(pattern: re.Pattern[str], text: str) -> float | None:
    match = pattern.search(text)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


class LlmcParser:
    """Parses llm.c `step N/T | train loss X | ... | D ms | ...` lines."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def parse(self, line: str) -> StepRecord | None:
        try:
            return self._parse(line)
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
