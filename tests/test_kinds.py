"""The vocabularies of core/kinds.py against the sources: the daemon's and the TUI's.

- The TUI spells no journal kind, marker kind or error code: it names them (`Kind.CRASH`,
  `MarkerKind.SPIKE`). Read from its sources with `ast`, as tests/test_layers.py reads
  imports.
- The registry of journal kinds is what the daemon journals, no more and no less, read from
  every call that writes a record; the marker kinds are what the telemetry hub sends; the
  error codes are what the daemon answers, no more and no less.

How a kind is told from the same word used otherwise. A string that equals a registered
word is flagged only where a name is used for matching or as a table's key: an operand of
a comparison or an `in` test (`kind == "crash"`, `case "crash":`), an element of a set,
tuple or list literal or a key of a dict literal (`{"crash", "stall"}`, `{"spike": "S"}`),
a positional argument of a call (`incident.last("spawn")`, `.get(key, "halt")`'s
default) or a keyword argument named `kind` or `code`. A word is not flagged where it is
text or a field's name: docstrings, f-strings, a subscript or the key of a lookup
(`record["state"]`, `status.get("disk_low")`: the protocol's TypedDicts own those names),
any other keyword argument (`id="pivot"`). A word in a flagged place that is something else
of the same spelling (the `pivot` command, the `state` topic) says so with a comment
`# not a kind: <what it is>`, at the end of its line or on the line above; a comment that
excuses nothing fails too.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import get_args, get_type_hints

import pytest

from trainwarden.supervisor import protocol
from trainwarden.supervisor.core import kinds
from trainwarden.supervisor.core.kinds import ERROR_CODES, JOURNAL_KINDS, Kind, MarkerKind

ROOT = Path(__file__).resolve().parent.parent
TUI = ROOT / "tui"
DAEMON = ROOT / "supervisor"

VOCABULARY: dict[str, str] = {}
for _words, _what in (
    (JOURNAL_KINDS, "journal kind"),
    (set(MarkerKind), "marker kind"),
    (ERROR_CODES, "error code"),
):
    for _word in _words:
        VOCABULARY[str(_word)] = " or ".join(filter(None, (VOCABULARY.get(str(_word)), _what)))

LOOKUPS = frozenset({"get", "pop", "setdefault"})
"""Methods whose first argument is a key: a field's name, not a kind."""
NAMING_KEYWORDS = frozenset({"kind", "code"})
EXCUSE = re.compile(r"#\s*not a kind:\s*\S")


# ----------------------------------------------------------------------------- the TUI


def _constant(node: ast.AST | None) -> list[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.Set | ast.Tuple | ast.List):
        return [c for elt in node.elts for c in _constant(elt)]
    return []


