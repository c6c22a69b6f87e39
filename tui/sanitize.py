"""Everything the daemon sends is untrusted text: make it safe to put on a terminal.

The daemon relays what the trainer wrote (sample text, crash causes, arm names), so a
string may hold escape sequences, bidi overrides, Rich markup or a megabyte of junk.
Rendering always goes through rich Text built from the cleaned string, never markup.
"""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text

DEFAULT_LIMIT = 400
# CSI/OSC sequences first, so "\x1b[31m" vanishes whole rather than leaving "[31m".
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?")
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]"
)
_BREAKS = re.compile(r"[\t\n\r]+")


def clean(value: Any, limit: int = DEFAULT_LIMIT) -> str:
    """`value` as printable single-line text of at most `limit` characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit * 4:
        # Cap before the regexes so a huge string costs nothing.
        text = text[: limit * 4]
    text = _ESCAPES.sub("", text)
    text = _BREAKS.sub(" ", text)
    text = _INVISIBLE.sub("", text)
    if len(text) > limit:
        text = text[: max(limit - 1, 0)] + "…"
    return text


def safe_text(value: Any, style: str = "", limit: int = DEFAULT_LIMIT) -> Text:
    """A rich Text of the cleaned value: shown literally, markup and all."""
    return Text(clean(value, limit), style=style)


def clean_line(line: str, limit: int = 1000) -> str:
    """One log line, for the log screen."""
    return clean(line, limit)
