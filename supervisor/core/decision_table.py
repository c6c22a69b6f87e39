"""The policy on one page: for each event, its handler and the actions that handler may
produce, read from decide's handler map and the core's sources (docs/decisions.md).

The actions are found by reading, not by running: a handler may produce an action when
its body, or the body of a core function, class or module-level name it refers to (by
call or as a value, as `commands.COMMANDS` refers to each command's function), followed
transitively, constructs that action's class. That is an upper bound: a listed action is
produced on some path, not on every one. The sources arrive as text (module name ->
source), so this module reads no file.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import get_args

from trainwarden.supervisor.core.actions import Action

CORE = "trainwarden.supervisor.core"
ACTIONS_MODULE = f"{CORE}.actions"
ACTION_NAMES: tuple[str, ...] = tuple(cls.__name__ for cls in get_args(Action))
"""Every action class, in the order of the Action union."""

Symbol = tuple[str, str]
"""(module, top-level name) of something defined in the core."""


@dataclass(frozen=True)
class _Module:
    definitions: dict[str, ast.AST]
    """Top-level functions, classes and assigned names, by name."""
    imports: dict[str, tuple[str, str | None]]
    """Local name -> (module, name in it), or (module, None) for a module imported whole."""


def _read_module(source: str, modules: Iterable[str]) -> _Module:
    tree = ast.parse(source)
    known = set(modules)
    definitions: dict[str, ast.AST] = {}
    imports: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            definitions[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    definitions[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None:
                definitions[node.target.id] = node.value
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                local = alias.asname or alias.name
                imports[local] = (child, None) if child in known else (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in known:
                    imports[alias.asname] = (alias.name, None)
    return _Module(definitions, imports)


class _Core:
    """The core's modules, parsed once, and what each name in them refers to."""

    def __init__(self, sources: Mapping[str, str]) -> None:
        self.modules = {name: _read_module(text, sources) for name, text in sources.items()}

    def resolve(self, module: str, node: ast.AST) -> Symbol | None:
        """The core definition a Name or Attribute in `module` refers to, if any."""
        here = self.modules[module]
        if isinstance(node, ast.Name):
            if node.id in here.definitions:
                return module, node.id
            if node.id in here.imports:
                target, name = here.imports[node.id]
                if name is not None and target in self.modules:
                    return target, name
            return None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target, name = here.imports.get(node.value.id, ("", ""))
            if name is None and target in self.modules:
                return target, node.attr
        return None

    def produced(self, start: Symbol) -> tuple[str, ...]:
        """The actions `start` may produce, in the order of the Action union."""
        found: set[str] = set()
        seen = {start}
        todo = [start]
        while todo:
            module, name = todo.pop()
            node = self.modules[module].definitions.get(name)
            if node is None:
                continue
            # A construction, for an action class: `isinstance(a, Reply)` makes no Reply.
            called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
            for child in ast.walk(node):
                referred = self.resolve(module, child)
                if referred is None:
                    continue
                if referred[0] == ACTIONS_MODULE:
                    if referred[1] in ACTION_NAMES and id(child) in called:
                        found.add(referred[1])
                elif referred[1] in self.modules[referred[0]].definitions and referred not in seen:
                    seen.add(referred)
                    todo.append(referred)
        return tuple(name for name in ACTION_NAMES if name in found)

    def referred_functions(self, start: Symbol) -> list[Symbol]:
        """The core functions `start`'s own body refers to, in the order they appear."""
        module, name = start
        found: dict[Symbol, tuple[int, int]] = {}
        for child in ast.walk(self.modules[module].definitions[name]):
            referred = self.resolve(module, child)
            if referred is None or referred == start:
                continue
            definition = self.modules[referred[0]].definitions.get(referred[1])
            if isinstance(definition, ast.FunctionDef):
                where = (getattr(child, "lineno", 0), getattr(child, "col_offset", 0))
                found[referred] = min(found.get(referred, where), where)
        return sorted(found, key=found.__getitem__)

    def class_doc(self, module: str, name: str) -> str:
        node = self.modules[module].definitions.get(name)
        doc = ast.get_docstring(node) if isinstance(node, ast.ClassDef) else None
        return first_sentence(doc or "")


def actions_of(sources: Mapping[str, str], module: str, function: str) -> tuple[str, ...]:
    """The actions `module`'s `function` may produce, as action class names in the order
    of the Action union. `sources` holds every core module's text by its module name."""
    return _Core(sources).produced((module, function))


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, on one line (empty for no docstring)."""
    text = " ".join(doc.split())
    for i, char in enumerate(text):
        if char == "." and (i + 1 == len(text) or text[i + 1] == " "):
            return text[: i + 1]
    return text


def short_name(module: str, name: str) -> str:
    """`lifecycle.on_exited` for trainwarden.supervisor.core.lifecycle's on_exited."""
    return f"{module.removeprefix(CORE + '.')}.{name}"


def _link(module: str, name: str) -> str:
    path = module.removeprefix("trainwarden.").replace(".", "/")
    return f"[`{short_name(module, name)}`](../{path}.py)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _names(actions: tuple[str, ...]) -> str:
    return ", ".join(f"`{name}`" for name in actions) or "none"


def decision_table(
    handlers: Mapping[type, Callable[..., object]],
    sources: Mapping[str, str],
    dispatch: Callable[..., object],
) -> str:
    """The Markdown table, one row per event of `handlers` (in its order), then a line on
    the core functions `dispatch` (decide) calls besides the handler and what they may
    add. `sources` holds every core module's text by its module name."""
    core = _Core(sources)
    lines = [
        "| event | what it means | handler | actions it may produce |",
        "| --- | --- | --- | --- |",
    ]
    for event, handler in handlers.items():
        symbol = (handler.__module__, handler.__qualname__)
        meaning = core.class_doc(event.__module__, event.__name__) or "(no docstring)"
        cells = [f"`{event.__name__}`", _cell(meaning), _link(*symbol)]
        lines.append("| " + " | ".join([*cells, _names(core.produced(symbol))]) + " |")
    own = (dispatch.__module__, dispatch.__qualname__)
    handler_symbols = {(h.__module__, h.__qualname__) for h in handlers.values()}
    around = [
        f"{_link(*symbol)} ({_names(core.produced(symbol))})"
        for symbol in core.referred_functions(own)
        if symbol not in handler_symbols
    ]
    if around:
        lines += [
            "",
            f"Besides the handler, {_link(*own)} calls " + "; ".join(around) + ". "
            "Its source says for which events.",
        ]
    return "\n".join(lines) + "\n"
