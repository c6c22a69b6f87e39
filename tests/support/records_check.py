"""The journals a test's daemons wrote, held to supervisor/core/records.py.

Run at every test's end (tests/conftest.py) over the journals under its tmp_path: each
record of a kind the daemon knows must have every required key of its class, no key the
class does not declare, and each value of its declared type. So the schema a reader of
the journal relies on is what some two thousand tests' daemons actually wrote.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import (
    Any,
    Literal,
    NotRequired,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import orjson

from trainwarden.supervisor.core.records import record_classes

NON_FINITE = ("nan", "inf", "-inf")
SKIP_PARTS = {".venv", "site-packages", "node_modules"}
"""Folders under a tmp_path that hold no run of a test (a test's fresh venv)."""


def journals(root: Path) -> Iterator[Path]:
    """Every `.trainwarden/journal.jsonl` under root (rotated or torn ones are not read)."""
    for state_dir in root.rglob(".trainwarden"):
        if SKIP_PARTS.isdisjoint(state_dir.parts) and (state_dir / "journal.jsonl").is_file():
            yield state_dir / "journal.jsonl"


def problems(path: Path) -> list[str]:
    """What in one journal does not match its kinds' classes (at most the first ten)."""
    found: list[str] = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return found
    if not any(b'"kind":"daemon_start"' in line and b'"version"' in line for line in lines):
        return found  # a journal a test wrote by hand (a reader's input), not a daemon's
    for number, line in enumerate(lines, 1):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a torn or garbage line: the journal's readers skip those too
        if not isinstance(record, dict):
            continue
        cls = record_classes().get(record.get("kind"))  # type: ignore[arg-type]
        if cls is None:
            continue  # a kind of another version, or a test's own garbage
        fields = {k: v for k, v in record.items() if k not in ("ts", "t")}
        for why in mismatches(fields, cls):
            found.append(f"{path}:{number}: {record['kind']}: {why}")
            if len(found) >= 10:
                return found
    return found


@cache
def declared(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """A class's keys with their types, and which are required (resolved once a class).
    Required from the hints themselves: under `from __future__ import annotations` Python
    3.11's __required_keys__ cannot see NotRequired in a string annotation."""
    extras = get_type_hints(cls, include_extras=True)
    total = getattr(cls, "__total__", True)
    return (
        {key: unwrapped(hint) for key, hint in extras.items()},
        frozenset(k for k, hint in extras.items() if total and get_origin(hint) is not NotRequired),
    )


def mismatches(value: dict[str, Any], cls: type) -> Iterator[str]:
    hints, required = declared(cls)
    for key in sorted(required - value.keys()):
        yield f"required key {key!r} missing"
    for key, item in value.items():
        if key not in hints:
            yield f"undeclared key {key!r} ({item!r})"
        elif not matches(item, hints[key]):
            yield f"{key!r} = {item!r} is not {hints[key]}"


def is_digits(value: Any) -> bool:
    return isinstance(value, str) and value.lstrip("-").isdigit()


def unwrapped(hint: Any) -> Any:
    return get_args(hint)[0] if get_origin(hint) is NotRequired else hint


def matches(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a type of records.py (as orjson reads it back)."""
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(matches(value, arm) for arm in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if is_typeddict(hint):
        return isinstance(value, dict) and not any(mismatches(value, hint))
    if origin is list or hint is list:
        args = get_args(hint)
        return isinstance(value, list) and all(matches(item, args[0]) for item in value if args)
    if origin is dict or hint is dict:
        args = get_args(hint)
        return isinstance(value, dict) and all(matches(v, args[1]) for v in value.values() if args)
    if hint is float:  # the journal writes a non-finite float as its name (JSON has none)
        return value in NON_FINITE or isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:  # beyond 64 bits (a step read from a file name) the journal writes digits
        return isinstance(value, int) and not isinstance(value, bool) or is_digits(value)
    return isinstance(value, hint)
