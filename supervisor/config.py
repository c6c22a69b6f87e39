"""The run's configuration, `RUN/trainwarden.toml`: `load_config` reads it into a `Config`.

Loading validates types and ranges and names the file, the key, the bad value and what
would be valid; a typo gets the nearest known key suggested. The parts, each in a module
of its own:

- config_schema: one frozen dataclass per table, each field with its one-line docstring,
  and `Config`, the whole (re-exported here: it is what load_config gives)
- config_toml: the TOML text read into the schema's tables (unknown tables and keys,
  types), and values written as TOML (toml_value, toml_key)
- config_checks: each value in its range, and `[metrics] listen` (parse_listen)
- config_paths: what the run log and the checkpoint folder may name on disk
- config_trainer: the trainer's command, working directory, program and script

None of them imports a layer above the config (store, serve, shell, inputs, cli): a
start's checks that need those are cli.start_checks'.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainwarden.supervisor.config_checks import (
    check_alerts,
    check_counts,
    check_divergence,
    check_numbers,
    check_ranges,
    check_slurm,
)
from trainwarden.supervisor.config_paths import check_paths
from trainwarden.supervisor.config_schema import Config
from trainwarden.supervisor.config_toml import parse_tables
from trainwarden.supervisor.config_trainer import check_trainer_command
from trainwarden.supervisor.errors import ConfigError
from trainwarden.supervisor.registry import check_installed

__all__ = ["CONFIG_NAME", "Config", "check_plugins_installed", "load_config"]

CONFIG_NAME = "trainwarden.toml"


def load_config(run_dir: Path | str, *, check_plugins: bool = True) -> Config:
    """Read and validate RUN/trainwarden.toml. Raises ConfigError with a one-line message.

    check_plugins also checks what only starting a daemon needs: the configured plugins
    are installed and the trainer command does not run a renamed module. Commands that
    only talk to a daemon (status, stop, tui) skip it, so an operator can still reach a
    running daemon whose config needs fixing before its next start. The rest of a start's
    checks need the store or the socket's rules, above this module: the command line
    makes them (cli.start_checks).
    """
    run_dir = Path(run_dir).resolve()
    path = run_dir / CONFIG_NAME
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read for ever
            raise ConfigError(
                f"{path}: cannot read the config: not a regular file; it must be a TOML file"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no config file; create one with `trainwarden init {run_dir}`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    tables = parse_tables(path, text)
    cfg = Config(run_dir=run_dir, path=path, **tables)
    # In this order: of several problems, the first found is the one reported.
    check_ranges(path, cfg)
    check_counts(path, cfg)
    check_paths(path, cfg)
    check_numbers(path, cfg)
    check_divergence(path, cfg)
    check_alerts(path, cfg)
    check_slurm(path, cfg)
    if check_plugins:
        check_trainer_command(cfg)
        check_plugins_installed(cfg)
    return cfg


def check_plugins_installed(cfg: Config) -> None:
    """Raise ConfigError, naming the config file, unless its format and parser are installed."""
    check_installed(cfg.path, format_name=cfg.checkpoints.format, parser_name=cfg.telemetry.parser)
