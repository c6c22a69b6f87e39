"""The README stays true: every config key and every CLI command is documented there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainwarden.supervisor.cli.main import build_parser
from trainwarden.supervisor.config import TABLES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_config_key_is_in_the_reference():
    missing = [
        f"{table}.{f.name}"
        for table, cls in TABLES.items()
        for f in dataclasses.fields(cls)
        if f"`{table}.{f.name}`" not in README
    ]
    assert not missing, f"README's configuration table lacks {missing}"


def test_every_command_is_in_the_table():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    missing = [
        name for name in sub.choices if f"`{name} " not in README and f"`{name}`" not in README
    ]
    assert not missing, f"README's command table lacks {missing}"


def test_quick_start_commands_are_the_ci_ones():
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    test_command = next(line for line in README.splitlines() if "python -m pytest" in line)
    assert test_command.strip() in ci
