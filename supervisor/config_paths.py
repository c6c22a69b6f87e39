"""What the config's paths may name on disk, checked by load_config: the checkpoint folder
is a folder of checkpoints only (never the run directory, the daemon's folder, the pivot
archive or the mirror, nor inside one of them), and the run log is a file of the
trainer's own, never one the daemon (or the trainer, for its sidecars) writes.

The trainer's working directory and program are config_trainer's: they are checked only
when a daemon starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainwarden.supervisor.config_checks import invalid
from trainwarden.supervisor.config_schema import Config
from trainwarden.supervisor.contract import BANDIT_STATE_FILE, POLICY_FILE, SAMPLES_FILE
from trainwarden.supervisor.run_layout import EVAL_HISTORY, LOSS_HISTORY, STATE_DIR

FOLDERS_OWNED = frozenset(
    {"the daemon's own folder", "the pivot archive", "the mirror", "the checkpoint folder"}
)


def _owned_by_the_daemon(cfg: Config) -> dict[Path, str]:
    """The paths the daemon (or the trainer, for its sidecars) writes, resolved, and what
    each is: the run log may name none of them (nor anything inside the folders among
    them, FOLDERS_OWNED)."""
    run_dir = cfg.run_dir
    owned = {
        cfg.path: "the config file",
        run_dir / STATE_DIR: "the daemon's own folder",
        run_dir / LOSS_HISTORY: "the loss history",
        run_dir / EVAL_HISTORY: "the validation history",
        run_dir / BANDIT_STATE_FILE: "the trainer's bandit state",
        run_dir / SAMPLES_FILE: "the trainer's samples",
        run_dir / POLICY_FILE: "the data policy",
        run_dir / "archive": "the pivot archive",
        cfg.socket_path: "the control socket",
        cfg.checkpoint_dir: "the checkpoint folder",
    }
    if cfg.mirror.path is not None:
        owned[Path(cfg.mirror.path).expanduser()] = "the mirror"
    return {Path(os.path.realpath(p)): what for p, what in owned.items()}


def _check_checkpoint_place(path: Path, cfg: Config) -> None:
    """The checkpoint folder holds checkpoints only: never the run directory itself, nor
    the daemon's folder, the pivot archive or the mirror, nor a
    folder inside one of them (quarantine and deletion act on what it holds)."""
    ckpt = Path(os.path.realpath(cfg.checkpoint_dir))
    run_dir = Path(os.path.realpath(cfg.run_dir))
    example = 'for example dir = "checkpoints"'
    if ckpt == run_dir:
        raise invalid(
            path,
            "checkpoints.dir",
            cfg.checkpoints.dir,
            f"a folder of checkpoints only, but it names the run directory: {example}",
        )
    owned = {
        cfg.run_dir / STATE_DIR: "the daemon's own folder",
        cfg.run_dir / "archive": "the pivot archive",
    }
    if cfg.mirror.path is not None:
        owned[Path(cfg.mirror.path).expanduser()] = "the mirror"
    for folder, what in owned.items():
        folder = Path(os.path.realpath(folder))
        if ckpt == folder or folder in ckpt.parents or ckpt in folder.parents:
            raise invalid(
                path,
                "checkpoints.dir",
                cfg.checkpoints.dir,
                f"a folder of checkpoints only, but it is or shares a folder with {what}"
                f" ({folder}): {example}",
            )


def check_paths(path: Path, cfg: Config) -> None:
    """What already sits at the configured paths: the checkpoint directory must be a
    folder (or not exist yet), the run log a file that belongs to no one else."""
    ckpt_dir = cfg.checkpoint_dir
    if ckpt_dir.exists() and not ckpt_dir.is_dir():
        raise invalid(
            path,
            "checkpoints.dir",
            cfg.checkpoints.dir,
            f"a folder, but {ckpt_dir} is a file: name a folder (or a name not yet taken)",
        )
    _check_checkpoint_place(path, cfg)
    log = cfg.log_path
    if log.is_dir():
        raise invalid(
            path,
            "run.log",
            cfg.run.log,
            f'a file, but {log} is a folder: name a file, for example log = "training.log"',
        )
    resolved = Path(os.path.realpath(log))
    for owned, what in _owned_by_the_daemon(cfg).items():
        if resolved == owned or (what in FOLDERS_OWNED and owned in resolved.parents):
            via = "" if resolved == log else f" (it resolves to {resolved})"
            raise invalid(
                path,
                "run.log",
                cfg.run.log,
                f'a file of the trainer\'s own, but it names {what}{via}: use log = "training.log"',
            )
