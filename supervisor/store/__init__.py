"""What the daemon persists, and reads back.

- `rundir`: the daemon's files in a run directory, atomic writes, the one-daemon lock
- `appendfile`: append-only line files that outlive a full disk
- `journal`: the run's journal, `.trainwarden/journal.jsonl`
- `repeats`: a fast crash loop's cycles counted instead of journaled one by one
- `lossdb`: the loss history file, `.loss.json`, and its writer
- `losshistory`: the loss history read back, newest segment per step
- `lossrows`: the rows a loss history is made of, and resolving them
- `lossquery`: queries over a loss history: decimated buckets, from any thread
- `losscache`: the binary cache of `.loss.json`, so a start-up parses only what it lacks
- `evaldb`: the validation history, `.eval.json`: its writer and its reader
- `runseries`: a run's losses over its lineage, read with no daemon
- `branches`: `branch.json`: what a branch run was made from
- `branch_history`: the loss history a branch inherits from its ancestors, read only
- `resume_audit`: a resumed trainer's replayed losses against the ones they supersede
- `checkpoints`: the checkpoint directory: scanning, verification, quarantine, deletion
- `quarantine`: why each quarantined file is there, from the journal
- `verdicts`: the checkpoints as the journal last judged them (verified, deleted,
  quarantined) and the pinned steps, read back with no daemon
- `digest`: content digests (xxh3-128) of committed checkpoints
- `snapshots`: snapshots of a checkpoint file the trainer overwrites in place
- `fixed_folder`: snapshots of a checkpoint folder the trainer overwrites in place
- `mirror`: a second, verified copy of every committed checkpoint on another disk
- `mirror_files`: the mirror's layout and latest.json, and the hashed copy of one file
- `restore`: `trainwarden restore`: a run directory rebuilt from its mirror
- `identity`: whose run a run directory is, and whose run a mirror serves
- `lease`: which daemon (job, node) supervises a run, for daemons on other machines
- `hangs`: stack dumps of a hung trainer, written atomically, the newest kept

May import the core's types, the plugins, config, contract, registry and errors; never
the shell.
"""
