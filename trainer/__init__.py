"""The reference trainer: a small GPT trained on Python's own standard library.

`python -m trainwarden.trainer` speaks the trainer contract (step lines, atomic andrea-bin
checkpoints, SIGTERM/SIGUSR1, TRAINWARDEN_RESUME) so trainwarden can supervise it on a
CPU out of the box and on a GPU at GPT-2 small scale. This package's top level stays
free of torch: the command line checks its arguments, and the plan refuses a resume,
before torch is imported, so a refusal costs a fraction of a second. The daemon and the
TUI never import it (`trainwarden export` runs `trainer.export` in a child process).

- `__main__`: `python -m trainwarden.trainer`
- `cli`: the command line: parse, start a session, run the loop; the exit statuses
- `options`: what the command line asked for, parsed and range-checked (no torch)
- `presets`: model and batch shapes by name (no torch)
- `errors`: errors that end the trainer with exit status 2 and a one-line message
- `plan`: everything decided before torch is imported: data, policy, whether to resume
- `resume`: whether a checkpoint can be resumed from exactly (no torch)
- `skips`: data skipped after loss spikes and the LR scale, checked against the checkpoint
- `startup`: a plan made into a live session: torch settings, model, optimizer, state
- `loop`: the step loop: train, log, save on schedule or on request, stop cleanly
- `corpus`: the data arms, read from the installed standard library
- `batches`: the batch for a step, a pure function of (seed, data step, arm)
- `bandit`: EXP3 over the data arms, under the operator's caps and floors
- `model`: a GPT-2-shaped decoder
- `adamw`: AdamW with plain integer step counts per parameter
- `schedule`: the learning rate by step: linear warmup, then cosine decay
- `evaluate`: validation loss on every arm's held-out split, same batches every time
- `samples`: short greedy samples per arm, kept in `.samples.json`
- `checkpoint`: writing and reading andrea-bin checkpoints, with their sidecar
- `saving`: checkpoints that do not stall training: snapshot, then write behind
- `atomic`: durable file replacement
- `signals`: SIGTERM/SIGINT and SIGUSR1 as flags
- `faults`: fault injection: a crash, NaN or hang once, or a region of bad data
- `export`: `python -m trainwarden.trainer.export`: inference weights as safetensors
"""
