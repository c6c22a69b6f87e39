"""The checkpoint a branch trains on (`trainwarden branch`): chosen from SRC (the named step
or the newest verified one, never a quarantined one), verified (as the daemon journaled it,
or by the format now, and with the digest its commit had), and copied into the branch,
reflinked where the file system can, the copy read back against that digest."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from trainwarden.supervisor.config import Config
from trainwarden.supervisor.core.events import Outcome
from trainwarden.supervisor.errors import TrainwardenError, UsageError
from trainwarden.supervisor.store import quarantine
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.digest import digest_checkpoint
from trainwarden.supervisor.store.fixed_folder import copy_folder, layout
from trainwarden.supervisor.store.rundir import RunFiles, fsync_dir
from trainwarden.supervisor.store.snapshots import copy_durably
from trainwarden.supervisor.store.verdicts import JournalVerdicts, read_verdicts


@dataclass(frozen=True)
class Chosen:
    """The checkpoint of SRC a branch starts from."""

    step: int
    name: str
    files: list[Path]
    digest: str
    """Its digest at its commit (journaled), or taken now when it was verified now."""


def choose_checkpoint(cfg: Config, store: CheckpointStore, step: int | None) -> Chosen:
    """The named step's checkpoint, or the newest verified one; refuses an unknown step,
    a quarantined checkpoint and one that is not verified (journaled, or verified now)."""
    journal = read_verdicts(RunFiles(cfg.run_dir).journal)
    committed, _ = store.scan()
    by_step = {
        s: name for name in committed if (s := store.fmt.step_of(store.dir / name)) is not None
    }
    if step is None:
        for candidate in sorted(by_step, reverse=True):
            if journal.refused(by_step[candidate]) is not None:
                continue
            chosen = _verified(store, candidate, by_step[candidate], journal)
            if isinstance(chosen, Chosen):
                return chosen
        raise TrainwardenError(
            f"{cfg.run_dir} has no verified checkpoint to branch from yet; save one first"
            f" (`trainwarden save --wait {cfg.run_dir}`)"
        )
    entries = quarantine.entries(store.quarantined(), journal.notes)
    set_aside = [e for e in entries if e["step"] == step]
    name = by_step.get(step)
    refused = journal.refused(name) if name is not None else None
    if name is None or refused is not None:
        if set_aside or name is not None:
            why = set_aside[0]["why"] if set_aside else quarantine.describe(refused)[0]
            raise TrainwardenError(
                f"the checkpoint of step {step} is quarantined ({why}); branch from another step"
            )
        known = ", ".join(str(s) for s in sorted(by_step)) or "none"
        raise UsageError(f"{cfg.run_dir} has no checkpoint of step {step}; its steps: {known}")
    chosen = _verified(store, step, name, journal)
    if not isinstance(chosen, Chosen):
        raise TrainwardenError(
            f"the checkpoint of step {step} is not verified ({chosen}); branch from another step"
        )
    return chosen


def _verified(
    store: CheckpointStore, step: int, name: str, journal: JournalVerdicts
) -> Chosen | str:
    """The checkpoint, when the daemon journaled it verified or the format verifies it now;
    else why it does not verify."""
    journaled = journal.verified(name)
    if journaled is None:
        verdict = store.verify(name)
        if verdict.outcome != Outcome.VERIFIED:
            return verdict.reason
    recorded = journaled.digest if journaled is not None else None
    files = store.files_of(name)
    try:
        now = digest_checkpoint(files).hex
    except OSError as exc:
        raise TrainwardenError(
            f"cannot read the checkpoint of step {step}: {exc.strerror or exc}"
        ) from None
    if recorded and now != recorded:
        raise TrainwardenError(
            f"the checkpoint of step {step} has changed since it was committed (its digest"
            " differs from the journaled one); branch from another step"
        )
    return Chosen(step, name, files, recorded or now)


def copy_checkpoint(store: CheckpointStore, chosen: Chosen, target_dir: Path) -> str:
    """Copy the checkpoint's files into `target_dir`; "reflink" or "copy". The copy must
    read as the commit did: a file the parent's retention deleted or that changed while it
    was copied refuses the branch."""
    target_dir.mkdir(parents=True, exist_ok=True)
    hows = set()
    copied = []
    try:
        for source in chosen.files:
            target = target_dir / source.name
            if stat.S_ISDIR(os.lstat(source).st_mode):
                hows.add(copy_folder(source, target, layout(source), ""))
            else:
                hows.add(copy_durably(source, target))
            copied.append(target)
    except FileNotFoundError:
        raise TrainwardenError(
            f"the checkpoint of step {chosen.step} was deleted while it was copied (the"
            f" parent's retention?); pin it first (`trainwarden pin {chosen.step}`)"
        ) from None
    fsync_dir(target_dir)
    if digest_checkpoint(copied).hex != chosen.digest:
        raise TrainwardenError(
            f"the copy of step {chosen.step}'s checkpoint reads differently from its commit;"
            " nothing was created"
        )
    return "copy" if "copy" in hows else "reflink"
