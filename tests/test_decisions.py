"""docs/decisions.md is the decision table generated from decide's handler map, and it is
current; every event type has a handler.

Regenerate the page with `.venv/bin/python -m tests.test_decisions`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import get_args

import trainwarden.supervisor.core as core_package
from trainwarden.supervisor.core.decide import HANDLERS, decide
from trainwarden.supervisor.core.decision_table import CORE, actions_of, decision_table
from trainwarden.supervisor.core.events import Event

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "decisions.md"
COMMAND = ".venv/bin/python -m tests.test_decisions"

INTRO = f"""# Decisions: event, handler, actions

The policy on one page. For each event the policy is told
([`core/events.py`](../supervisor/core/events.py)): the handler `decide` gives it to (its
handler map, `HANDLERS` in [`core/decide.py`](../supervisor/core/decide.py)), and the actions
([`core/actions.py`](../supervisor/core/actions.py)) that handler may ask the executor for.
Back to the [code map](code-map.md).

This page is generated: `{COMMAND}` rebuilds it from the
handler map and the core's sources, and `tests/test_decisions.py` fails when it is out of
date. The column "what it means" is the first sentence of the event class's docstring. An
action is listed when the handler, or a core function, class or module-level name it
refers to (followed transitively, through maps such as `commands.COMMANDS`), constructs
it. That is an upper bound: a listed action is produced on some path, not on every one.

"""


def core_sources() -> dict[str, str]:
    """Every module of the core, by its module name."""
    folder = Path(core_package.__file__).parent
    return {
        CORE if path.stem == "__init__" else f"{CORE}.{path.stem}": path.read_text(encoding="utf-8")
        for path in sorted(folder.glob("*.py"))
    }


def page() -> str:
    return INTRO + decision_table(HANDLERS, core_sources(), decide)


def test_every_event_type_has_a_handler():
    events = get_args(Event)
    missing = [cls.__name__ for cls in events if cls not in HANDLERS]
    assert not missing, (
        "decide's handler map (HANDLERS in supervisor/core/decide.py) has no handler for "
        + ", ".join(missing)
    )
    strays = [cls.__name__ for cls in HANDLERS if cls not in events]
    assert not strays, "HANDLERS has keys that are not in events.Event: " + ", ".join(strays)


def test_the_decision_table_is_current():
    written = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert written == page(), f"docs/decisions.md is out of date; regenerate it: {COMMAND}"


def test_actions_are_followed_through_calls_maps_and_modules():
    """A construction counts, through a helper in another module reached through a
    module-level map; naming a class in isinstance and a function nobody refers to do not."""
    sources = {
        f"{CORE}.fake": (
            "from trainwarden.supervisor.core import helpers\n"
            "from trainwarden.supervisor.core.actions import Exit, Record, Reply\n"
            "def handler(state, ev, rules, actions):\n"
            "    if isinstance(ev, Record):\n"
            "        return state\n"
            "    return TABLE[type(ev)](state, actions)\n"
            "TABLE = {int: helpers.answer}\n"
            "def unused(actions):\n"
            "    actions.append(Exit())\n"
        ),
        f"{CORE}.helpers": (
            "from trainwarden.supervisor.core import actions as made\n"
            "def answer(state, actions):\n"
            "    actions.append(made.Reply(1, True))\n"
            "    return state\n"
        ),
        f"{CORE}.actions": "",
    }
    assert actions_of(sources, f"{CORE}.fake", "handler") == ("Reply",)


def test_the_real_handlers_reach_their_actions():
    sources = core_sources()
    # A crash restarts the trainer; an operator's command is answered through COMMANDS.
    assert "Spawn" in actions_of(sources, f"{CORE}.lifecycle", "on_exited")
    assert "Reply" in actions_of(sources, f"{CORE}.commands", "on_operator")
    assert "WritePolicy" in actions_of(sources, f"{CORE}.commands", "on_operator")


if __name__ == "__main__":
    PAGE.write_text(page(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)
