"""The README's worked example (docs/examples/) supervised for real: the README quotes the
files exactly, and a daemon runs them to a verified checkpoint, a stop that saves and a
start that resumes from it."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tests.support.daemon import running_daemon
from tests.support.runs import journal
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"


def verified_steps(status: dict) -> list[int]:
    return sorted(c["step"] for c in status["checkpoints"])


def test_the_example_runs_under_the_daemon_to_a_verified_checkpoint(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # As the README says: copy both files into the run directory, nothing else.
    for name in ("train.py", "trainwarden.toml"):
        shutil.copy(EXAMPLES / name, run_dir / name)
    # The config runs `python`: the one of this environment, as in an activated venv.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with running_daemon(run_dir, {"PATH": path}) as daemon:
        first = wait_for(lambda: verified_steps(daemon.status()), 120, 0.2, "a verified checkpoint")
        assert first[0] % 100 == 0

        stopped = daemon.request("stop", timeout=120)
        assert stopped["outcome"] == "saved", stopped
        assert stopped["steps_lost"] == 0
        saved = max(verified_steps(daemon.status()))

        daemon.request("start", timeout=120)
        wait_for(
            lambda: max(verified_steps(daemon.status())) > saved, 120, 0.2, "a newer checkpoint"
        )
        spawns = [r for r in journal(run_dir) if r["kind"] == "spawn"]
        assert spawns[-1]["resume"]["step"] == saved
        assert spawns[-1]["resume"]["name"] == f"ckpt_{saved:06d}.pt"
        status = daemon.status()
        assert status["state"] in ("running", "finished")
        assert status["step"] > saved
