"""How a trainer is launched: its command line and environment, per the trainer contract."""

from __future__ import annotations

import os
from pathlib import Path

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.contract import (
    ENV_LR_SCALE,
    ENV_PIVOT,
    ENV_RESUME,
    ENV_RUN_DIR,
    ENV_SEG,
    ENV_SKIP_DATA,
    skip_data_text,
)
from trainwarden.supervisor.core.policy import Spawn
from trainwarden.supervisor.inputs.proctree import START_ENV
from trainwarden.supervisor.serve.notify import NOTIFY_ENV_KEYS

UNBUFFERED_ENV = "PYTHONUNBUFFERED"


def resume_path(cfg: Config, checkpoint_dir: Path, action: Spawn) -> Path | None:
    """What the trainer resumes from: the checkpoint, or for an in-place trainer the fixed
    file, where the executor has just put the snapshot it resumes from."""
    if action.resume is None:
        return None
    if cfg.checkpoints.fixed is not None:
        return checkpoint_dir / cfg.checkpoints.fixed
    return checkpoint_dir / action.resume.name


def trainer_argv(cfg: Config, checkpoint_dir: Path, action: Spawn) -> list[str]:
    """[trainer] command, plus resume_args with {checkpoint} and {step} filled in."""
    argv = list(cfg.trainer.command)
    path = resume_path(cfg, checkpoint_dir, action)
    if action.resume is not None and path is not None:
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
    for key in (ENV_RESUME, ENV_PIVOT, ENV_SKIP_DATA, ENV_LR_SCALE):
        env.pop(key, None)
    for key in NOTIFY_ENV_KEYS:
        # The trainer must not talk to systemd as if it were the daemon.
        env.pop(key, None)
    env[ENV_RUN_DIR] = str(cfg.run_dir)
    env[ENV_SEG] = str(action.seg)
    env[START_ENV] = marker
    path = resume_path(cfg, checkpoint_dir, action)
    if path is not None:
        env[ENV_RESUME] = str(path)
    if action.pivot:
        env[ENV_PIVOT] = "1"
    # Only ever set for a trainer that declared them (the policy adds none otherwise).
    if action.skip_data:
        env[ENV_SKIP_DATA] = skip_data_text(action.skip_data)
    if action.lr_scale != 1.0:
        env[ENV_LR_SCALE] = repr(action.lr_scale)
    return env
