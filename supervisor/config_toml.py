"""The config as TOML: its text read into the schema's tables, and values written back.

Reading is driven by the schema (config_schema): an unknown table or key is named with
the nearest known one, a value of the wrong type with the type its field wants, and an
integer where a number is wanted becomes a float. Writing goes through tomli_w, so every
string, number and date is quoted as TOML wants, whoever writes the file (init, branch,
the checkpoint hints, the tests' run factory).
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import tomli_w

from trainwarden.supervisor.config_schema import SECRET_KEYS, TABLES
from trainwarden.supervisor.errors import ConfigError


def parse_tables(path: Path, text: str) -> dict[str, Any]:
    """The tables of a config's TOML text, each one the schema's dataclass, by name;
    ConfigError naming the file for text that is not TOML, an unknown table or key, or a
    value of the wrong type."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except ValueError as exc:  # an integer past Python's 4,300-digit conversion limit
        raise ConfigError(f"{path}: {too_long(exc)}") from None
    tables: dict[str, Any] = {}
    for table, value in raw.items():
        if table not in TABLES:
            raise ConfigError(
                f"{path}: unknown table [{table}]{nearest(table, list(TABLES))}; "
                f"known tables: {', '.join(TABLES)}"
            )
        tables[table] = _build_table(path, table, TABLES[table], value)
    return tables


def too_long(exc: ValueError) -> str:
    """The one line for a TOML number Python refuses to convert (past 4,300 digits)."""
    if "digits" in str(exc):
        return (
            "not valid TOML: an integer of more than 4,300 digits; give a value in the key's range"
        )
    return f"not valid TOML: {exc}"


def nearest(name: str, choices: list[str]) -> str:
    """A hint at the choice closest to a misspelt name, " (did you mean 'KEY'?)", or an
    empty string when none is close."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a table of {_describe(typing.get_args(tp)[1])}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, str(tp)
    )


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        _, item = typing.get_args(tp)
        return isinstance(value, dict) and all(_matches(v, item) for v in value.values())
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _build_table(path: Path, table: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [{table}] must be a table, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(
                f"{path}: unknown key '{table}.{key}'{nearest(key, names)}; "
                f"known keys in [{table}]: {', '.join(names)}"
            )
        if not _matches(value, hints[key]):
            shown = "(hidden)" if f"{table}.{key}" in SECRET_KEYS else repr(value)
            raise ConfigError(
                f"{path}: '{table}.{key}' = {shown} is invalid: expected {_describe(hints[key])}"
            )
        values[key] = float(value) if hints[key] is float else value
    return cls(**values)


def toml_value(value: Any) -> str:
    """`value` as TOML on one line, arrays and tables inline, for a file laid out by hand
    or a setting quoted in a message: every string, number and date as tomli_w writes it."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return tomli_w.dumps({"v": value}).removeprefix("v = ").removesuffix("\n")


def toml_key(name: str) -> str:
    """`name` as a TOML key: bare when it can be, else a string as tomli_w writes it."""
    return tomli_w.dumps({name: 0}).removesuffix(" = 0\n")
