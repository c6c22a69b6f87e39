"""Why each file in checkpoints/quarantine/ is there, in words, from the journal's
`quarantine` records: a pivot's set-aside checkpoints read calmly, a failed verification
or a divergence's rollback as the alarm it is.

The journal is the only record of a reason (the files are moved as they are), so the
daemon reads it once at start-up and then notes each quarantine it performs; the command
line reads it when no daemon runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainwarden.supervisor.contract import MAX_STEP

Note = dict[str, Any]
"""A quarantine record's step, name, reason, cause and cause_step."""

_PIVOT_TEXT = re.compile(r"written under the old policy after pivot step (\d+)")
_DIVERGENCE_TEXT = re.compile(r"written at or after divergence at step (\d+)")


def note_of(record: Mapping[str, Any]) -> Note:
    """A quarantine record's note; records from before `cause` was journaled get theirs
    from the reason's words."""
    reason = str(record.get("reason") or "")
    cause = record.get("cause")
    cause_step = record.get("cause_step")
    if cause is None:
        for pattern, named in ((_PIVOT_TEXT, "pivot"), (_DIVERGENCE_TEXT, "divergence")):
            found = pattern.fullmatch(reason)
            if found:
                cause, cause_step = named, int(found.group(1))
                break
    return {
        "step": _step(record.get("step")),
        "name": str(record.get("name") or ""),
        "reason": reason,
        "cause": str(cause or "failed"),
        "cause_step": _step(cause_step),
    }


def _step(value: Any) -> int | None:
    """A step the view can carry: a file named past MAX_STEP (quarantined for it) has
    none, and would not even serialise beyond 64 bits."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP:
        return value
    return None


def remember(notes: dict[str, Note], record: dict[str, Any]) -> None:
    """Add a journal record's quarantine note to `notes` (by checkpoint name, the newest
    wins); any other record is ignored. Read with the journal's one pass at start-up."""
    if record.get("kind") == "quarantine" and record.get("name"):
        note = note_of(record)
        notes[note["name"]] = note


def _note_for(file_name: str, notes: dict[str, Note]) -> Note | None:
    """The note of the checkpoint `file_name` was moved with: itself, a companion
    (step_000100.json beside step_000100.bin), or a second copy stamped with its time."""
    if file_name in notes:
        return notes[file_name]
    for name, note in reversed(notes.items()):
        stem = name.rsplit(".", 1)[0] if "." in name else name
        if file_name.startswith((f"{name}.", f"{stem}.")):
            return note
    return None


def describe(note: Note | None) -> tuple[str, bool]:
    """The reason in words, and whether it is an alarm (False: a pivot's normal archive)."""
    if note is None:
        return "no reason in the journal", True
    cause, at, reason = note["cause"], note.get("cause_step"), note["reason"]
    where = f" at step {at:,}" if isinstance(at, int) else ""
    if cause == "pivot":
        return f"set aside by the pivot{where}", False
    if cause == "divergence":
        return f"rolled back: written at or after the divergence{where}", True
    if cause == "rollback":
        # Sound when written, but after the rollback's checkpoint: never resumed again.
        return f"set aside by the rollback before the loss spike{where}", False
    if cause == "verification":
        return f"failed verification: {reason}", True
    return reason or "quarantined", True


def entries(file_names: list[str], notes: dict[str, Note]) -> list[dict[str, Any]]:
    """The quarantined files as the checkpoints view lists them, each with its reason."""
    out = []
    for file_name in file_names:
        note = _note_for(file_name, notes)
        why, alarming = describe(note)
        out.append(
            {
                "name": file_name,
                "step": note["step"] if note else None,
                "cause": note["cause"] if note else None,
                "cause_step": note.get("cause_step") if note else None,
                "reason": note["reason"] if note else None,
                "why": why,
                "alarming": alarming,
            }
        )
    return out
