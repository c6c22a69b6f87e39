"""Every module is on the map: named in its package's docstring and in docs/code-map.md.

The five source folders (supervisor, tui, trainer, integrations, plugins) are walked: every
folder in them with an `__init__.py` is a package (`__pycache__` skipped), and a package's
entries are its `.py` files other than `__init__.py` (`__main__.py` included), named
without the suffix, and its subpackages, named with a trailing slash.

- A package's `__init__.py` docstring names each entry on a line of its own that starts
  (after any indentation and an optional "- ") with the name in backticks and a colon:
  "- `journal`: the run's journal", "- `core/`: the pure policy".
- docs/code-map.md has a section for each package, headed by its folder in backticks
  ("#### `supervisor/store/`"), and in it a table row for each entry whose first cell is
  the name in backticks ("| `journal` | ... |").
- The root package, trainwarden/ (the five folders, linked, and modules of its own such as
  `libc`), is held to both rules: its docstring lists "- `supervisor/`: ..." and
  "- `libc`: ...", and the code map has a `trainwarden/` section.

A name mentioned only in prose does not count, and a listed name that is no entry (nor
another file of the folder) fails too: a map that names a module that is gone is wrong.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("supervisor", "tui", "trainer", "integrations", "plugins")
CODE_MAP = ROOT / "docs" / "code-map.md"
DOCSTRING_ITEM = re.compile(r"^[ \t]*(?:- )?`([^`\n]+)`:", re.M)
TABLE_ROW = re.compile(r"^\| `([^`\n]+)` \|", re.M)


def packages() -> list[Path]:
    found = [ROOT / "trainwarden"]
    for folder in FOLDERS:
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            if "__pycache__" not in init.parts:
                found.append(init.parent)
    return found


def entries(package: Path) -> list[str]:
    """The package's modules (without .py) and subpackages (with a trailing slash)."""
    modules = [p.stem for p in sorted(package.glob("*.py")) if p.name != "__init__.py"]
    if package == ROOT / "trainwarden":  # the folders, linked beside its own modules
        return [f"{folder}/" for folder in FOLDERS] + modules
    subpackages = [
        f"{d.name}/"
        for d in sorted(package.iterdir())
        if d.is_dir() and d.name != "__pycache__" and (d / "__init__.py").exists()
    ]
    return modules + subpackages


def other_files(package: Path) -> set[str]:
    """Files of the folder that are not modules (a stylesheet) and may be listed too."""
    return {p.name for p in package.iterdir() if p.is_file() and p.suffix != ".py"}


def docstring(package: Path) -> str:
    source = (package / "__init__.py").read_text(encoding="utf-8")
    return ast.get_docstring(ast.parse(source)) or ""


def section(text: str, folder: str) -> str | None:
    """The part of the code map under the heading `folder/`, up to the next heading."""
    lines = text.splitlines()
    heading = re.compile(rf"^#+ `{re.escape(folder)}/`\s*$")
    for i, line in enumerate(lines):
        if heading.match(line):
            rest = []
            for following in lines[i + 1 :]:
                if following.startswith("#"):
                    break
                rest.append(following)
            return "\n".join(rest)
    return None


def compare(listed: list[str], expected: list[str], allowed: set[str]) -> tuple[list, list]:
    """What is missing from a listing, and what it lists that is not there."""
    missing = [name for name in expected if name not in listed]
    stale = [name for name in listed if name not in expected and name not in allowed]
    return missing, stale


def rel(package: Path) -> str:
    return package.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("package", packages(), ids=rel)
def test_the_package_docstring_names_each_module(package: Path):
    listed = DOCSTRING_ITEM.findall(docstring(package))
    missing, stale = compare(listed, entries(package), other_files(package))
    where = f"{rel(package)}/__init__.py"
    assert not missing, f"{where} does not list " + ", ".join(
        f"{rel(package)}/{name}" for name in missing
    )
    assert not stale, f"{where} lists what is not in the package: {', '.join(stale)}"


@pytest.mark.parametrize("package", packages(), ids=rel)
def test_the_code_map_names_each_module(package: Path):
    text = section(CODE_MAP.read_text(encoding="utf-8"), rel(package))
    assert text is not None, f"docs/code-map.md has no section headed `{rel(package)}/`"
    listed = TABLE_ROW.findall(text)
    missing, stale = compare(listed, entries(package), other_files(package))
    where = f"docs/code-map.md's `{rel(package)}/` section"
    assert not missing, f"{where} has no row for " + ", ".join(
        f"{rel(package)}/{name}" for name in missing
    )
    assert not stale, f"{where} lists what is not in the package: {', '.join(stale)}"


def test_the_walk_finds_every_package_and_its_entries():
    found = {rel(p) for p in packages()}
    assert {"trainwarden", "supervisor", "supervisor/core", "tui/widgets"} <= found
    assert entries(ROOT / "trainwarden")[: len(FOLDERS)] == [f"{f}/" for f in FOLDERS]
    assert "policy" in entries(ROOT / "supervisor" / "core")
    assert "core/" in entries(ROOT / "supervisor")
    assert "__main__" in entries(ROOT / "supervisor")
    assert not any("__pycache__" in name for p in packages() for name in entries(p))


def test_a_name_mentioned_in_prose_is_not_listed():
    doc = "The journal (`journal`) and `rundir`s.\n- `rundir`: the run directory\n  `lossdb`: x"
    assert DOCSTRING_ITEM.findall(doc) == ["rundir", "lossdb"]
    assert compare(DOCSTRING_ITEM.findall(doc), ["journal", "rundir"], set()) == (
        ["journal"],
        ["lossdb"],
    )
    page = "# Map\n\n### `a/b/`\n\n| `x` | y `z` |\n\n### `a/`\n\n| `b/` | |\n"
    assert TABLE_ROW.findall(section(page, "a/b") or "") == ["x"]
    assert TABLE_ROW.findall(section(page, "a") or "") == ["b/"]
    assert section(page, "b") is None


SHELL_FUNCTION_MAX_LINES = 80
"""The shell's functions fit on a screen (docstring and comments counted): a longer one is
doing several things and wants its parts named."""


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of each function or method in `source` longer than `limit` lines."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_in_the_shell_is_over_80_lines():
    found = {
        f"{path.name}:{name}": lines
        for path in sorted((ROOT / "supervisor" / "shell").glob("*.py"))
        for name, lines in long_functions(path.read_text(), SHELL_FUNCTION_MAX_LINES)
    }
    assert found == {}


def test_a_long_function_is_found():
    body = "".join(f"    x{i} = {i}\n" for i in range(81))
    assert long_functions(f"def short():\n    pass\n\nasync def long():\n{body}", 80) == [
        ("long", 82)
    ]
