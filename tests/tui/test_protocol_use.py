"""The TUI takes the protocol from trainwarden.supervisor.protocol and declares none of it.

A copy of a topic list, a phase set or a field list in the TUI drifts from the daemon's
(the replaceable topics once did); these tests read the TUI's sources and refuse one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainwarden.supervisor import protocol

TUI = Path(__file__).resolve().parents[2] / "tui"
PHASES = {str(phase) for phase in protocol.Phase}
TOPICS = set(protocol.TOPICS)
ERROR_CODES = set(protocol.ERROR_CODES)
MESSAGES = {
    name: set(shape.__annotations__)
    for name, shape in vars(protocol).items()
    if isinstance(shape, type) and hasattr(shape, "__required_keys__")
}
"""Every TypedDict of the protocol, by name: its keys."""
ALLOWED_IMPORTS = (
    "trainwarden.tui",
    "trainwarden.supervisor.protocol",
    "trainwarden.supervisor.contract",
    "trainwarden.supervisor.errors",
    "trainwarden.supervisor.journal_text",  # a record's one line, as `trainwarden events` says it
)
ENTRY_POINT = TUI / "__main__.py"
"""`python -m trainwarden.tui` hands over to the command line: the one import beyond these."""


def sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(TUI.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def strings(nodes: list[ast.expr | None]) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def redeclared(values: list[str]) -> str | None:
    """What protocol thing a literal collection of these strings copies, if any."""
    if len(values) < 2:
        return None
    if len(PHASES.intersection(values)) >= 2:
        return "phases"
    if len(ERROR_CODES.intersection(values)) >= 2:
        return "error codes"
    if set(values) <= TOPICS:
        return "topics"
    for name, keys in MESSAGES.items():
        if len(values) >= 3 and set(values) <= keys:
            return f"the fields of {name}"
    return None


def findings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Set | ast.Tuple | ast.List):
            what = redeclared(strings(list(node.elts)))
        elif isinstance(node, ast.Dict):
            what = redeclared(strings(list(node.keys)))
        elif isinstance(node, ast.Compare):
            named = [s for s in strings(list(node.comparators)) if s in PHASES]
            what = f"the phase {named[0]!r} (use Phase)" if named else None
        else:
            continue
        if what is not None:
            yield node.lineno, what


def test_the_scan_catches_the_copies_it_is_for():
    copies = """
REPLACEABLE = frozenset({"telemetry", "gpu", "host"})
HALTED = {"stopped", "finished"}
STYLE = {"running": "green", "crash_loop": "red"}
KEYS = ("state", "detail", "trainer_pid")
if phase == "backoff":
    pass
"""
    found = sorted(what for _, what in findings(ast.parse(copies)))
    assert found == sorted(
        [
            "topics",
            "phases",
            "phases",
            "the fields of StateView",
            "the phase 'backoff' (use Phase)",
        ]
    )
    fine = 'PANELS = ("header", "telemetry", "chart")\nCOLUMNS = ("step", "size", "age")\n'
    assert list(findings(ast.parse(fine))) == []


@pytest.mark.parametrize("path", [p for p, _ in sources()], ids=lambda p: str(p.relative_to(TUI)))
def test_the_tui_declares_no_topic_phase_code_or_field_set(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    assert [f"line {line}: {what}" for line, what in findings(tree)] == []


def test_the_tui_imports_only_the_protocol_the_contract_the_errors_and_the_record_text():
    wrong = []
    for path, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "torch":
                    wrong.append(f"{path.name}: {name}")
                if not name.startswith("trainwarden") or path == ENTRY_POINT:
                    continue
                if not any(name == ok or name.startswith(ok + ".") for ok in ALLOWED_IMPORTS):
                    wrong.append(f"{path.relative_to(TUI)}: {name}")
    assert wrong == []
