"""SIGTERM/SIGINT (save and stop) and SIGUSR1 (save and go on) as flags.

Handlers only set flags; the loop acts on them at step boundaries. A signal that
arrives mid-step or mid-save therefore never interrupts a write: the step finishes, the
save completes, and the flag is seen afterwards.
"""

from __future__ import annotations

import signal
from types import FrameType


class SignalFlags:
    def __init__(self) -> None:
        self.stop_requested = False
        self.save_requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        # Ctrl-C in a tmux pane should stop as gracefully as the daemon's SIGTERM.
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_save)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True

    def _on_save(self, signum: int, frame: FrameType | None) -> None:
        self.save_requested = True
