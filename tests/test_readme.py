"""The README and docs/ stay true: every config key is in the configuration reference,
every CLI command in the command table or the docs, the quick start's test command is the
one CI runs, every relative link leads to a file and heading that exist, and every example
the docs quote is the file it names, byte for byte."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from urllib.parse import unquote

from trainwarden.supervisor.cli.main import build_parser
from trainwarden.supervisor.config_schema import TABLES

ROOT = Path(__file__).resolve().parent.parent
README_PATH = ROOT / "README.md"
DOCS = ROOT / "docs"
README = README_PATH.read_text()
PAGES = [README_PATH, *sorted(DOCS.rglob("*.md"))]
ALL_TEXT = "\n".join(page.read_text() for page in PAGES)
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link in a code sample is not a link)."""
    return FENCE.sub("", text)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(page.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        anchor = github_anchor(match.group(1))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def test_every_config_key_is_in_the_reference():
    reference = (DOCS / "configuration.md").read_text()
    missing = [
        f"{table}.{f.name}"
        for table, cls in TABLES.items()
        for f in dataclasses.fields(cls)
        if f"`{table}.{f.name}`" not in reference
    ]
    assert not missing, f"docs/configuration.md's table lacks {missing}"


def test_every_config_table_is_in_the_readme_summary():
    missing = [table for table in TABLES if f"`[{table}]`" not in README]
    assert not missing, f"README's configuration summary lacks {missing}"


def test_every_command_is_in_the_table():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    missing = [
        name for name in sub.choices if f"`{name} " not in ALL_TEXT and f"`{name}`" not in ALL_TEXT
    ]
    assert not missing, f"the command table (README or docs/) lacks {missing}"


def test_quick_start_commands_are_the_ci_ones():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line for line in README.splitlines() if "python -m pytest" in line)
    assert test_command.strip() in ci


def test_every_relative_link_leads_to_a_file_and_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / unquote(path_part)).resolve() if path_part else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A section\n\n[ok](#a-section) [bad](#no-section)\n")
    targets = LINK.findall(prose(page.read_text()))
    assert targets == ["#a-section", "#no-section"]
    assert "a-section" in anchors(page) and "no-section" not in anchors(page)


def test_quoted_examples_are_the_files():
    quoted = 0
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(
            r"<!-- example: (\S+) -->\n```[a-z]*\n(.*?)^```$", text, re.S | re.M
        ):
            quoted += 1
            name, body = match.groups()
            assert body == (ROOT / name).read_text(), f"{page.name} quotes {name} differently"
    examples = sorted((DOCS / "examples").iterdir())
    assert quoted >= len(examples), "every file in docs/examples/ is quoted"
    for example in examples:
        assert f"<!-- example: docs/examples/{example.name} -->" in ALL_TEXT


def test_the_readme_keys_are_the_tuis():
    from trainwarden.tui.screens.help import KEYS

    missing = [key for key, _ in KEYS if f"| `{key}` |" not in README]
    assert not missing, f"README's TUI keys lack {missing}"
