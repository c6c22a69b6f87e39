"""`trainwarden checkpoints` with no daemon: the checkpoint folder and the journal, read only.

Nothing is verified again here (that is the daemon's work, off its loop); a checkpoint
counts as verified when the journal recorded it so and recorded nothing that removed it
since (store.verdicts). The view has the daemon's shape plus `"offline": true` (the
command line's own key: the daemon never sends it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainwarden.supervisor.config import load_config
from trainwarden.supervisor.store import quarantine
from trainwarden.supervisor.store.checkpoints import CheckpointStore
from trainwarden.supervisor.store.rundir import RunFiles
from trainwarden.supervisor.store.verdicts import read_verdicts

OFFLINE_NOTE = "daemon not running: read from the directory; verification as last journaled"


def checkpoints_from_directory(run_dir: Path) -> dict[str, Any]:
    from trainwarden.supervisor import registry

    cfg = load_config(run_dir, check_plugins=False)
    fmt = registry.checkpoint_format(cfg.checkpoints.format, dict(cfg.checkpoints.options))
    store = CheckpointStore(cfg.checkpoint_dir, fmt)
    journal = read_verdicts(RunFiles(cfg.run_dir).journal)
    pinned = set(cfg.checkpoints.pinned) | journal.pinned
    committed, _ = store.scan()
    checkpoints: list[dict[str, Any]] = []
    for name in committed:
        files = store.files_of(name)
        try:
            mtime = files[0].stat().st_mtime
            size = sum(os.lstat(f).st_size for f in files if os.path.lexists(f))
        except OSError:  # gone while we looked
            continue
        step = fmt.step_of(files[0])
        if step is None:
            continue
        journaled = journal.verified(name)
        checkpoints.append(
            {
                "step": step,
                "name": name,
                "path": str(files[0]),
                "bytes": journaled.bytes if journaled and journaled.bytes is not None else size,
                "mtime": mtime,
                "verified": journaled is not None,
                "pinned": step in pinned,
                "next_to_delete": False,
            }
        )
    checkpoints.sort(key=lambda c: c["step"])
    return {
        "checkpoints": checkpoints,
        "quarantined": quarantine.entries(store.quarantined(), journal.notes),
        "offline": True,
    }
