"""Data skipped after loss spikes, and the LR scale: read from the environment, checked
against the checkpoint (no torch: a refusal costs a fraction of a second).

The skip windows (TRAINWARDEN_SKIP_DATA) decide the data position of every step,
`contract.data_step(step, windows)`, so they are part of what a checkpoint was trained
on: its sidecar keeps the list, and a resume whose list does not start with it would
replay data the run already consumed, or skip data it did not. A window may only start
after the checkpoint it resumes from: one that started earlier would change the data of
steps the checkpoint has already trained on.

The LR scale (TRAINWARDEN_LR_SCALE) is the factor in effect, not a factor per rollback:
the daemon passes the product of every rollback's scale, so a run killed and resumed any
number of times under the same environment trains at the same rate, never one compounded
per restart. It applies from the resumed step on; the sidecar records it.
"""

from __future__ import annotations

import os
from typing import Any

from trainwarden.supervisor.contract import (
    ENV_LR_SCALE,
    ENV_SKIP_DATA,
    SkipWindow,
    parse_lr_scale,
    parse_skip_data,
    skip_data_text,
)
from trainwarden.trainer.errors import ResumeRefused, UsageError
from trainwarden.trainer.resume import ResumePoint

SIDECAR_SKIP_KEY = "skip_data"
SIDECAR_LR_SCALE_KEY = "lr_scale"


def skip_windows_from_env() -> tuple[SkipWindow, ...]:
    try:
        windows = parse_skip_data(os.environ.get(ENV_SKIP_DATA))
    except ValueError as exc:
        raise UsageError(f"{exc} (example: {ENV_SKIP_DATA}='[[101,400]]')") from None
    return tuple(windows)


def lr_scale_from_env() -> float:
    try:
        return parse_lr_scale(os.environ.get(ENV_LR_SCALE))
    except ValueError as exc:
        raise UsageError(f"{exc} (example: {ENV_LR_SCALE}=0.9)") from None


def saved_windows(sidecar: dict[str, Any]) -> tuple[SkipWindow, ...]:
    """The windows a checkpoint was trained under (none for one saved before skips)."""
    try:
        return tuple(parse_skip_data(skip_data_text(sidecar.get(SIDECAR_SKIP_KEY, []))))
    except (TypeError, ValueError):
        raise ResumeRefused(f"its sidecar's {SIDECAR_SKIP_KEY} is not a list of windows") from None


def saved_lr_scale(sidecar: dict[str, Any]) -> float:
    scale = sidecar.get(SIDECAR_LR_SCALE_KEY, 1.0)
    return float(scale) if isinstance(scale, int | float) else 1.0


def check_windows(point: ResumePoint, windows: tuple[SkipWindow, ...]) -> None:
    """Refuse a resume whose windows would change the data the checkpoint trained on."""
    saved = saved_windows(point.sidecar)
    if windows[: len(saved)] != saved:
        raise ResumeRefused(
            f"cannot resume from {point.path}: it was trained with the data windows "
            f"{skip_data_text(saved)} skipped and {ENV_SKIP_DATA} is "
            f"{skip_data_text(windows)}; pass the run's whole list, which starts with them"
        )
    for start, end in windows[len(saved) :]:
        if start <= point.step:
            raise ResumeRefused(
                f"cannot resume from {point.path}: the skip window [{start}, {end}) starts at"
                f" or before its step {point.step}; a window starts after the checkpoint it"
                f" resumes from (at {point.step + 1} or later)"
            )
