"""Learning rate as a function of the global step: linear warmup, then cosine decay.

It depends only on the step and the run's planned length, so a resumed run continues
the schedule where it was instead of warming up again.
"""

from __future__ import annotations

import math

from trainwarden.trainer.presets import Preset


def warmup_steps(preset: Preset, total_steps: int) -> int:
    return max(1, min(preset.warmup_steps, total_steps // 10))


def lr_at(step: int, preset: Preset, total_steps: int) -> float:
    """Learning rate for (1-based) `step` of a run planned for `total_steps`."""
    warmup = warmup_steps(preset, total_steps)
    if step <= warmup:
        return preset.max_lr * step / warmup
    if step >= total_steps:
        return preset.min_lr
    progress = (step - warmup) / (total_steps - warmup)
    return preset.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (
        preset.max_lr - preset.min_lr
    )