def named_places(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string constants in places where a string names something (see the docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                yield from _constant(operand)
        elif isinstance(node, ast.MatchValue):
            yield from _constant(node.value)
        elif isinstance(node, ast.Set | ast.Tuple | ast.List):
            yield from (c for elt in node.elts for c in _constant(elt))
        elif isinstance(node, ast.Dict):
            yield from (c for key in node.keys for c in _constant(key))
        elif isinstance(node, ast.Call):
            args = node.args
            if isinstance(node.func, ast.Attribute) and node.func.attr in LOOKUPS:
                args = args[1:]
            for arg in args:
                yield from _constant(arg)
            for keyword in node.keywords:
                if keyword.arg in NAMING_KEYWORDS:
                    yield from _constant(keyword.value)


def excused_lines(source: str) -> dict[int, int]:
    """The lines an excuse covers, each with the excuse's own line: the line it ends, or
    the next one when the comment stands on a line of its own."""
    lines = source.splitlines()
    covered = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and EXCUSE.search(token.string):
            line = token.start[0]
            alone = not lines[line - 1][: token.start[1]].strip()
            covered[line + 1 if alone else line] = line
    return covered


def bare_words(source: str) -> tuple[list[tuple[int, str]], set[int]]:
    """(line, word) of each registered word spelled in a named place, and the excuse
    comments' lines that excuse none."""
    excused = excused_lines(source)
    found: dict[tuple[int, int], str] = {}
    used: set[int] = set()
    for const in named_places(ast.parse(source)):
        if const.value not in VOCABULARY:
            continue
        if const.lineno in excused:
            used.add(excused[const.lineno])
        else:
            found[(const.lineno, const.col_offset)] = const.value
    return [(line, word) for (line, _), word in sorted(found.items())], set(excused.values()) - used


def tui_sources() -> list[Path]:
    return sorted(TUI.rglob("*.py"))


def test_the_scan_catches_the_spellings_it_is_for():
    spelled = """
if kind == "crash":
    pass
if record.get("kind") not in ("stall", "halt"):
    pass
ALARMING = {"spike", "disk_full"}
GLYPHS = {"skip": "»"}
newest = incident.last("hang_dump")
lead = record.get("kind", "rollback")
refused(code="busy")
match kind:
    case "divergence":
        pass
"""
    found, _ = bare_words(spelled)
    assert [word for _, word in found] == [
        "crash",
        "stall",
        "halt",
        "spike",
        "disk_full",
        "skip",
        "hang_dump",
        "rollback",
        "busy",
        "divergence",
    ]
    text = '''
"""A crash, then a stall: the docstring is text."""
state = record.get("state")
low = status["disk_low"]
said = f"{kind} crash"
Vertical(id="pivot")
words = ("restarted", "crashed")
send("pivot")  # not a kind: the pivot command
# not a kind: the state topic
if topic == "state":
    pass
'''
    assert bare_words(text) == ([], set())
    assert bare_words('x = ("a", "b")  # not a kind: nothing here\n') == ([], {1})
    # An excuse on a line of its own covers the next line only.
    assert bare_words('# not a kind: the topic\n\nif t == "state":\n    pass\n') == (
        [(3, "state")],
        {1},
    )


def test_a_word_is_labelled_with_every_vocabulary_it_belongs_to():
    assert VOCABULARY["crash"] == "journal kind or marker kind"
    assert VOCABULARY["skip"] == "marker kind"
    assert VOCABULARY["no_checkpoint"] == "error code"


@pytest.mark.parametrize("path", tui_sources(), ids=lambda p: str(p.relative_to(TUI)))
def test_the_tui_spells_no_journal_kind_marker_kind_or_error_code(path: Path):
    found, stale = bare_words(path.read_text(encoding="utf-8"))
    where = path.relative_to(ROOT)
    assert not found, (
        "spelled bare (use Kind, MarkerKind or ERROR_CODES from the protocol, or say beside "
        "it `# not a kind: <what it is>`):\n  "
        + "\n  ".join(f"{where}:{line}: {word!r} ({VOCABULARY[word]})" for line, word in found)
    )
    assert not stale, f"{where}: `# not a kind` on lines where no kind is: {sorted(stale)}"


# ----------------------------------------------------------------------------- the daemon


@cache
def daemon_trees() -> dict[str, ast.Module]:
    """Every module of the daemon but the vocabularies' own (core/kinds.py, and the protocol
    that re-exports them), by path under supervisor/."""
    return {
        path.relative_to(DAEMON).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(DAEMON.rglob("*.py"))
        if path.name != "kinds.py" and path.name != "protocol.py"
    }


def in_functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every node with the name of the function it is in (a lambda is in its def)."""
    stack: list[tuple[str, ast.AST]] = [("<module>", tree)]
    while stack:
        function, node = stack.pop()
        yield function, node
        inner = node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else function
        stack.extend((inner, child) for child in ast.iter_child_nodes(node))


def callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else ast.unparse(func)


def literal(node: ast.expr | None) -> list[str] | None:
    """The strings an expression can be, when it is spelled out (None: it is computed)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = literal(node.body), literal(node.orelse)
        return None if body is None or orelse is None else body + orelse
    return None


def argument(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def calls_of(name: str) -> Iterator[tuple[str, str, ast.Call]]:
    """(module, function, call) of every call of `name` (a plain or an attribute call)."""
    for module, tree in daemon_trees().items():
        for function, node in in_functions(tree):
            if isinstance(node, ast.Call) and callee(node).split(".")[-1] == name:
                yield module, function, node


def returned_pairs(module: str, function: str) -> list[str]:
    """The first strings of the `return "name", ...` pairs of a function."""
    found = []
    for inside, node in in_functions(daemon_trees()[module]):
        if (
            inside == function
            and isinstance(node, ast.Return)
            and isinstance(node.value, ast.Tuple)
        ):
            found += literal(node.value.elts[0]) or []
    return found


JOURNAL_OWN_WRITES = {("store/journal.py", "self._write"), ("store/repeats.py", "self.write")}
"""The journal's own writes: its `_write`, and the crash-loop fold's `write` (the journal
hands it `_write`)."""


def writes_a_record(module: str, call: ast.Call) -> bool:
    name = callee(call)
    return (
        name.split(".")[-1] == "Record"
        or name.endswith("journal.append")
        or (module, name) in JOURNAL_OWN_WRITES
    )


def kind_of_display(node: ast.expr | None) -> ast.expr | None:
    """The value of a dict display's "kind" key (None: not a display, or no such key); of
    `a if c else b`, the kind both displays spell alike."""
    if isinstance(node, ast.IfExp):
        body, orelse = kind_of_display(node.body), kind_of_display(node.orelse)
        same = body is not None and orelse is not None and literal(body) == literal(orelse)
        return body if same else None
    if not isinstance(node, ast.Dict):
        return None
    for key, value in zip(node.keys, node.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == "kind":
            return value
    return None


def display_kinds(module: str, function: str) -> list[str]:
    """The kinds spelled in the dict displays of one function."""
    found = []
    for inside, node in in_functions(daemon_trees()[module]):
        if inside == function and isinstance(node, ast.Dict):
            found += literal(kind_of_display(node)) or []
    return found


def entry_kind(function: ast.AST, entry: ast.expr | None) -> ast.expr | None:
    """The kind of a record passed whole (`Record(entry)`, `journal.append(entry)`): the
    "kind" of its display, or of the display its name was given in the same function (a
    `cast` to a record class looked through)."""
    if isinstance(entry, ast.Call) and callee(entry) == "cast" and len(entry.args) == 2:
        entry = entry.args[1]
    if isinstance(entry, ast.Name):
        for node in ast.walk(function):
            if isinstance(node, ast.AnnAssign | ast.Assign):
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                kind = kind_of_display(node.value) if entry.id in names else None
                if kind is not None:
                    return kind
        return None
    return kind_of_display(entry)


def journal_sinks() -> Iterator[tuple[str, str, ast.expr | None]]:
    """(module, function, kind) of every call that writes a journal record: the policy's
    `Record`, a `journal.append` of the shell, serve or store (each takes the record whole,
    a dict display with its "kind"), the journal's own writes (kind, fields)."""
    for module, tree in daemon_trees().items():
        functions = {
            node.name: node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        for function, node in in_functions(tree):
            if not isinstance(node, ast.Call) or not writes_a_record(module, node):
                continue
            if (module, callee(node)) in JOURNAL_OWN_WRITES:
                yield module, function, argument(node, 0, "kind")
            else:
                scope = functions.get(function, tree)
                yield module, function, entry_kind(scope, argument(node, 0, "entry"))


def _disk_space_change() -> list[str]:
    return display_kinds("store/appendfile.py", "change")


COMPUTED_KINDS: dict[tuple[str, str], tuple[str, Callable[[], list[str]]]] = {
    ("shell/executor.py", "execute"): ("a Record action's kind: the Records above", list),
    ("core/rollback.py", "spiked_unseen"): (
        "a spike's Record made again, caught up: the spike Records above",
        list,
    ),
    ("shell/starts.py", "spawn"): (
        "the start's intent",
        lambda: display_kinds("shell/starts.py", "spawn_intent"),
    ),
    ("shell/stray.py", "flush"): (
        "the count begun for the first stray line",
        lambda: display_kinds("shell/stray.py", "note"),
    ),
    ("shell/run_history.py", "_note_loss_space"): (
        ".loss.json full or written again",
        _disk_space_change,
    ),
    ("shell/validation.py", "_note_space"): (
        ".eval.json full or written again",
        _disk_space_change,
    ),
    ("store/journal.py", "_note_space"): ("the journal full or written again", _disk_space_change),
    ("store/journal.py", "append"): ("the caller's kind: the other sinks", list),
    ("store/journal.py", "fold_repeats"): ("the fold's `write`: its own sink", list),
}
"""The calls that journal a kind computed where they are, and where its values come from."""


@cache
def journaled() -> tuple[dict[str, list[str]], set[tuple[str, str]]]:
    """Each kind the daemon journals with where, and the calls whose kind is computed."""
    found: dict[str, list[str]] = {}
    computed = set()
    for module, function, kind in journal_sinks():
        spelled = literal(kind)
        if spelled is None:
            computed.add((module, function))
        for word in spelled or []:
            found.setdefault(word, []).append(f"{module} {function}")
    for site, (_, values) in COMPUTED_KINDS.items():
        for word in values():
            found.setdefault(word, []).append(f"{site[0]} {site[1]} (computed)")
    return found, computed


def test_every_call_that_journals_a_computed_kind_is_known():
    _, computed = journaled()
    assert computed == set(COMPUTED_KINDS), (
        "a journal write whose kind is computed: add it to COMPUTED_KINDS with where its "
        f"values come from:\n  new: {sorted(computed - set(COMPUTED_KINDS))}"
        f"\n  gone: {sorted(set(COMPUTED_KINDS) - computed)}"
    )
    for site, (why, values) in COMPUTED_KINDS.items():
        if values is not list:
            assert values(), f"{site} ({why}): no kind found where it says they come from"


def test_every_kind_the_daemon_journals_is_registered_and_every_registered_one_journaled():
    found, _ = journaled()
    unregistered = {kind: where for kind, where in found.items() if kind not in JOURNAL_KINDS}
    assert not unregistered, "journaled but not in core/kinds.py's JournalKind:\n  " + (
        "\n  ".join(f"{kind}: {', '.join(where)}" for kind, where in sorted(unregistered.items()))
    )
    never = sorted(JOURNAL_KINDS - set(found))
    assert not never, f"in JournalKind but journaled nowhere: {never}"
    assert len(JOURNAL_KINDS) == len(get_args(kinds.JournalKind)), "a kind listed twice"


def test_the_scan_finds_the_journal_writes_of_every_layer():
    found, _ = journaled()
    assert any(w.startswith("core/crashes.py") for w in found["crash"])
    assert any(w.startswith("shell/") for w in found["spawn"])
    assert any(w.startswith("serve/") for w in found["client_dropped"])
    assert any(w.startswith("store/repeats.py") for w in found["repeated"])
    assert {"disk_full", "disk_recovered", "resume_drift", "log_path_moved"} <= set(found)


def test_every_named_kind_is_registered():
    assert {str(kind) for kind in Kind} <= JOURNAL_KINDS
    assert len({str(kind) for kind in Kind}) == len(Kind)


def test_the_marker_kinds_are_the_ones_the_hub_sends():
    """shell/run_history.py maps journal kinds to the markers of a history reply."""
    tree = daemon_trees()["shell/run_history.py"]
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [ast.unparse(t) for t in node.targets] == ["MARKER_KINDS"]
        and isinstance(node.value, ast.Dict)
    )
    sent = {value.value for value in table.values if isinstance(value, ast.Constant)}
    read = {key.value for key in table.keys if isinstance(key, ast.Constant)}
    assert sent == {str(kind) for kind in MarkerKind}
    assert read <= JOURNAL_KINDS
    assert get_type_hints(protocol.Marker)["kind"] is MarkerKind


# ----------------------------------------------------------------------------- error codes


@cache
def code_parameters() -> dict[str, int]:
    """Every function, method and dataclass of the daemon that takes an error code (a
    parameter or field named `code` typed as a string): where its callers pass it."""
    found: dict[str, int] = {}
    for tree in daemon_trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = [
                    b
                    for b in node.body
                    if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)
                ]
                names = [ast.unparse(f.target) for f in fields]
                if "code" in names and ast.unparse(fields[names.index("code")].annotation) in {
                    "str",
                    "ErrorCode",
                    "ErrorCode | None",  # the policy's Reply: None for an ok reply
                }:
                    found[node.name] = names.index("code")
                for method in node.body:
                    if isinstance(method, ast.FunctionDef) and "code" in _params(method):
                        name = node.name if method.name == "__init__" else method.name
                        found[name] = _params(method).index("code") - 1
            elif isinstance(node, ast.Module):
                for function in node.body:
                    if isinstance(function, ast.FunctionDef) and "code" in _params(function):
                        found[function.name] = _params(function).index("code")
    return found


def _params(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in function.args.args]


ADMISSION = ("serve/connection.py", "admission")
"""Returns (code, message) for a client refused at connect: the codes are its pairs'."""
CLIENT_REFUSALS = {
    "would_delete": "`unpin` without --yes, refused by the CLI itself after a dry run",
}
"""Codes of the command line's own refusals (CommandRefused), never on the wire."""
COMPUTED_CODES = {
    ("core/transitions.py", "reply_error"): "its caller's code",
    ("core/transitions.py", "fail_waiters"): "its caller's code",
    ("core/pivot.py", "abort"): "its caller's code, or its default",
    ("serve/control.py", "_failed"): "a CommandError's code",
    ("serve/control.py", "_acting"): "a BadRequest's or the policy's Reply's code",
    ("serve/control.py", "_serve"): "the admission's refusal",
    ("client.py", "result_of"): "the code of a reply read off the socket (the client's)",
}


@cache
def answered_codes() -> tuple[dict[str, list[str]], set[tuple[str, str]]]:
    params = code_parameters()
    found: dict[str, list[str]] = {}
    computed = set()
    for name, index in params.items():
        for module, function, call in calls_of(name):
            value = argument(call, index, "code")
            if value is None:
                continue
            spelled = literal(value)
            if spelled is None:
                computed.add((module, function))
            for code in spelled or []:
                found.setdefault(code, []).append(f"{module} {function}")
    for tree in daemon_trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "code" in _params(node):
                defaults = node.args.defaults
                names = _params(node)
                offset = len(names) - len(defaults)
                for name, default in zip(names[offset:], defaults, strict=True):
                    if name == "code":
                        for code in literal(default) or []:
                            found.setdefault(code, []).append(f"{node.name} (default)")
    for code in returned_pairs(*ADMISSION):
        found.setdefault(code, []).append(" ".join(ADMISSION))
    return found, computed


def on_the_client_side(where: str) -> bool:
    return where.startswith(("cli/", "client.py"))


def test_every_code_the_daemon_answers_is_listed_and_every_listed_one_answered():
    found, _ = answered_codes()
    daemon = {
        code: where
        for code, places in found.items()
        if (where := [w for w in places if not on_the_client_side(w)])
    }
    unlisted = {code: where for code, where in daemon.items() if code not in ERROR_CODES}
    assert not unlisted, "answered but not in ErrorCode (core/kinds.py):\n  " + "\n  ".join(
        f"{code}: {', '.join(where)}" for code, where in sorted(unlisted.items())
    )
    assert sorted(set(ERROR_CODES) - set(daemon)) == [], "listed but never answered"
    assert protocol.ERROR_CODES is ERROR_CODES


def test_the_command_line_refuses_with_the_daemons_codes_or_its_own_known_ones():
    found, _ = answered_codes()
    client = {code for code, places in found.items() if any(map(on_the_client_side, places))}
    assert client <= set(ERROR_CODES) | set(CLIENT_REFUSALS)
    assert set(CLIENT_REFUSALS) <= client, "a client-side refusal that is gone"


def test_every_call_that_answers_a_computed_code_is_known():
    found, computed = answered_codes()
    assert computed == set(COMPUTED_CODES), (
        f"new: {sorted(computed - set(COMPUTED_CODES))}; "
        f"gone: {sorted(set(COMPUTED_CODES) - computed)}"
    )
    assert {"abandoned", "forbidden", "busy", "internal", "bad_request"} <= set(found)
