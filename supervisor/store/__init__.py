"""What the daemon persists: the run directory and atomic writes (`rundir`), the journal,
the loss history file and its writer (`lossdb`), the history read back (`losshistory`,
its rows in `lossrows`, its queries in `lossquery`) over its binary cache (`losscache`),
the resume audit (`resume_audit`), the checkpoint registry (`checkpoints`), the verified
mirror (`mirror`) and restoring a run from it (`restore`).

May import the core's types, the plugins, config and errors; never the shell.
"""
