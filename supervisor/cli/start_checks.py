"""A config's checks for a daemon's start that need more than the config module may import.

load_config checks what the file says; the config sits below the store and the socket's
rules, so the checks of a start that need them are made here: where the control socket
may be bound and which group may reach it (socket_place), and whose run the mirror
serves (store.identity). The commands that write or start a run's config (`daemon`,
`init`, `install-unit`, `demo`, `branch`) load it with load_for_start; each error is one
ConfigError line naming the config file, as load_config's are.
"""

from __future__ import annotations

from pathlib import Path

from trainwarden.supervisor.config import Config, check_plugins_installed, load_config
from trainwarden.supervisor.config_trainer import check_trainer_command
from trainwarden.supervisor.errors import ConfigError
from trainwarden.supervisor.socket_place import (
    check_group_member,
    check_socket_place,
    resolve_group,
)
from trainwarden.supervisor.store.identity import (
    claim,
    ensure_run_id,
    read_owner,
    read_run_id,
)


def load_for_start(run_dir: Path | str) -> Config:
    """RUN's config with load_config's checks and the control socket's, made in the order
    they always were: the trainer command's, the socket's, then the plugins' (a config wrong
    in two ways is refused for the first). `daemon` then checks the trainer's program and
    the mirror's owner."""
    cfg = load_config(run_dir, check_plugins=False)
    check_trainer_command(cfg)
    check_control(cfg)
    check_plugins_installed(cfg)
    return cfg


def check_control(cfg: Config) -> None:
    """The socket's group and place, as the daemon that binds it will need them."""
    path, control = cfg.path, cfg.control
    if control.allow_uids and control.group is None:
        raise ConfigError(
            f"{path}: 'control.allow_uids' = {control.allow_uids!r} needs [control] group: "
            "the group (name or gid) the socket is given so that those users can reach it, "
            'for example group = "trainers" (each allowed user must be a member)'
        )
    gid = resolve_group(path, control.group)
    if gid is not None:
        check_group_member(path, gid)
    check_socket_place(path, cfg.run_dir, control.socket, gid if control.allow_uids else None)


def check_mirror_owner(cfg: Config) -> None:
    """Raise ConfigError if `[mirror] path` serves another run; else record this run as its
    owner (a starting daemon's check, as config_trainer.check_trainer_program)."""
    if cfg.mirror.path is None:
        return
    mirror = Path(cfg.mirror.path).expanduser()
    owner = read_owner(mirror)
    if owner is None:
        try:
            # This run's id (made now if need be), recorded as the mirror's owner.
            owner = claim(mirror, ensure_run_id(cfg.run_dir), cfg.run_dir, cfg.run.name)
        except OSError:
            return  # the daemon's own start reports an unwritable run directory
    elif owner.run_id == read_run_id(cfg.run_dir):
        return
    if owner is not None:
        raise ConfigError(
            f"{cfg.path}: 'mirror.path' = {cfg.mirror.path!r} is invalid: it is the mirror of"
            f" {owner.describe()}, and two runs in one mirror evict each other's copies;"
            " give this run a folder of its own"
        )
