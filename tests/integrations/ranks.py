"""What the workers of a torchrun test record in the run's seen/ folder: each rank writes
its pid to rank<R>.pid and appends one line per request it acted on to rank<R>.log."""

from __future__ import annotations

from pathlib import Path


def seen(run_dir: Path, rank: int) -> list[str]:
    """What rank `rank` has recorded, in order: its whole lines (one being written is left
    out, so a reader racing the writer never sees half a line)."""
    path = run_dir / "seen" / f"rank{rank}.log"
    return path.read_text().split("\n")[:-1] if path.exists() else []


def workers(run_dir: Path) -> list[int]:
    """The workers' pids, once each has written its pid file whole (else an empty list)."""
    texts = [p.read_text() for p in sorted((run_dir / "seen").glob("rank*.pid"))]
    if not all(text.isdigit() for text in texts):
        return []
    return [int(text) for text in texts]


def agreed(run_dir: Path, count: int) -> list[str]:
    """The first `count` records, once both ranks have made them (the same on both)."""
    mine, theirs = seen(run_dir, 0), seen(run_dir, 1)
    if len(mine) < count or len(theirs) < count:
        return []
    assert mine[:count] == theirs[:count], f"ranks disagree: {mine} vs {theirs}"
    return mine[:count]
