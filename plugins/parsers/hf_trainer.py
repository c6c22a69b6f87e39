"""The `hf-trainer` parser: the dicts the Hugging Face Trainer prints when it logs.

    {'loss': 3.41, 'grad_norm': 1.2, 'learning_rate': 0.0006, 'epoch': 0.12}

The Trainer's printed dict has no step (its `epoch` is printed rounded to four digits,
so it cannot give one), so the step is the count of loss lines this parser has seen
times `[telemetry] logging_steps`; a `'step'` key wins when present (trainwarden's
callback, `trainwarden.integrations.hf`, adds the Trainer's global_step). The count starts
at zero with each parser instance; `resume_at(step)` continues it from a step: the
checkpoint a new trainer start resumed from, or, after a daemon restart, the last step
the current start recorded. The final `{'train_runtime': ...}` summary is not a step.

An evaluation dict (`{'eval_loss': 2.9, 'eval_runtime': 0.5, ..., 'epoch': 1.0}`, what
Trainer.evaluate logs) is an EvalRecord at its `'step'` if it has one, else at the last
step this parser gave (the Trainer logs an evaluation after the training log of the same
step); it counts no step. Its other keys are extras, eval_runtime and the like.

Lines are Python literals, read with a restricted walker over `ast` (what
ast.literal_eval accepts, plus the bare words `nan` and `inf` that Python's repr prints
for non-finite floats and that literal_eval rejects). Nothing is ever evaluated.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from typing import Any

from trainwarden.plugins.api import EvalRecord, StepRecord
from trainwarden.plugins.parsers._common import options_int, to_float

# Real Trainer dicts are a few hundred characters; parsing a huge line with ast is slow.
MAX_LINE_CHARS = 16_384

_BARE_WORDS = {
    "nan": math.nan,
    "NaN": math.nan,
    "inf": math.inf,
    "Inf": math.inf,
    "Infinity": math.inf,
    "infinity": math.inf,
}


def _literal(node: ast.AST) -> Any:
    """The value of a literal expression node; raises ValueError for anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _BARE_WORDS:
        return _BARE_WORDS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _literal(node.operand)
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Dict):
        pairs = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:  # `**mapping` unpacking: not a literal
                raise ValueError("not a literal: ** in a dict")
            pairs[_literal(key)] = _literal(value)
        return pairs
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(element) for element in node.elts]
    raise ValueError(f"not a literal: {type(node).__name__}")


def parse_dict_line(line: str) -> dict[str, Any] | None:
    """The dict a line prints (after any progress bar ended by \\r), or None."""
    if len(line) > MAX_LINE_CHARS:
        return None
    text = line.rpartition("\r")[2].strip() if "\r" in line else line.strip()
    start = text.find("{")
    end = text.rfind("}")
    if start < 0 or end < start:
        return None
    tree = ast.parse(text[start : end + 1], mode="eval")
    value = _literal(tree.body)
    return value if isinstance(value, dict) else None


class HfTrainerParser:
    """Parses the Hugging Face Trainer's logged dicts; counts steps when they lack one."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self.logging_steps = options_int(self.options, "logging_steps", 1)
        self._loss_lines = 0
        self._step_offset = 0
        self._last_step = 0

    def resume_at(self, step: int) -> None:
        """Count the following loss lines from `step` (the checkpoint a trainer resumed)."""
        self._step_offset = step
        self._loss_lines = 0
        self._last_step = step

    def parse(self, line: str) -> StepRecord | EvalRecord | None:
        # Cheap tests first: most lines of a Trainer log are progress bars and warnings.
        if "'loss'" in line or '"loss"' in line:
            return self._step(line)
        if "eval_loss" in line:
            return self._evaluation(line)
        return None

    def _step(self, line: str) -> StepRecord | None:
        try:
            logged = parse_dict_line(line)
            if logged is None or "loss" not in logged:
                return None
            loss = to_float(logged.pop("loss"))
            if loss is None:
                return None
            self._loss_lines += 1
            step = _logged_step(logged)
            if step is None:
                step = self._step_offset + self._loss_lines * self.logging_steps
            self._last_step = step
            extras = {str(key): value for key, value in logged.items()}
            return StepRecord(step, loss, None, extras)
        except Exception:
            return None

    def _evaluation(self, line: str) -> EvalRecord | None:
        try:
            logged = parse_dict_line(line)
            if logged is None or "eval_loss" not in logged:
                return None
            loss = to_float(logged.pop("eval_loss"))
            if loss is None:
                return None
            step = _logged_step(logged)
            extras = {str(key): value for key, value in logged.items()}
            return EvalRecord(self._last_step if step is None else step, loss, extras)
        except Exception:
            return None


def _logged_step(logged: dict[str, Any]) -> int | None:
    """The dict's own `'step'` (removed from it), when it holds a whole number."""
    step = logged.pop("step", None)
    if isinstance(step, float) and step.is_integer():
        return int(step)
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    return None
