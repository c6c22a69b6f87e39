"""Keyed table updates: rows change in place, appear and disappear by key, never rebuilt."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import DataTable


class Cell(Text):
    """A table cell that sorts by `order`, whatever its text says ("1.2 MiB", "12:03:04")."""

    def __init__(self, text: str = "", style: str = "", order: Any = 0) -> None:
        super().__init__(text, style=style, no_wrap=True, overflow="ellipsis")
        self.order = order


def sync_rows(
    table: DataTable[Any],
    rows: Iterable[tuple[str, Sequence[Text]]],
    columns: Sequence[str],
) -> bool:
    """Make `table` hold exactly `rows` (key, cells): update, add, remove. True if rows came or went."""
    wanted: dict[str, Sequence[Text]] = dict(rows)
    changed = False
    for row_key in [key.value for key in table.rows if key.value is not None]:
        if row_key not in wanted:
            table.remove_row(row_key)
            changed = True
    for key, cells in wanted.items():
        if key in table.rows:
            current = table.get_row(key)
            for column, old, new in zip(columns, current, cells, strict=True):
                if not isinstance(old, Text) or old.plain != new.plain or old.style != new.style:
                    table.update_cell(key, column, new, update_width=True)
        else:
            table.add_row(*cells, key=key)
            changed = True
    return changed
