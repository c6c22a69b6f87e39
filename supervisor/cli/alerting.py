"""`trainwarden alert-test RUN`: a test alert sent from this process (no daemon needed) to
every `[alerts]` URL and the command, with each one's result."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from trainwarden.supervisor.config import load_config
from trainwarden.supervisor.core.alerts import Alert
from trainwarden.supervisor.errors import ConfigError
from trainwarden.supervisor.shell.alerts import Sender


def cmd_alert_test(args: argparse.Namespace) -> int:
    cfg = load_config(Path(args.run_dir), check_plugins=False)
    if not cfg.alerts.urls and not cfg.alerts.command:
        raise ConfigError(
            f"{cfg.path}: [alerts] has neither urls nor command: nothing to test; add e.g. "
            'urls = ["ntfy://my-topic"]'
        )
    alert = Alert(
        "test",
        "test",
        "test alert",
        "you asked for a test alert (`trainwarden alert-test`)",
        "nothing: this is a test",
        None,
        time.time(),
    )
    outcomes = Sender(cfg).deliver(alert)
    for outcome in outcomes:
        result = "ok" if outcome.error is None else f"failed: {outcome.error}"
        print(f"{outcome.target}: {result}")
    return 1 if any(o.error is not None for o in outcomes) else 0
