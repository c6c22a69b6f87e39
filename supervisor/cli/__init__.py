"""The command line: the parser, one function per command, and the text they print.

- `main`: `main()`, the `trainwarden` entry point: one-line errors and exit statuses
- `parser`: every command's arguments and help, bound to the function that runs it
- `commands`: one function per command, each returning the exit status
- `reach`: the run directory, config and daemon socket a command names
- `events`: `trainwarden events`: the journal's newest records, from the daemon or the file
- `output`: what the commands print: status, checkpoints, replies, events
- `offline`: `trainwarden checkpoints` with no daemon, from the folder and the journal
- `init`: `trainwarden init`: a working config for the reference trainer
- `start_checks`: a config checked for a daemon's start where the config module may not
  look: the control socket's place and group, the mirror's owner
- `demo`: `trainwarden demo`: a supervised run of the reference trainer, in the TUI
- `detach`: `trainwarden daemon --detach`: start the daemon and wait until it answers
- `units`: systemd units: the packaged templates and concrete units for one run
- `slurm_script`: `trainwarden slurm-script`: an sbatch script that runs the daemon as a
  Slurm job, requeued before each time limit
- `alerting`: `trainwarden alert-test`: a test alert to every configured target
- `branch`: `trainwarden branch`: a new run from one verified checkpoint of another
- `branch_checkpoint`: the checkpoint a branch trains on: chosen, verified, copied
- `compare`: `trainwarden compare`: two related runs' losses set side by side
- `inspection`: `trainwarden inspect`: what one checkpoint holds, read without a daemon
- `inspect_formats`: what each format's files say, read without torch
- `export`: `trainwarden export`: a checkpoint's inference weights, by the trainer side
"""

from trainwarden.supervisor.cli.main import main

__all__ = ["main"]
