"""What the command line asked for, parsed and range-checked (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_BAD_DATA_STEPS = 50
"""--bad-data-steps unless given: long enough that a spike detector with patience 5 and
the rollback after it are well inside the region."""


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
    sync_save: bool = False
    """Write each checkpoint inside the step loop (the old way) instead of in the background."""
    compile: bool = False
    """Run the model's forward and backward through torch.compile."""
    crash_at_step: int | None = None
    nan_at_step: int | None = None
    hang_at_step: int | None = None
    bad_data_at_step: int | None = None
    """The first data step whose batch is garbage (keyed on the data step, not the step)."""
    bad_data_steps: int = DEFAULT_BAD_DATA_STEPS
    """How many data steps from bad_data_at_step on are garbage."""
