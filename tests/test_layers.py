"""The layering rules, read from the sources: every import statement of every project module
(at the top, inside functions, under TYPE_CHECKING) is an edge of the import graph.

Rules (docs/code-map.md): no import cycles; the core imports only the standard library and
itself, and no I/O module; the package's own top-level modules (`trainwarden.libc`) import
only the standard library, so every layer may use them; the config (`config` and the
`config_*` modules it is made of) imports none of the layers above it (store, serve, shell,
inputs, cli), nor `socket_place` or `client`; the TUI reaches
into the daemon's package only for the protocol, the client, the contract, the errors, the
phases, the vocabularies (journal kinds, marker kinds, error codes) and the journal's
one-line text; neither the daemon nor the TUI imports the reference trainer or the
integrations; nothing imports the source folders by their bare names.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "trainwarden"
FOLDERS = ("supervisor", "tui", "plugins", "trainer", "integrations")
"""The top-level source folders, installed as trainwarden.<folder>."""
TOP_LEVEL = ROOT / PACKAGE
"""The package's own folder: its modules (beside the links to the source folders) are
trainwarden.<module>."""

CORE = "trainwarden.supervisor.core"
TUI_MAY_IMPORT = frozenset(
    f"trainwarden.supervisor.{name}"
    for name in (
        "protocol",
        "client",
        "contract",
        "errors",
        "core.phases",
        "core.kinds",
        "journal_text",
    )
)
CORE_DENIED = frozenset(
    {
        "asyncio",
        "concurrent",
        "fcntl",
        "glob",
        "http",
        "io",
        "logging",
        "mmap",
        "multiprocessing",
        "os",
        "pathlib",
        "select",
        "selectors",
        "shutil",
        "signal",
        "socket",
        "sqlite3",
        "ssl",
        "subprocess",
        "tempfile",
        "threading",
        "time",
        "urllib",
    }
)
"""Modules that touch files, processes, sockets, signals or clocks: the core decides only."""
CONFIG = "trainwarden.supervisor.config"
"""The config's public face (`Config`, `load_config`); the modules it is made of are named
after it: `config_schema`, `config_toml`, `config_checks`, ... (is_config)."""
CONFIG_DENIED = tuple(
    f"trainwarden.supervisor.{name}"
    for name in ("store", "serve", "shell", "inputs", "cli", "socket_place", "client")
)
"""What the config may not import: the layers above it, the socket's rules and the client
(a start's checks that need them are cli.start_checks')."""


@dataclass(frozen=True)
class Import:
    importer: str
    """The importing module's name (trainwarden.…)."""
    target: str
    """The imported module, resolved: `from a import b` is a.b when a.b is a module."""
    line: int
    path: Path

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.target}"


def module_name(path: Path) -> str:
    if path.parent == TOP_LEVEL:
        path = ROOT / path.name
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


@cache
def project_files() -> dict[str, Path]:
    files = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            files[module_name(path)] = path
    for path in sorted(TOP_LEVEL.glob("*.py")):
        files[module_name(path)] = path
    return files


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    base = importer.split(".")
    if not is_package:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


