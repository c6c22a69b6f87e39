"""One real daemon and reference trainer for every TUI test that needs a live run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import DaemonProcess, reference_run
from trainwarden.tui.app import TrainwardenApp
from trainwarden.tui.source import DaemonSource


@dataclass
class LiveRun:
    run_dir: Path
    daemons: list[DaemonProcess] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.run_dir / ".trainwarden" / "control.sock"

    @property
    def daemon(self) -> DaemonProcess:
        return self.daemons[-1]

    def start_daemon(self) -> DaemonProcess:
        daemon = DaemonProcess(self.run_dir)
        self.daemons.append(daemon)
        return daemon.start()

    def app(self, read_only: bool = False) -> TrainwardenApp:
        return TrainwardenApp(
            DaemonSource(self.socket, self.run_dir / "training.log"), read_only=read_only
        )


@pytest.fixture(scope="package")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """A running reference trainer (it never finishes during the tests) under a daemon."""
    run_dir = reference_run(
        tmp_path_factory.mktemp("tui") / "live",
        100_000,
        50,
        # A short sleep per step keeps the trainer from taking a whole core from the tests.
        trainer={"env": {"TRAINER_TEST_STEP_SLEEP_S": "0.03", "OMP_NUM_THREADS": "1"}},
    )
    run = LiveRun(run_dir)
    try:
        run.start_daemon()
        yield run
    finally:
        for daemon in run.daemons:
            daemon.cleanup()
