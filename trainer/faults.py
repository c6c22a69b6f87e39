"""Fault injection for testing a supervisor: crash, NaN or hang once at a chosen step,
or a region of bad data.

A crash, NaN or hang fires once per run directory: a marker `RUN/.faults/<kind>-<step>`
is made before it fires, and a restarted trainer that finds the marker trains on past the
step, as a flaky machine would after a restart. Bad data is no event but a property of
the data: every start that consumes those data steps gets the garbage again (a plain
rollback replays the spike), and only skipping them (TRAINWARDEN_SKIP_DATA) cures it, as
with the loss spikes of large runs.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainwarden.trainer.options import DEFAULT_BAD_DATA_STEPS

CRASH_EXIT_STATUS = 3


@dataclass(frozen=True)
class Faults:
    run_dir: Path
    crash_at_step: int | None = None
    nan_at_step: int | None = None
    hang_at_step: int | None = None
    bad_data_at_step: int | None = None
    bad_data_steps: int = DEFAULT_BAD_DATA_STEPS

    def _fires(self, kind: str, planned: int | None, step: int) -> bool:
        if planned != step:
            return False
        marker = self.run_dir / ".faults" / f"{kind}-{step}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        os.fsync(fd)
        os.close(fd)
        return True

    def bad_data(self, data_step: int) -> bool:
        """Whether the data of `data_step` (contract.data_step, not the step) is garbage."""
        first = self.bad_data_at_step
        return first is not None and first <= data_step < first + self.bad_data_steps

    def nan_fires(self, step: int) -> bool:
        return self._fires("nan", self.nan_at_step, step)

    def after_step_logged(self, step: int) -> None:
        """Crash or hang now if planned for this step (and not fired before)."""
        if self._fires("crash", self.crash_at_step, step):
            print(f"trainer: injected crash at step {step}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(CRASH_EXIT_STATUS)
        if self._fires("hang", self.hang_at_step, step):
            print(f"trainer: injected hang at step {step}", file=sys.stderr, flush=True)
            # Signal handlers still run and set their flags, but nobody looks at them
            # any more: only SIGKILL ends this, as with a wedged data loader.
            while True:
                time.sleep(3600)