@cache
def imports() -> tuple[Import, ...]:
    modules = project_files()
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [Import(name, alias.name, node.lineno, path) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    source = _resolve_relative(
                        name, path.name == "__init__.py", node.level, node.module
                    )
                for alias in node.names:
                    child = f"{source}.{alias.name}"
                    target = child if child in modules else source
                    found.append(Import(name, target, node.lineno, path))
    return tuple(dict.fromkeys(found))


def project_target(target: str) -> str | None:
    """The project module an import lands in (the nearest enclosing module that exists)."""
    modules = project_files()
    parts = target.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None (iterative depth-first search)."""
    done: set[str] = set()
    for start in sorted(edges):
        if start in done:
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(edges.get(start, ())))]
        on_path = {start: 0}
        path = [start]
        while stack:
            node, pending = stack[-1]
            if not pending:
                stack.pop()
                path.pop()
                del on_path[node]
                done.add(node)
                continue
            nxt = pending.pop(0)
            if nxt in on_path:
                return [*path[on_path[nxt] :], nxt]
            if nxt in done:
                continue
            on_path[nxt] = len(path)
            path.append(nxt)
            stack.append((nxt, sorted(edges.get(nxt, ()))))
    return None


def test_the_graph_is_read_from_every_folder():
    modules = project_files()
    for folder in FOLDERS:
        assert f"trainwarden.{folder}" in modules, f"{folder}/__init__.py was not found"
    assert f"{CORE}.policy" in modules
    assert f"{PACKAGE}.libc" in modules
    assert any(i.importer == "trainwarden.supervisor.shell.daemon" for i in imports())


def test_find_cycle_reports_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_there_are_no_import_cycles_among_the_projects_modules():
    edges: dict[str, set[str]] = {name: set() for name in project_files()}
    where: dict[tuple[str, str], Import] = {}
    for imp in imports():
        target = project_target(imp.target)
        if target is None or target == imp.importer:
            continue
        edges[imp.importer].add(target)
        where.setdefault((imp.importer, target), imp)
    cycles = []
    # Report every cycle, one at a time: cut the first edge of each one found.
    while (cycle := find_cycle(edges)) is not None:
        steps = [str(where[(a, b)]) for a, b in zip(cycle, cycle[1:], strict=False)]
        cycles.append(" -> ".join(cycle) + "\n      " + "\n      ".join(steps))
        edges[cycle[0]].discard(cycle[1])
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_the_core_imports_only_the_standard_library_and_itself():
    wrong = [
        str(imp)
        for imp in imports()
        if within(imp.importer, CORE)
        and not within(imp.target, CORE)
        and imp.target.split(".")[0] not in sys.stdlib_module_names
    ]
    assert not wrong, "the core reaches outside itself and the standard library:\n  " + (
        "\n  ".join(wrong)
    )


def test_the_core_imports_no_io_module():
    wrong = [
        str(imp)
        for imp in imports()
        if within(imp.importer, CORE) and imp.target.split(".")[0] in CORE_DENIED
    ]
    assert not wrong, "the core imports I/O (files, processes, sockets, signals, clocks):\n  " + (
        "\n  ".join(wrong)
    )


def test_the_packages_top_level_modules_import_only_the_standard_library():
    """They serve every layer, the reference trainer included: they can close no cycle and
    bring no dependency into a process that imports them."""
    top_level = {module_name(path) for path in TOP_LEVEL.glob("*.py")}
    wrong = [
        str(imp)
        for imp in imports()
        if imp.importer in top_level and imp.target.split(".")[0] not in sys.stdlib_module_names
    ]
    assert not wrong, "a top-level module reaches outside the standard library:\n  " + (
        "\n  ".join(wrong)
    )


def is_config(module: str) -> bool:
    """The config or one of its modules: `supervisor/config.py` and `supervisor/config_*.py`
    (not `shell.config_watch`, which is the shell's)."""
    return module == CONFIG or (
        module.startswith(CONFIG + "_") and module.count(".") == CONFIG.count(".")
    )


def test_the_config_rule_holds_the_config_and_each_of_its_modules():
    held = {name for name in project_files() if is_config(name)}
    modules = (
        "config",
        "config_schema",
        "config_toml",
        "config_checks",
        "config_paths",
        "config_trainer",
    )
    assert {f"trainwarden.supervisor.{name}" for name in modules} <= held
    assert "trainwarden.supervisor.shell.config_watch" not in held


def test_the_config_imports_no_layer_above_it():
    wrong = [
        str(imp)
        for imp in imports()
        if is_config(imp.importer) and any(within(imp.target, denied) for denied in CONFIG_DENIED)
    ]
    assert not wrong, "the config imports a layer above it:\n  " + "\n  ".join(wrong)


def test_the_tui_uses_only_the_daemons_public_modules():
    wrong = [
        str(imp)
        for imp in imports()
        if within(imp.importer, "trainwarden.tui")
        # `python -m trainwarden.tui` is the command line's `tui` command (it reads the
        # run's config first): the one module of the TUI that hands over to the CLI.
        and imp.importer != "trainwarden.tui.__main__"
        and within(imp.target, "trainwarden.supervisor")
        and not any(within(imp.target, allowed) for allowed in TUI_MAY_IMPORT)
    ]
    assert not wrong, (
        f"the TUI imports daemon internals (allowed: {', '.join(sorted(TUI_MAY_IMPORT))}):\n  "
        + "\n  ".join(wrong)
    )


@pytest.mark.parametrize("package", ["trainwarden.supervisor", "trainwarden.tui"])
@pytest.mark.parametrize("trainer_side", ["trainwarden.trainer", "trainwarden.integrations"])
def test_neither_the_daemon_nor_the_tui_imports_the_trainer_side(package: str, trainer_side: str):
    """The reference trainer and the integrations run inside trainers, never in the daemon."""
    wrong = [
        str(imp)
        for imp in imports()
        if within(imp.importer, package) and within(imp.target, trainer_side)
    ]
    assert not wrong, f"{package} imports {trainer_side}:\n  " + "\n  ".join(wrong)


def test_no_module_imports_a_source_folder_by_its_bare_name():
    wrong = [str(imp) for imp in imports() if imp.target.split(".")[0] in FOLDERS]
    assert not wrong, (
        "bare top-level imports (installed only as trainwarden.<name>):\n  " + "\n  ".join(wrong)
    )


def test_the_integrations_reach_into_the_daemon_only_for_the_contract():
    """They run inside other people's trainers: the trainer contract's names, nothing that
    would drag the daemon's modules (or its dependencies) into the trainer's process."""
    wrong = [
        str(imp)
        for imp in imports()
        if within(imp.importer, "trainwarden.integrations")
        and within(imp.target, "trainwarden")
        and not within(imp.target, "trainwarden.integrations")
        and not within(imp.target, "trainwarden.supervisor.contract")
    ]
    assert not wrong, "the integrations import more than the contract:\n  " + "\n  ".join(wrong)
