"""Finds checkpoint-format and log-parser plugins through their entry points.

Built-in plugins are registered in pyproject.toml exactly as a third-party one would be.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwarden.supervisor.errors import ConfigError, PluginError

if TYPE_CHECKING:
    from trainwarden.plugins.api import CheckpointFormat, LogParser

FORMATS_GROUP = "trainwarden.formats"
PARSERS_GROUP = "trainwarden.parsers"


@cache
def installed(group: str) -> dict[str, Any]:
    """Entry points of one group by name (not yet loaded)."""
    return {ep.name: ep for ep in entry_points(group=group)}


def _load(group: str, name: str) -> Any:
    found = installed(group)
    if name not in found:
        raise PluginError(
            f"no plugin '{name}' in {group}; installed: {', '.join(sorted(found)) or 'none'}"
        )
    try:
        return found[name].load()
    except Exception as exc:
        raise PluginError(f"plugin '{name}' in {group} failed to load: {exc}") from None


def checkpoint_format(name: str, options: dict[str, Any] | None = None) -> CheckpointFormat:
    return _load(FORMATS_GROUP, name)(options or {})  # type: ignore[no-any-return]


def log_parser(name: str, options: dict[str, Any] | None = None) -> LogParser:
    return _load(PARSERS_GROUP, name)(options or {})  # type: ignore[no-any-return]


def check_installed(config_path: Path, *, format_name: str, parser_name: str) -> None:
    """Raise ConfigError, naming the config file, when a configured plugin is not installed.

    Takes the names rather than the Config: the config module calls this while loading.
    """
    for group, key, name in (
        (FORMATS_GROUP, "checkpoints.format", format_name),
        (PARSERS_GROUP, "telemetry.parser", parser_name),
    ):
        names = sorted(installed(group))
        if name not in names:
            raise ConfigError(
                f"{config_path}: '{key}' = {name!r} is not an installed plugin; "
                f"installed: {', '.join(names) or 'none'}"
            )
