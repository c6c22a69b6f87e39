"""Deciding whether a checkpoint can be resumed from exactly (no torch: refusals are fast).

A resume is refused (exit 2, before step 1) rather than done approximately: a file that
fails andrea-bin verification, a parameter count that is not this model's, a missing
sidecar, or data that differs from what the checkpoint was trained on. An arm that has
disappeared is not a refusal: the bandit lists it as a zombie and trains on the rest.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.supervisor.contract import ENV_PIVOT, ENV_RESUME, PIVOT_ON, sidecar_path
from trainwarden.supervisor.errors import CheckpointInvalid
from trainwarden.trainer.corpus import Arm
from trainwarden.trainer.errors import ResumeRefused
from trainwarden.trainer.presets import Preset

FINGERPRINT_SETTINGS = ("seq_len", "batch_size", "grad_accum", "seed")
REQUIRED_SIDECAR_KEYS = ("optimizer", "bandit", "data_fingerprint")


@dataclass(frozen=True)
class ResumePoint:
    """A verified checkpoint and its sidecar; the regions are read later, with torch."""

    path: Path
    step: int
    sidecar: dict[str, Any]


def resume_path(flag: str | None) -> Path | None:
    """The checkpoint to resume from: --resume wins over TRAINWARDEN_RESUME; None = fresh."""
    chosen = flag or os.environ.get(ENV_RESUME, "")
    return Path(chosen) if chosen else None


def pivot_requested(flag: bool) -> bool:
    return flag or os.environ.get(ENV_PIVOT, "") == PIVOT_ON


def data_fingerprint(arms: dict[str, Arm], preset: Preset, seed: int) -> dict[str, Any]:
    return {
        "arms": {name: arm.fingerprint for name, arm in arms.items()},
        "seq_len": preset.seq_len,
        "batch_size": preset.batch_size,
        "grad_accum": preset.grad_accum,
        "seed": seed,
    }


def fingerprint_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between the data a checkpoint saw and the data now, one phrase each."""
    changes = [
        f"{key} {saved.get(key)} -> {current[key]}"
        for key in FINGERPRINT_SETTINGS
        if saved.get(key) != current[key]
    ]
    saved_arms = saved.get("arms", {})
    changes.extend(
        f"arm {name!r} content changed"
        for name, fingerprint in current["arms"].items()
        if name in saved_arms and saved_arms[name] != fingerprint
    )
    return changes


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    try:
        sidecar = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ResumeRefused(f"its sidecar {path.name} is unreadable: {exc}") from None
    if not isinstance(sidecar, dict):
        raise ResumeRefused(f"its sidecar {path.name} is not a JSON object")
    return sidecar


def _check(path: Path, preset: Preset, fingerprint: dict[str, Any]) -> ResumePoint:
    if not path.is_file():
        raise ResumeRefused("no such file")
    try:
        info = AndreaBin().verify(path)
    except CheckpointInvalid as exc:
        raise ResumeRefused(str(exc)) from None
    side = sidecar_path(path)
    sidecar = _read_sidecar(side)
    if sidecar is not None and sidecar.get("preset") != preset.name:
        raise ResumeRefused(f"preset {sidecar.get('preset')!r} -> {preset.name!r}")
    if info.n_params != preset.n_params:
        raise ResumeRefused(
            f"it holds {info.n_params} parameters, the {preset.name} model has {preset.n_params}"
        )
    if sidecar is None:
        raise ResumeRefused(
            f"its sidecar {side.name} is missing; an exact resume needs the bandit, optimizer"
            " step counts and data fingerprint kept there"
        )
    if sidecar.get("step") != info.step:
        raise ResumeRefused(f"its sidecar {side.name} is for step {sidecar.get('step')}")
    missing = [key for key in REQUIRED_SIDECAR_KEYS if not isinstance(sidecar.get(key), dict)]
    if missing:
        raise ResumeRefused(f"its sidecar {side.name} lacks {', '.join(missing)}")
    changes = fingerprint_changes(sidecar["data_fingerprint"], fingerprint)
    if changes:
        raise ResumeRefused("the data differs from what it was trained on: " + "; ".join(changes))
    return ResumePoint(path, info.step, sidecar)


def open_resume_point(path: Path, preset: Preset, fingerprint: dict[str, Any]) -> ResumePoint:
    """The verified checkpoint at `path`, or ResumeRefused saying why it cannot be used."""
    try:
        return _check(path, preset, fingerprint)
    except ResumeRefused as exc:
        raise ResumeRefused(f"cannot resume from {path}: {exc}") from None
