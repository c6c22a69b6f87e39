"""The figures the docs quote are the bench's.

Every measured figure in README.md and docs/*.md is followed by a marker that names the
value of bench/results.json it comes from (the file `python -m bench` writes beside
RESULTS.md):

    trainwarden's p99 is 24.0 ms<!-- bench: restart.rows[trainwarden][p99 ms] -->

The path starts with a section's key (the keys of `python -m bench --only`) or a top-level
key of results.json (`seconds`), then keys (`.raw.summary`) and selectors in brackets:

- `[2]`, `[-1]`: an item of a list;
- `[text]` on a section's rows: the row that starts with the parts of text split at
  ` / `, in order, the first part its first cell (`[trainwarden / 1,000]`; quote a number,
  `["10"]`, or it is an index), then `[column]`: its cell under the header's column;
- `[text]` on the targets: the one whose goal starts with text;
- `[text]` on a dict: a key with spaces or dots (`raw[page cache]`).

A table cell shows what RESULTS.md prints. A raw number needs ` as FORMAT`: `ms` and
`ratio` are bench.common's fmt_ms and fmt_ratio, anything else a format spec (`,.0f`). A
`|` in a marker inside a table is written `\\|`, as the table's own cells write it.

The figure is the number right before the marker (with its unit, if any): it must be the
value's number exactly as the bench prints it ("1,028", "0.60 %"), and the same unit where
both name one. A marker after a word (met, missed) compares the word.

Figures that need a marker: a number with a unit (ms, s, us, %, x, MB, GB, lines/s, ...),
or a number joined by ` / ` or `-` to such a figure ("0.74 / 0.89 ms"). In docs/benchmarks.md
every block needs them; elsewhere every block (paragraph, list item, table row) that holds
a marker, and every sentence that names a "bench section". Not measurements, so not asked
for: code spans, headings, a table's header and first column (the row's label), a figure
after a bound (`<`, `under`, `within`, `target`, ...) and a rate after "at" (the rate the
bench runs at). Anything else that is not a measurement says so: `<!-- not measured: why
-->` after it excuses every figure since the previous marker in its block (or table cell);
alone on a line, it excuses the next block.

`python -m tests.test_bench_figures` prints every difference as `file:line: wrote X,
results.json says Y at PATH`, for one pass over the docs after a full run of the bench.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import COMPARISONS
from bench.common import fmt_ms, fmt_ratio

ROOT = Path(__file__).resolve().parent.parent
RESULTS_JSON = ROOT / "bench" / "results.json"
STRICT_FILES = {"docs/benchmarks.md"}
TOP_LEVEL_KEYS = {"command", "mode", "date", "machine", "peers", "seconds"}

MARKER = re.compile(r"<!--\s*(bench|not measured):(.*?)-->", re.S)
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.S)
NUMBER = re.compile(r"(?<![\w.,])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
UNIT = re.compile(
    r"(?:x|\s?(?:MB/s|GB/s|lines/s|steps/s|ms|us|µs|s|min|minutes|seconds|%"
    r"|MB|GB|KB|TB|KiB|MiB|GiB|B))(?![\w/])"
)
JOINED_TO_NEXT = re.compile(r"\s*/\s*|-")
ADJACENT = re.compile(r"\s?[A-Za-zµ%/]*\s*")
"""What may stand between a figure and its marker: the figure's unit."""
BOUND = re.compile(r"(?:<=?|>=?|≤|≥|\bunder|\bover|\bwithin|\bup to|\bat most|\bat least"
                   r"|\bbelow|\btarget(?: of)?)\s*$")  # fmt: skip
