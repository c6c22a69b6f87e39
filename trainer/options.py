"""What the command line asked for, parsed and range-checked (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Options:
    run_dir: Path
    preset: str
    steps: int
    """Planned total steps of the run; the LR schedule ends here and so does a resumed run."""
    save_every: int
    sample_every: int
    """Steps between samples; 0 means never."""
    eval_every: int
    """Steps between validation losses on the held-out split; 0 means never."""
    seed: int
    device: str
    """auto, cpu or cuda."""
    resume: str | None
    """--resume; when None, TRAINWARDEN_RESUME decides."""
    fresh_bandit: bool
    arms: tuple[str, ...]
    crash_at_step: int | None = None
    nan_at_step: int | None = None
    hang_at_step: int | None = None
