"""How a trainer is launched: its command line and environment, per the trainer contract."""

from __future__ import annotations

import os
from pathlib import Path

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.contract import ENV_PIVOT, ENV_RESUME, ENV_RUN_DIR, ENV_SEG
from trainwarden.supervisor.core.policy import Spawn
from trainwarden.supervisor.inputs.proctree import START_ENV
from trainwarden.supervisor.serve.notify import NOTIFY_ENV_KEYS

UNBUFFERED_ENV = "PYTHONUNBUFFERED"


def trainer_argv(cfg: Config, checkpoint_dir: Path, action: Spawn) -> list[str]:
    """[trainer] command, plus resume_args with {checkpoint} and {step} filled in."""
    argv = list(cfg.trainer.command)
    if action.resume is not None:
        path = checkpoint_dir / action.resume.name
        argv += [
            a.replace("{checkpoint}", str(path)).replace("{step}", str(action.resume.step))
            for a in cfg.trainer.resume_args
        ]
    return argv


def trainer_env(cfg: Config, checkpoint_dir: Path, action: Spawn, marker: str) -> dict[str, str]:
    """The daemon's environment, PYTHONUNBUFFERED=1, [trainer] env, the contract's variables
    for this start, and the start's marker, which every process the trainer starts inherits
    (see containment)."""
    # Python block-buffers a piped stdout: without this, step lines would reach the log a
    # few KiB at a time and a healthy trainer would look hung. [trainer] env may override it.
    env = {**os.environ, UNBUFFERED_ENV: "1", **cfg.trainer.env}
    env.pop(ENV_RESUME, None)
    env.pop(ENV_PIVOT, None)
    for key in NOTIFY_ENV_KEYS:
        # The trainer must not talk to systemd as if it were the daemon.
        env.pop(key, None)
    env[ENV_RUN_DIR] = str(cfg.run_dir)
    env[ENV_SEG] = str(action.seg)
    env[START_ENV] = marker
    if action.resume is not None:
        env[ENV_RESUME] = str(checkpoint_dir / action.resume.name)
    if action.pivot:
        env[ENV_PIVOT] = "1"
    return env