RATE_ASKED = re.compile(r"\bat(?:\s+[\d,]+?\s*(?:,|and|or))*\s*$", re.I)
"""Before a rate ("at 10, 100 and 10,000 lines/s"): the rates the bench runs at."""
RATES = {"lines/s", "steps/s"}
SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Z(*`\[]|\s*$)")
EXPECTED_FIGURE = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?)\s?([A-Za-zµ%/]*)")
NAMES_THE_BENCH = re.compile(r"bench section", re.I)


class Unresolved(Exception):
    """A marker's path names no value of results.json (or one it cannot format)."""


@dataclass(frozen=True)
class Quote:
    """A figure of the docs and the value of results.json it claims to be."""

    file: str
    line: int
    before: str
    """The block's text from the previous marker to this one (code spans blanked)."""
    path: str
    fmt: str | None

    def written(self) -> tuple[str, str | None, str]:
        """(the figure as written, its number or None for a word, its unit)."""
        number = _adjacent_number(self.before)
        if number is None:
            word = self.before.split()[-1] if self.before.split() else ""
            return word.strip("*_()"), None, ""
        rest = self.before[number.end() :].strip()
        return f"{number.group()} {rest}".strip(), number.group(), rest


@dataclass
class Scan:
    quotes: list[Quote]
    problems: list[str]


def _adjacent_number(before: str) -> re.Match[str] | None:
    """The last number of `before` if only its unit stands between it and the end."""
    numbers = list(NUMBER.finditer(before))
    if numbers and ADJACENT.fullmatch(before, numbers[-1].end()):
        return numbers[-1]
    return None


# ----------------------------------------------------------------------------- scanning


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blank(text: str, pattern: re.Pattern[str]) -> str:
    """text with every match of pattern replaced by spaces (newlines kept)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def _blocks(lines: list[str]) -> Iterator[tuple[int, list[str], str]]:
    """(first line number, lines, kind) per block outside fenced code: kind is 'table',
    'heading', 'excuse' (a line holding only a `not measured` marker) or 'text'. A table
    row, a heading and a list item each start a block of their own."""
    block: list[str] = []
    start = 0
    fenced = False

    def flush() -> Iterator[tuple[int, list[str], str]]:
        if block:
            yield start, list(block), "text"
            block.clear()

    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            yield from flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not stripped:
            yield from flush()
        elif stripped.startswith("|"):
            yield from flush()
            yield number, [line], "table"
        elif stripped.startswith("#"):
            yield from flush()
            yield number, [line], "heading"
        elif re.fullmatch(r"<!--\s*not measured:.*-->", stripped):
            yield from flush()
            yield number, [line], "excuse"
        else:
            if re.match(r"\s*(?:[-*+]|\d+\.)\s", line):
                yield from flush()
            if not block:
                start = number
            block.append(line)
    yield from flush()


def _sentences(masked: str) -> list[tuple[int, int]]:
    starts = [0, *(m.end() for m in SENTENCE_END.finditer(masked))]
    return list(zip(starts, [*starts[1:], len(masked)], strict=True))


def _figures(masked: str) -> list[re.Match[str]]:
    """The numbers of masked that are figures: with a unit, or joined to one."""
    numbers = list(NUMBER.finditer(masked))
    is_figure = [False] * len(numbers)
    for i in range(len(numbers) - 1, -1, -1):
        end = numbers[i].end()
        joined = (
            i + 1 < len(numbers)
            and is_figure[i + 1]
            and JOINED_TO_NEXT.fullmatch(masked, end, numbers[i + 1].start()) is not None
        )
        is_figure[i] = bool(UNIT.match(masked, end)) or joined
    return [n for n, figure in zip(numbers, is_figure, strict=True) if figure]


def _within(position: int, ranges: list[tuple[int, int]]) -> bool:
    return any(lo <= position < hi for lo, hi in ranges)


class _Scanner:
    def __init__(self, name: str) -> None:
        self.name = name
        self.quotes: list[Quote] = []
        self.problems: list[str] = []

    def span(
        self, text: str, line_of: list[int], strict: bool, excused: bool, label: bool = False
    ) -> None:
        """One scope (a block, or a table cell): its markers, and its figures checked,
        excused or missing a marker. line_of[i] is the line of text[i]. Not strict: only
        the sentences that name a bench section need markers; a label needs none."""
        masked = _blank(text, CODE_SPAN)
        if label:
            needed = []
        elif strict or MARKER.search(masked):
            needed = [(0, len(text))]
        else:
            needed = [s for s in _sentences(masked) if NAMES_THE_BENCH.search(masked, *s)]
        markers = list(MARKER.finditer(masked))
        masked = _blank(masked, MARKER)
        checked: set[int] = set()
        excused_ranges = [(0, len(text))] if excused else []
        scope_start = 0
        for marker in markers:
            kind, body = marker.group(1), " ".join(marker.group(2).split())
            line = line_of[marker.start()]
            before = masked[scope_start : marker.start()]
            if kind == "not measured":
                if not body:
                    self.problems.append(f"{self.name}:{line}: `not measured` needs a reason")
                excused_ranges.append((scope_start, marker.start()))
            else:
                quote = self.quote(body.replace("\\|", "|"), before, line)
                if quote is not None:
                    number = _adjacent_number(before)
                    if number is not None:
                        checked.add(scope_start + number.start())
            scope_start = marker.end()
        for figure in _figures(masked):
            if figure.start() in checked or not _within(figure.start(), needed):
                continue
            if _within(figure.start(), excused_ranges):
                continue
            unit = UNIT.match(masked, figure.end())
            if BOUND.search(masked, 0, figure.start()) or (
                unit
                and unit.group().strip() in RATES
                and RATE_ASKED.search(masked, 0, figure.start())
            ):
                continue
            shown = figure.group() + (unit.group() if unit else "")
            self.problems.append(
                f"{self.name}:{line_of[figure.start()]}: {shown!r} has no marker: "
                "add <!-- bench: PATH --> after it, or <!-- not measured: why -->"
            )

    def quote(self, body: str, before: str, line: int) -> Quote | None:
        match = re.fullmatch(r"(.*?)(?:\s+as\s+([^\s\]]+))?", body)
        path, fmt = (match.group(1), match.group(2)) if match else (body, None)
        try:
            first = parse_path(path)[0]
        except Unresolved as exc:
            self.problems.append(f"{self.name}:{line}: {exc}")
            return None
        if first not in COMPARISONS and first not in TOP_LEVEL_KEYS:
            self.problems.append(
                f"{self.name}:{line}: {path!r} starts with {first!r}, not a section of the "
                f"bench ({', '.join(COMPARISONS)}) or a top-level key ({', '.join(sorted(TOP_LEVEL_KEYS))})"
            )
            return None
        if not before.strip():
            self.problems.append(f"{self.name}:{line}: the marker for {path!r} follows no figure")
            return None
        quote = Quote(self.name, line, before, path, fmt)
        self.quotes.append(quote)
        return quote


def scan_text(name: str, text: str, strict_file: bool | None = None) -> Scan:
    """Every marker of a Markdown file, and every figure that lacks one where one is due."""
    scanner = _Scanner(name)
    strict_file = name in STRICT_FILES if strict_file is None else strict_file
    lines = text.splitlines()
    excuse_next = False
    in_excused_table = False
    for start, block, kind in _blocks(lines):
        if kind == "excuse":
            excuse_next = True
            continue
        if kind != "table":
            in_excused_table = False
        joined = "\n".join(block)
        line_of = [start + joined.count("\n", 0, i) for i in range(len(joined) + 1)]
        strict = kind != "heading" and (strict_file or bool(MARKER.search(joined)))
        if kind == "table":
            excused = excuse_next or in_excused_table
            in_excused_table = excused
            excuse_next = False
            row = block[0]
            if re.fullmatch(r"\s*\|[\s:|-]*\|?\s*", row):
                continue
            next_line = lines[start] if start < len(lines) else ""
            header_row = bool(re.fullmatch(r"\s*\|[\s:|-]*-[\s:|-]*", next_line))
            masked = _blank(_blank(row, CODE_SPAN), MARKER)
            bounds = [i for i, c in enumerate(masked) if c == "|" and masked[i - 1 : i] != "\\"]
            for cell, (left, right) in enumerate(zip(bounds, bounds[1:], strict=False)):
                label = cell == 0 or header_row
                scanner.span(
                    row[left + 1 : right], line_of[left + 1 : right + 1], strict, excused, label
                )
            continue
        if kind != "heading":
            scanner.span(joined, line_of, strict, excuse_next)
        excuse_next = False
    return Scan(scanner.quotes, scanner.problems)


def scan_docs() -> Scan:
    quotes: list[Quote] = []
    problems: list[str] = []
    for path in doc_files():
        found = scan_text(str(path.relative_to(ROOT)), path.read_text())
        quotes += found.quotes
        problems += found.problems
    return Scan(quotes, problems)


# ----------------------------------------------------------------------------- results.json


def parse_path(path: str) -> list[str | int | tuple[str]]:
    """A marker's path as keys (str), indexes (int) and selectors ((text,))."""
    parts: list[str | int | tuple[str]] = []
    pos = 0
    segment = re.compile(r"\.?([^.\[\]\s]+)|\[([^\]]*)\]")
    while pos < len(path):
        match = segment.match(path, pos)
        if match is None or (pos == 0 and match.group(1) is None):
            raise Unresolved(f"cannot read the path {path!r} at {path[pos:]!r}")
        if match.group(1) is not None:
            parts.append(match.group(1))
        else:
            inner = match.group(2).strip()
            if re.fullmatch(r"-?\d+", inner):
                parts.append(int(inner))
            elif len(inner) >= 2 and inner[0] in "\"'" and inner[-1] == inner[0]:
                parts.append((inner[1:-1],))
            else:
                parts.append((inner,))
        pos = match.end()
    if not parts:
        raise Unresolved("the marker names no path")
    return parts


def resolve(document: dict[str, Any], path: str) -> Any:
    """The value of results.json a marker's path names (Unresolved says why not)."""
    parts = parse_path(path)
    first = parts[0]
    sections = document.get("sections", {})
    if first in sections:
        value: Any = sections[first]
    elif first in document and first != "sections":
        value = document[first]
    else:
        raise Unresolved(
            f"no section {first!r} (`python -m bench --only {first}` writes it)"
            if first in COMPARISONS
            else f"no key {first!r}"
        )
    header: list[str] = value.get("header", []) if isinstance(value, dict) else []
    for part in parts[1:]:
        value = _step(value, part, header)
        if isinstance(value, dict) and isinstance(value.get("header"), list):
            header = value["header"]
    return value


def _step(value: Any, part: str | int | tuple[str], header: list[str]) -> Any:
    if isinstance(value, dict):
        key = part[0] if isinstance(part, tuple) else str(part)
        if key not in value:
            raise Unresolved(f"no key {key!r} (keys: {', '.join(map(str, value))})")
        return value[key]
    if not isinstance(value, list):
        raise Unresolved(f"{value!r} has no {part!r}")
    if isinstance(part, int):
        if not -len(value) <= part < len(value):
            raise Unresolved(f"no item {part} of {len(value)}")
        return value[part]
    text = part[0] if isinstance(part, tuple) else part
    if value and all(isinstance(item, str) for item in value):
        if text not in header:
            raise Unresolved(f"no column {text!r} (columns: {', '.join(header)})")
        return value[header.index(text)]
    if all(isinstance(item, list) for item in value):
        wanted = text.split(" / ")
        found = [row for row in value if row[:1] == wanted[:1] and _in_order(wanted[1:], row[1:])]
        what = "rows start with"
    else:
        found = [
            item
            for item in value
            if isinstance(item, dict) and str(next(iter(item.values()), "")).startswith(text)
        ]
        what = "items start with"
    if len(found) != 1:
        raise Unresolved(f"{len(found)} {what} {text!r}")  # none, or which one is unclear
    return found[0]


def _in_order(wanted: list[str], cells: list[Any]) -> bool:
    remaining = iter(cells)
    return all(any(cell == w for cell in remaining) for w in wanted)


def formatted(value: Any, fmt: str | None) -> str:
    """value as the bench prints it."""
    if fmt is None:
        if isinstance(value, bool):
            return "met" if value else "missed"
        if value is None:
            return "-"
        if isinstance(value, str):
            return value
        if isinstance(value, int):
            return f"{value:,}"
        raise Unresolved(f"{value!r} is a raw number: name its format (as ms, as ratio, as ,.0f)")
    if fmt == "ms":
        return fmt_ms(value)
    if fmt == "ratio":
        return fmt_ratio(value)
    try:
        return format(value, fmt)
    except (TypeError, ValueError) as exc:
        raise Unresolved(f"cannot format {value!r} as {fmt!r}: {exc}") from None


def mismatch(quote: Quote, document: dict[str, Any]) -> str | None:
    """None where the quote is the value; else `file:line: wrote X, results.json says Y`."""
    written, number, unit = quote.written()
    where = f"{quote.file}:{quote.line}: wrote {written!r}"
    try:
        expected = formatted(resolve(document, quote.path), quote.fmt)
    except Unresolved as exc:
        return f"{where}, results.json has nothing at {quote.path}: {exc}"
    figure = EXPECTED_FIGURE.fullmatch(expected)
    if figure is not None and number is not None:
        same = figure.group(1) == number and (
            not figure.group(2) or not unit or figure.group(2) == unit
        )
    elif " " in expected:
        same = quote.before.rstrip(" *_)").endswith(expected)
    else:
        same = written == expected
    if same:
        return None
    return f"{where}, results.json says {expected!r} at {quote.path}"


def mismatches(quotes: list[Quote], document: dict[str, Any]) -> list[str]:
    return [m for m in (mismatch(q, document) for q in quotes) if m is not None]


# ----------------------------------------------------------------------------- the tests


def test_every_figure_of_the_docs_has_a_marker_that_reads() -> None:
    scan = scan_docs()
    assert not scan.problems, "\n".join(scan.problems)
    assert any(q.file == "docs/benchmarks.md" for q in scan.quotes)


def test_every_quoted_figure_is_the_one_in_results_json() -> None:
    if not RESULTS_JSON.exists():
        pytest.skip("bench/results.json does not exist: `python -m bench` writes it")
    document = json.loads(RESULTS_JSON.read_text())
    found = mismatches(scan_docs().quotes, document)
    assert not found, f"{len(found)} figure(s) differ from bench/results.json:\n" + "\n".join(found)


DOCUMENT = {
    "seconds": 529.8,
    "sections": {
        "restart": {
            "header": ["supervisor", "p99 ms", "p99 / trainwarden's"],
            "rows": [["trainwarden", "24.0", "1.00x"], ["torchrun", "339", "14x"]],
            "targets": [
                {"goal": "crash -> restarted p99 < 50 ms", "measured": "24.0 ms", "met": True}
            ],  # fmt: skip
            "raw": {"summary": {"torchrun": {"p99_ms": 339.4}}},
        },
        "overhead": {
            "header": ["supervisor", "lines/s (asked)", "% of a core"],
            "rows": [["trainwarden", "10", "0.70 %"], ["trainwarden", "1,000", "17.05 %"]],
        },
    },
}


def _check(text: str) -> tuple[list[str], list[str]]:
    scan = scan_text("doc.md", text, strict_file=True)
    return scan.problems, mismatches(scan.quotes, DOCUMENT)


def test_the_checker_accepts_figures_as_the_bench_prints_them() -> None:
    problems, wrong = _check(
        "p99 24.0 ms<!-- bench: restart.rows[trainwarden][p99 ms] -->, torchrun 339.4"
        " <!-- bench: restart.raw.summary.torchrun.p99_ms as .1f --> ms (14x<!-- bench:"
        " restart.rows[torchrun][p99 / trainwarden's] -->), target < 50 ms: met<!-- bench:"
        " restart.targets[crash -> restarted].met -->; 17.05 %<!-- bench:"
        " overhead.rows[trainwarden / 1,000][% of a core] --> at 1,000 lines/s<!-- not"
        " measured: the rate asked -->; the run took 530 s<!-- bench: seconds as .0f -->.\n"
    )
    assert (problems, wrong) == ([], [])


def test_the_checker_lists_each_wrong_figure_with_its_place_and_the_value() -> None:
    problems, wrong = _check(
        "intro\n\n| what | figure |\n|---|---|\n"
        "| restart, 10 / 20 lines/s | 24 ms<!-- bench: restart.rows[trainwarden][p99 ms] --> |\n"
        "| share | **missed**<!-- bench: restart.targets[crash].met --> at 0.70 ms"
        "<!-- bench: overhead.rows[trainwarden / 10][% of a core] --> |\n"
        "| verify | 96 %<!-- bench: verify.rows[disk / verify][share] --> |\n"
        "\nAnd 17.05 %<!-- bench: overhead.rows[trainwarden][% of a core] -->.\n"
    )
    assert problems == []
    assert wrong == [
        "doc.md:5: wrote '24 ms', results.json says '24.0' at restart.rows[trainwarden][p99 ms]",
        "doc.md:6: wrote 'missed', results.json says 'met' at restart.targets[crash].met",
        "doc.md:6: wrote '0.70 ms', results.json says '0.70 %' at overhead.rows[trainwarden / 10]"
        "[% of a core]",
        "doc.md:7: wrote '96 %', results.json has nothing at verify.rows[disk / verify][share]:"
        " no section 'verify' (`python -m bench --only verify` writes it)",
        "doc.md:9: wrote '17.05 %', results.json has nothing at overhead.rows[trainwarden][% of"
        " a core]: 2 rows start with 'trainwarden'",
    ]


def test_the_checker_flags_a_figure_without_a_marker_and_a_marker_it_cannot_read() -> None:
    problems, _ = _check(
        "Restarts take 24.0 ms, or 0.74 / 0.89 ms<!-- bench: restart.rows[0][p99 ms] -->"
        " and `12 ms` in code; within 5 s, at 10 lines/s; 9 ms<!-- not measured: a guess -->."
        "\n\n"
        "<!-- not measured: an example -->\n| a | b |\n|---|---|\n| x | 3 ms |\n\n"
        "7 ms<!-- bench: restrat.rows[0][p99 ms] -->\n"
    )
    unmarked = "has no marker: add <!-- bench: PATH --> after it, or <!-- not measured: why -->"
    assert problems == [
        f"doc.md:1: '24.0 ms' {unmarked}",
        f"doc.md:1: '0.74' {unmarked}",
        "doc.md:8: 'restrat.rows[0][p99 ms]' starts with 'restrat', not a section of the "
        f"bench ({', '.join(COMPARISONS)}) or a top-level key (command, date, machine, mode, "
        "peers, seconds)",
        f"doc.md:8: '7 ms' {unmarked}",
    ]
    # Outside docs/benchmarks.md, a block that neither holds a marker nor names a bench
    # section is not the bench's.
    assert scan_text("other.md", "Restarts take 24.0 ms.\n").problems == []
    assert scan_text("other.md", "As bench section 1 says: 24.0 ms.\n").problems != []


def main() -> int:
    scan = scan_docs()
    found = list(scan.problems)
    if RESULTS_JSON.exists():
        found += mismatches(scan.quotes, json.loads(RESULTS_JSON.read_text()))
    else:
        found.append(f"{RESULTS_JSON.relative_to(ROOT)} does not exist: run `python -m bench`")
    print("\n".join(found) if found else f"{len(scan.quotes)} figures, all as in results.json")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
