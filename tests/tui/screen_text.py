"""The screen as plain text, the way an operator reads it (for assertions in pilot tests)."""

from __future__ import annotations

from textual.app import App


def screen_text(app: App[object]) -> str:
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(segment.text for segment in strip) for strip in strips)
