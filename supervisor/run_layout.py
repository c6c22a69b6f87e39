"""The names of the daemon's own files in a run directory; standard library only.

`store.rundir.RunFiles` builds its paths from them, and the config reads them without
the store to keep the trainer's log and checkpoints off them. The files the trainer
shares (policy.json, .state.json, .samples.json) are the contract's.
"""

from __future__ import annotations

STATE_DIR = ".trainwarden"
"""The daemon's private folder: journal, lock, pid files, the control socket by default."""
LOSS_HISTORY = ".loss.json"
"""The loss history the daemon writes from the trainer's step lines."""
EVAL_HISTORY = ".eval.json"
"""The validation history the daemon writes from the trainer's evaluations."""
