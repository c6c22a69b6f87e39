"""Everything decided before torch is imported: data, policy, and whether to resume.

Every refusal (bad policy, bad checkpoint, changed data) happens here, so a trainer that
will not resume exactly exits 2 in well under a second, before it has logged a step or
touched the checkpoint directory.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwarden.supervisor.contract import (
    POLICY_FILE,
    PolicyError,
    SkipWindow,
    load_policy,
    validate_policy,
)
from trainwarden.trainer.corpus import ARM_NAMES, Arm, build_arms
from trainwarden.trainer.errors import UsageError
from trainwarden.trainer.options import Options
from trainwarden.trainer.presets import PRESETS, Preset
from trainwarden.trainer.resume import (
    ResumePoint,
    data_fingerprint,
    open_resume_point,
    pivot_requested,
    resume_path,
)
from trainwarden.trainer.skips import (
    check_windows,
    lr_scale_from_env,
    saved_lr_scale,
    skip_windows_from_env,
)


def warn(message: str) -> None:
    print(f"trainer: warning: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Plan:
    options: Options
    preset: Preset
    arms: dict[str, Arm]
    policy: dict[str, Any]
    """The normalized policy over the arms in use."""
    fingerprint: dict[str, Any]
    resume: ResumePoint | None
    pivot: bool
    """Start the bandit fresh (keeping weights and moments)."""
    skip_windows: tuple[SkipWindow, ...]
    """Every data window the run skipped after a loss spike (contract.ENV_SKIP_DATA)."""
    lr_scale: float
    """The factor on the LR schedule from the first step trained (contract.ENV_LR_SCALE)."""


def _available_arms(options: Options) -> dict[str, Arm]:
    arms = build_arms(options.arms)
    for name in options.arms:
        if name not in arms:
            warn(f"arm {name!r} has too little data on this machine; training without it")
    if not arms:
        raise UsageError("no data arm has data on this machine (is the Python stdlib installed?)")
    return arms


def _load_policy(path: Path, available: list[str]) -> dict[str, Any]:
    # Valid against every arm the trainer knows (a policy may name an arm whose data is
    # missing here), then it must still work for the arms actually available.
    try:
        policy = load_policy(path, ARM_NAMES)
    except PolicyError as exc:
        raise UsageError(str(exc)) from None
    usable = {"arms": {a: b for a, b in policy["arms"].items() if a in available}}
    problems = validate_policy(usable, available)
    if problems:
        raise UsageError(f"{path}: with only arms {', '.join(available)}: {problems[0]}")
    return usable


def make_plan(options: Options) -> Plan:
    preset = PRESETS[options.preset]
    arms = _available_arms(options)
    policy = _load_policy(options.run_dir / POLICY_FILE, list(arms))
    fingerprint = data_fingerprint(arms, preset, options.seed)
    windows = skip_windows_from_env()
    lr_scale = lr_scale_from_env()
    path = resume_path(options.resume)
    point = None if path is None else open_resume_point(path, preset, fingerprint)
    if point is not None:
        check_windows(point, windows)
        saved_scale = saved_lr_scale(point.sidecar)
        if saved_scale != lr_scale:
            warn(f"LR scale {saved_scale:g} -> {lr_scale:g} from step {point.step + 1} on")
    pivot = pivot_requested(options.fresh_bandit)
    if pivot and point is None:
        warn("fresh bandit requested on a fresh start: nothing to pivot from")
    if point is not None:
        saved_total = point.sidecar.get("total_steps")
        if saved_total is not None and saved_total != options.steps:
            warn(f"--steps {saved_total} -> {options.steps}: the LR schedule changes from here on")
    return Plan(options, preset, arms, policy, fingerprint, point, pivot, windows, lr_scale)
