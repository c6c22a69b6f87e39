"""The checkpoints as the journal last judged them, read back with no daemon: verified at
their commit, deleted, or quarantined and why. `trainwarden checkpoints` (offline),
`branch` and `inspect` all read them from here; the daemon does the judging (shell.verdicts).

One pass over the journal. Of a checkpoint name's `checkpoint` (verified and digested at
its commit), `delete` and `quarantine` records the newest decides; a later commit of the
name is a new file and wins over what came before. The newest state snapshot (a `state`
record, or the newest one a `repeated` record folded) gives the pinned steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trainwarden.supervisor.store import quarantine
from trainwarden.supervisor.store.journal import read_records
from trainwarden.supervisor.store.repeats import state_of

Status = Literal["verified", "deleted", "quarantined"]
"""The newest of a name's `checkpoint`, `delete` and `quarantine` records."""
JUDGING: dict[str, Status] = {
    "checkpoint": "verified",
    "delete": "deleted",
    "quarantine": "quarantined",
}
"""The records that judge a checkpoint, and the status each leaves it in."""


@dataclass(frozen=True)
class Verdict:
    """What the journal last said of one checkpoint name."""

    name: str
    status: Status
    step: int | None
    """The step its newest record names."""
    digest: str | None
    """Its content digest (xxh3-128, hex) at its newest commit, kept after a deletion or a
    quarantine; None: never committed, or committed with none journaled."""
    bytes: int | None
    """Its size at its newest commit (bytes)."""
    reason: str | None
    """Why it was deleted or quarantined; None when verified."""
    set_aside: quarantine.Note | None
    """Its quarantine since its newest commit. A deletion after does not clear it (a file
    of the name still in the folder is the one set aside); only a new commit does."""

    @property
    def verified(self) -> bool:
        return self.status == "verified"


@dataclass(frozen=True)
class JournalVerdicts:
    """The journal's verdicts on a run's checkpoints, and what else offline readers need."""

    checkpoints: dict[str, Verdict]
    """By checkpoint name."""
    pinned: frozenset[int]
    """The steps the newest state snapshot pins ([checkpoints] pinned of the config aside)."""
    notes: dict[str, quarantine.Note]
    """Every quarantine's note, the newest per name: why each file in quarantine/ is there."""
    first_set_aside: dict[str, str | None]
    """Per quarantined name, its commit digest when it was first quarantined: the copy
    quarantine/ holds under that very name (later copies get a time stamp, see
    store.checkpoints), unless quarantine/ was emptied since."""

    def verified(self, name: str) -> Verdict | None:
        """The verdict of `name` if the journal last called it verified."""
        verdict = self.checkpoints.get(name)
        return verdict if verdict is not None and verdict.verified else None

    def refused(self, name: str) -> quarantine.Note | None:
        """Why `name` must not be used: quarantined since its newest commit."""
        verdict = self.checkpoints.get(name)
        return verdict.set_aside if verdict is not None else None

    def committed_digest(self, name: str, *, in_quarantine: bool) -> str | None:
        """The digest the file `name` (in the checkpoint folder, or in quarantine/) had at
        its commit: a set-aside copy is held to its own commit, not a later one of its name."""
        if in_quarantine and name in self.first_set_aside:
            return self.first_set_aside[name]
        verdict = self.checkpoints.get(name)
        return verdict.digest if verdict is not None else None


def read_verdicts(journal_path: Path) -> JournalVerdicts:
    """The journal at `journal_path` replayed (a missing journal: no verdicts)."""
    checkpoints: dict[str, Verdict] = {}
    pinned: frozenset[int] = frozenset()
    notes: dict[str, quarantine.Note] = {}
    first_set_aside: dict[str, str | None] = {}
    for record in read_records(journal_path):
        kind, name = record.get("kind"), record.get("name")
        if kind in JUDGING and isinstance(name, str) and name:
            before = checkpoints.get(name)
            checkpoints[name] = _judged(before, name, record)
            if kind == "quarantine":
                quarantine.remember(notes, record)
                # Only a verified name's file is the one its commit digested.
                committed = before.digest if before is not None and before.verified else None
                first_set_aside.setdefault(name, committed)
        elif (state := state_of(record)) is not None:
            pinned = frozenset(s for s in state.get("pinned") or [] if isinstance(s, int))
    return JournalVerdicts(checkpoints, pinned, notes, first_set_aside)


def _judged(before: Verdict | None, name: str, record: dict[str, Any]) -> Verdict:
    """`name`'s verdict after `record`, one of its `checkpoint`, `delete` or `quarantine`."""
    kind = record["kind"]
    step = _int(record.get("step"))
    if kind == "checkpoint":
        digest = record.get("digest")
        return Verdict(
            name,
            "verified",
            step,
            digest if isinstance(digest, str) and digest else None,
            _int(record.get("bytes")),
            reason=None,
            set_aside=None,
        )
    set_aside = before.set_aside if before is not None else None
    return Verdict(
        name,
        JUDGING[kind],
        step,
        before.digest if before is not None else None,
        before.bytes if before is not None else None,
        reason=str(record.get("reason") or ""),
        set_aside=quarantine.note_of(record) if kind == "quarantine" else set_aside,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
