"""One real daemon and scripted trainer (with its data bandit and samples) for every TUI
test that needs a live run. Under pytest-xdist those tests share one worker (the xdist
group `tests/tui live`, set in tests/conftest.py), so the run is started once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import DaemonProcess, scripted_run
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
    """A running scripted trainer (it never finishes during the tests) under a daemon: 100,000
    steps, a step every 30 ms, a checkpoint every 50 steps and on SIGUSR1, three data arms."""
    run_dir = scripted_run(
        tmp_path_factory.mktemp("tui") / "live",
        *("--steps", "100000", "--save-every", "50", "--dt", "0.03", "--usr1", "save"),
        *("--arms", "docs,code,tests", "--sample-every", "10", "--n-params", "120576"),
        trainer={"total_steps": 100_000},
        checkpoints={"keep_last": 3},
        telemetry={"vocab_size": 256},
    )
    run = LiveRun(run_dir)
    try:
        run.start_daemon()
        yield run
    finally:
        for daemon in run.daemons:
            daemon.cleanup()
