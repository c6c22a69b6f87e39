"""Everything a plugin needs. Third-party plugins import only this module.

A log parser turns one line of trainer output into a StepRecord (or an EvalRecord for a
held-out evaluation line, or None when the line is neither). A checkpoint format recognises committed and in-flight
checkpoint names in the checkpoint directory and verifies a committed one, raising
CheckpointInvalid with the reason when it fails; a plugin whose options make no sense
raises ConfigError. Neither may import torch at module level: the daemon and TUI must
start fast.

A plugin is registered through an entry point of the distribution that ships it, in the
group `trainwarden.formats` or `trainwarden.parsers`, under the name a config uses:

    [project.entry-points."trainwarden.formats"]
    my-format = "my_package.formats:MyFormat"

This module imports only the standard library and trainwarden's errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainwarden.supervisor.errors import CheckpointInvalid, ConfigError, TrainwardenError

__all__ = [
    "CheckpointFormat",
    "CheckpointInfo",
    "CheckpointInvalid",
    "ConfigError",
    "EvalRecord",
    "LogParser",
    "StepRecord",
    "TrainwardenError",
]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One optimisation step as the trainer logged it."""

    step: int
    loss: float
    """Training loss; may be nan or inf (a divergence)."""
    dt: float | None = None
    """Seconds the step took, when the line says."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Other `key: value` pairs on the line (lr, arm, tokens, ...)."""


@dataclass(frozen=True, slots=True)
class EvalRecord:
    """One held-out evaluation as the trainer logged it: never a training step, so it
    moves neither the step count nor the divergence policy (a nan here is reported only)."""

    step: int
    """The training step the evaluation was made at."""
    loss: float
    """Validation loss; may be nan or inf."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Other values on the line (per-arm validation losses, perplexity, ...)."""


class LogParser(Protocol):
    """Parses trainer output lines. Constructed with the `[telemetry]` options."""

    def parse(self, line: str) -> StepRecord | EvalRecord | None:
        """The step (or evaluation) this line reports, or None for any other line (never
        raises). Returning EvalRecord is optional: a parser that never does is complete."""
        ...


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """What verification learned about a committed checkpoint."""

    step: int
    path: Path
    bytes: int
    n_params: int | None = None
    """Parameter count from the file's header, when the format records it."""


class CheckpointFormat(Protocol):
    """A checkpoint naming and verification scheme. Constructed with `[checkpoints]` options."""

    name: str

    def step_of(self, path: Path) -> int | None:
        """The step of a committed checkpoint's main path, or None if not one of ours."""
        ...

    def is_in_flight(self, path: Path) -> bool:
        """True for a write in progress (a temporary name): never counted or resumed."""
        ...

    def verify(self, path: Path) -> CheckpointInfo:
        """Check the committed checkpoint; raise CheckpointInvalid with the reason."""
        ...

    def companions(self, path: Path) -> list[Path]:
        """Files that belong to this checkpoint (sidecars): moved and deleted with it."""
        ...

    # Optional, for formats whose checkpoint is a folder written in place:
    #   def commits_folder(self, path: Path) -> bool
    # True when closing (or renaming into place) this file inside a checkpoint folder
    # commits the folder (hf-trainer: trainer_state.json).
    #   def name_for(self, step: int) -> str
    # The committed name of a checkpoint of `step` (hf-trainer: checkpoint-600): how the
    # snapshots of a fixed folder ([checkpoints] fixed_commit_file) are named.
