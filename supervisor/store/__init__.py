"""What the daemon persists: the run directory and atomic writes (`rundir`), the journal,
the loss history and resume audit (`lossdb`) over its binary cache (`losscache`), the
checkpoint registry (`checkpoints`), the verified mirror (`mirror`) and restoring a run
from it (`restore`).

May import the core's types, the plugins, config and errors; never the shell.
"""
